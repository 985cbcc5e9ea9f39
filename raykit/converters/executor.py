"""Executors for conversion tasks: in-process, a local Dask cluster, or an existing Dask scheduler.

The store writer maps picklable tasks over an executor and its output does not depend on which one
runs them, so these choices change speed only, never bytes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from collections.abc import Iterator

from raykit.errors import ConfigError

__all__ = ["conversion_executor"]


@contextlib.contextmanager
def conversion_executor(
    workers: int = 1, scheduler: str | None = None, threads: int = 1
) -> Iterator[concurrent.futures.Executor | None]:
    """Yield the executor for ``workers``/``scheduler``/``threads`` and shut it down afterwards.

    * ``scheduler`` (e.g. ``"tcp://10.0.0.1:8786"``): a Dask ``Client`` connected to it;
    * ``workers > 1``: a Dask ``LocalCluster`` of ``workers`` worker processes of ``threads`` threads;
    * ``workers == 1`` and ``threads > 1``: a thread pool in this process (decoding, hashing,
      compression and I/O release the GIL);
    * otherwise None: the writer runs every task in this process, one after the other.

    Workers read the capture and write the partial store by path, so with ``scheduler`` every worker
    must see ``src`` and ``dst`` at the same paths (shared storage), and have raykit installed.

    Raises:
        ConfigError: both given, ``workers < 1``, or the scheduler cannot be reached.
    """
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers: expected a positive integer, got {workers!r}")
    if not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads: expected a positive integer, got {threads!r}")
    if scheduler is not None and (workers > 1 or threads > 1):
        raise ConfigError(
            "give either workers/threads (this machine) or scheduler (an existing cluster), not both"
        )
    if scheduler is None and workers == 1:
        if threads == 1:
            yield None
        else:
            with concurrent.futures.ThreadPoolExecutor(threads, "raykit-convert") as pool:
                yield pool
        return
    from dask.distributed import Client, LocalCluster

    with contextlib.ExitStack() as stack:
        if scheduler is not None:
            try:
                client = stack.enter_context(Client(scheduler, timeout="20s"))
            except (OSError, TimeoutError) as exc:
                raise ConfigError(f"cannot connect to the Dask scheduler at {scheduler}: {exc}") from None
        else:
            cluster = stack.enter_context(
                LocalCluster(
                    n_workers=workers,
                    threads_per_worker=threads,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.CRITICAL,  # task errors reach the caller as exceptions
                )
            )
            client = stack.enter_context(Client(cluster))
        yield client.get_executor()
