"""Where a sweep's runs execute: concurrent runs on this machine, or a Dask cluster.

Both call :func:`raykit.sweep.runs.execute_run`, which never raises for a failed run (its row says
so), and hand each row to ``on_row`` as the run finishes, in the coordinating process.

- :func:`run_local`: ``jobs`` runs at a time on a thread pool (each run's training is a child process),
  the machine's cores split between them (``threads`` torch threads each).
- :func:`run_dask`: one task per run on a ``distributed`` scheduler (``tcp://host:8786``). When the
  workers declare a ``GPU`` resource (``dask worker --resources GPU=1``, one worker per GPU with its
  ``CUDA_VISIBLE_DEVICES``), each run holds one. The workers must see ``OUT`` and the stores at the
  same paths (a shared file system).
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from raykit.errors import ConfigError
from raykit.pipeline import kill_children
from raykit.sweep.runs import RunTask, execute_run

__all__ = ["check_scheduler", "local_threads", "run_dask", "run_local"]

OnRow = Callable[[RunTask, dict[str, Any]], None]


def local_threads(jobs: int, cpus: int | None = None) -> int:
    """Torch threads of each of ``jobs`` concurrent runs: the cores split evenly, at least one."""
    return max(1, (cpus or os.cpu_count() or 1) // max(jobs, 1))


PROBE_SECONDS = 5.0  # how long --scheduler is given to accept a connection, before any conversion


def check_scheduler(address: str, timeout: float = PROBE_SECONDS) -> None:
    """Refuse a ``--scheduler`` that does not accept a TCP connection within ``timeout`` seconds
    (asked before any capture is converted; other transports than tcp/tls are left to Dask).
    """
    parsed = urllib.parse.urlsplit(address)
    if parsed.scheme not in ("tcp", "tls"):
        return
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError as exc:
        raise ConfigError(f"--scheduler {address}: {exc}") from None
    if not host or port is None:
        raise ConfigError(f"--scheduler {address}: expected host and port, like tcp://host:8786")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise ConfigError(f"--scheduler {address}: cannot connect ({reason})") from None


def run_local(tasks: Sequence[RunTask], jobs: int, on_row: OnRow) -> None:
    """Execute ``tasks``, ``jobs`` at a time."""
    threads = local_threads(jobs)
    pool = ThreadPoolExecutor(max_workers=max(jobs, 1), thread_name_prefix="raykit-sweep")
    try:
        futures = {pool.submit(execute_run, task, threads, "local"): task for task in tasks}
        for future in as_completed(futures):
            on_row(futures[future], future.result())
    except BaseException:  # Ctrl-C or a failure here: no new run starts, the running ones stop
        pool.shutdown(wait=False, cancel_futures=True)
        kill_children()
        raise
    finally:
        pool.shutdown(wait=True)


def _on_worker(task: RunTask, gpu: bool) -> dict[str, Any]:  # pragma: no cover - runs in a Dask worker
    """One run in a Dask worker: the worker's cores split between its concurrent tasks; ``gpu``: the
    task holds one of the worker's ``GPU`` resources (recorded in the row's ``executor``)."""
    from distributed import get_worker

    worker = get_worker()
    executor = f"dask:{worker.address}" + (" GPU=1" if gpu else "")
    return execute_run(task, local_threads(worker.state.nthreads), executor)


def run_dask(tasks: Sequence[RunTask], scheduler: str, on_row: OnRow, retries: int = 0) -> None:
    """Execute ``tasks`` on the Dask cluster at ``scheduler``; a task whose worker died (after the
    scheduler's own reassignments and ``retries``) becomes a failed row."""
    from distributed import Client
    from distributed import as_completed as dask_completed

    try:
        client = Client(scheduler, timeout="20s")
    except (OSError, TimeoutError) as exc:
        raise ConfigError(f"--scheduler {scheduler}: cannot connect ({exc})") from exc
    try:
        workers = client.scheduler_info().get("workers", {}).values()
        gpus = any(w.get("resources", {}).get("GPU") for w in workers)
        resources = {"GPU": 1} if gpus else None
        futures = {
            client.submit(
                _on_worker,
                task,
                gpus,
                key=f"raykit-run-{task.run_id[:16]}",
                pure=False,
                resources=resources,
                retries=retries,
            ): task
            for task in tasks
        }
        for future in dask_completed(list(futures)):
            task = futures[future]
            try:
                row = future.result()
            except Exception as exc:  # the worker died (KilledWorker) or the task could not run there
                row = {
                    "run_id": task.run_id,
                    "status": "failed",
                    "error": f"machine: {type(exc).__name__}: {exc}",
                }
            on_row(task, row)
    finally:
        client.close()
