"""A write's tasks, whatever the layout: run on any executor (``task_runner``), their records for a
rerun (``record_matches``, ``finish_task``), the one shard task (``ShardJob``, ``write_shard_task``)
and where their time goes (``PhaseClock``).

Timing (``raykit convert --profile``, ``benchmarks/bench_convert.py``): each task times its phases with
a ``PhaseClock`` and returns the seconds with its result; the writer sums them per kind of task and
laps its own wall clock per step. A finished write adds its profile to the active ``raykit.recorder``
(a context variable: concurrent writes do not mix) and logs it at DEBUG level.
"""

from __future__ import annotations

import concurrent.futures
import errno
import fcntl
import json
import logging
import os
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

import raykit.recorder
from raykit.fileio import atomic_path, atomic_write_bytes, atomic_write_json
from raykit.progress import progress as progress_bar
from raykit.store.files import bytes_record, file_record

__all__ = [
    "PhaseClock",
    "ShardJob",
    "TaskRunner",
    "finish_task",
    "format_phases",
    "in_process",
    "record_matches",
    "scratch_record",
    "stream_tasks",
    "task_runner",
    "write_shard_task",
]

J = TypeVar("J")
R = TypeVar("R")
_log = logging.getLogger("raykit.store.write")


# -- where the time goes -------------------------------------------------------------------------
class PhaseClock:
    """Seconds spent per phase, by laps: ``lap(name)`` charges the time since the last lap. A task
    times its phases with one; a writer laps its own wall clock with one and sums its tasks' seconds
    per kind of task and phase into ``tasks`` (``absorb``), whichever worker ran them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.tasks: dict[str, dict[str, float]] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now

    def absorb(self, kind: str, results: list[dict[str, Any]]) -> None:
        totals = self.tasks.setdefault(kind, {})
        for res in results:
            for phase, seconds in res.pop("seconds", {}).items():
                totals[phase] = totals.get(phase, 0.0) + seconds

    def finish(self, dst: Path) -> None:
        """Add the times to the active ``raykit.recorder`` of this thread or task (scopes ``write``: the
        writer's wall time per step; ``write.stage``, ``write.shard``: its tasks' time per phase, summed
        over tasks, whichever worker ran them) and log them at DEBUG level on ``raykit.store.write``."""
        scopes = {"write": self.seconds, **{f"write.{kind}": phases for kind, phases in self.tasks.items()}}
        recorder = raykit.recorder.active()
        if recorder is not None:
            for scope, phases in scopes.items():
                for phase, seconds in phases.items():
                    recorder.add(scope, phase, seconds)
        _log.debug("wrote %s: %s", dst, json.dumps(scopes))


def format_phases(phases: Mapping[str, Mapping[str, float]], seconds: float | None = None) -> list[str]:
    """Human lines for a recorder's writer phases (``PhaseClock.finish``): wall time per step, then
    task time per phase."""
    lines = ["wall s   " + "  ".join(f"{k} {v:.2f}" for k, v in phases.get("write", {}).items())]
    for kind, label in (("write.stage", "decode tasks"), ("write.shard", "shard tasks")):
        if phases.get(kind):
            total = sum(phases[kind].values())
            parts = "  ".join(f"{k} {v:.2f}" for k, v in sorted(phases[kind].items(), key=lambda kv: -kv[1]))
            lines.append(f"{label} (summed over workers, {total:.2f} s): {parts}")
    if seconds is not None:
        outside = seconds - sum(phases.get("write", {}).values())
        lines.append(
            f"total {seconds:.2f} s, of which outside the writer (parsing, probing, start-up) {outside:.2f} s"
        )
    return lines


# -- tasks ---------------------------------------------------------------------------------------
# ``run(fn, jobs, desc)``: the results of ``fn`` over ``jobs`` in order, as they finish
TaskRunner = Callable[[Callable[[Any], Any], Sequence[Any], str], Iterator[Any]]


def task_runner(executor: concurrent.futures.Executor | None, progress: bool) -> TaskRunner:
    """Runs a write's tasks on ``executor`` (None: in this process), with a progress bar if asked."""

    def run(fn: Callable[[J], R], jobs: Sequence[J], desc: str) -> Iterator[R]:
        results: Iterable[R] = map(fn, jobs) if executor is None else executor.map(fn, jobs)
        yield from progress_bar(results, total=len(jobs), desc=desc, disable=not progress, unit="task")

    return run


def stream_tasks(
    executor: concurrent.futures.Executor | None,
    stage: Callable[[J], R],
    jobs: Sequence[J],
    shard_jobs: Sequence[ShardJob],
    needs: Sequence[int],
    staged: list[R],
    window: int = 8,
) -> Iterator[dict[str, Any]]:
    """Both phases of a write as one pipeline: ``stage`` over ``jobs`` on ``executor`` (None: in
    this thread; results appended to ``staged`` in order) and ``write_shard_task`` over
    ``shard_jobs`` on a writer thread of its own, shard job ``k`` submitted as soon as jobs ``[0,
    needs[k])`` have finished (``needs`` non-decreasing, at most ``len(jobs)``), so that shards are
    written while later images are decoded; yields the shard results in order. At most ``window``
    jobs run or wait ahead of the oldest unfinished one and at most two shard jobs, so what is staged
    and not yet written stays bounded. On an error nothing submitted is left running: pending tasks
    are cancelled, running ones waited for.
    """

    def submit(job: J) -> concurrent.futures.Future[R]:
        if executor is not None:
            return executor.submit(stage, job)
        future: concurrent.futures.Future[R] = concurrent.futures.Future()
        future.set_result(stage(job))  # an error is raised here, in order
        return future

    pending: deque[concurrent.futures.Future[R]] = deque()
    shards: deque[concurrent.futures.Future[dict[str, Any]]] = deque()
    submitted = ready = 0
    with concurrent.futures.ThreadPoolExecutor(1, "raykit-shard-writer") as writer:
        try:
            while len(staged) < len(jobs) or ready < len(shard_jobs) or shards:
                while submitted < len(jobs) and submitted - len(staged) < window:
                    pending.append(submit(jobs[submitted]))
                    submitted += 1
                if pending:
                    staged.append(pending.popleft().result())
                while ready < len(shard_jobs) and needs[ready] <= len(staged):
                    shards.append(writer.submit(write_shard_task, shard_jobs[ready]))
                    ready += 1
                while shards and (shards[0].done() or len(shards) > 2 or not pending):
                    yield shards.popleft().result()
        except BaseException:
            futures: list[concurrent.futures.Future[Any]] = [*pending, *shards]
            for future in futures:
                future.cancel()
            concurrent.futures.wait(futures)
            raise


def in_process(executor: concurrent.futures.Executor | None) -> bool:
    """True when the executor runs tasks in this process (None: serially; or a thread pool)."""
    return executor is None or isinstance(executor, concurrent.futures.ThreadPoolExecutor)


def scratch_record(data: bytes | memoryview) -> dict[str, Any]:
    """``{"size", "crc32"}`` of a scratch file's bytes (staging): enough to catch a damaged file on resume."""
    return {"size": len(data), "crc32": zlib.crc32(data)}


def record_matches(record_path: Path, key: str, root: Path, clock: PhaseClock) -> dict[str, Any] | None:
    """The stored result of a finished task (with ``seconds``: ``clock``'s, lapped as the resume
    check) if its key matches and its files are intact, else None."""
    if not record_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("key") != key:
        return None
    for rel, expected in record["result"].get("files", {}).items():
        path = root / rel
        if not path.exists() or _file_check(path, expected) != expected:
            return None
    clock.lap("resume_check")
    return {**record["result"], "seconds": clock.seconds}


def _file_check(path: Path, expected: dict[str, Any]) -> dict[str, Any]:
    """The record of the file at ``path`` in the kind of ``expected`` (SHA-256, or CRC-32 for scratch)."""
    if "crc32" not in expected:
        return file_record(path)
    crc = 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            crc = zlib.crc32(block, crc)
    return {"size": path.stat().st_size, "crc32": crc}


def finish_task(
    record_path: Path | None, key: str, result: dict[str, Any], clock: PhaseClock
) -> dict[str, Any]:
    """``result`` with ``seconds`` (``clock``'s, not recorded), after recording it for a rerun at
    ``record_path`` (None: nothing to resume from) as canonical JSON, atomically without fsync (a lost
    record only redoes its task)."""
    if record_path is not None:
        atomic_write_json(record_path, {"key": key, "result": result}, sync=False)
        clock.lap("write")
    return {**result, "seconds": clock.seconds}


# ``encode(clock)``: a shard's files (relative path -> bytes, whole or in pieces written one after the
# other) and its ``index.json`` entries (key -> values, in order)
ShardEncode = Callable[[PhaseClock], tuple[dict[str, Any], dict[str, list[Any]]]]


@dataclass(frozen=True)
class ShardJob:
    """Phase-2 task of either layout: shard ``shard`` of split ``split`` of ``root``'s plan, task key
    ``key``, encoded by ``encode`` (a picklable partial of the layout's encoder)."""

    root: str
    split: str
    shard: int
    key: str
    encode: ShardEncode


def write_shard_task(job: ShardJob) -> dict[str, Any]:
    """Phase-2 task. Returns ``{"files": {rel: record}, "index": {key: [values]}}`` and ``"seconds"``,
    the time per phase (not recorded)."""
    root = Path(job.root)
    record_path = root / f"tasks/{job.split}-{job.shard:06d}.json"
    clock = PhaseClock()
    if (done := record_matches(record_path, job.key, root, clock)) is not None:
        return done
    files, index = job.encode(clock)
    result: dict[str, Any] = {"files": {}, "index": index}
    for rel, payload in files.items():
        if isinstance(payload, memoryview) and len(payload) >= _UNCACHED_BYTES:
            write_uncached(root / rel, payload)
        else:
            atomic_write_bytes(
                root / rel, payload, sync=False
            )  # fsynced in the background before the manifest
        clock.lap("write")
        result["files"][rel] = bytes_record(payload)  # hashed from memory, never re-read
        clock.lap("checksum")
    return finish_task(record_path, job.key, result, clock)


_UNCACHED_BYTES = 1 << 22  # shards at least this large bypass the page cache (``write_uncached``)
ALIGN = 4096
"""The alignment of a direct write's buffer, offset and size (a multiple of every logical block size)."""


def write_uncached(path: Path, data: memoryview) -> None:
    """Write ``data`` to ``path`` atomically (``atomic_path``, not fsynced: the writer fsyncs its shards
    in the background), its largest prefix of whole ``ALIGN`` blocks with ``O_DIRECT`` when ``data``
    starts at an aligned address and the file system takes it: a shard is not read again by the
    writer, and copying tens of MB into the page cache costs more CPU than making them (a plain
    write otherwise, and for the rest)."""
    head = len(data) // ALIGN * ALIGN if np.frombuffer(data, np.uint8).ctypes.data % ALIGN == 0 else 0
    with atomic_path(path, sync=False) as tmp:
        fd = os.open(tmp, os.O_WRONLY)
        try:
            done = 0
            if head and hasattr(os, "O_DIRECT"):
                flags = fcntl.fcntl(fd, fcntl.F_GETFL)
                try:
                    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
                    done = _write_all(fd, data[:head])
                except OSError as exc:
                    if exc.errno != errno.EINVAL:  # EINVAL: no direct writes here; written plainly
                        raise
                fcntl.fcntl(fd, fcntl.F_SETFL, flags)
            os.lseek(fd, done, os.SEEK_SET)
            _write_all(fd, data[done:])
        finally:
            os.close(fd)


def _write_all(fd: int, data: memoryview) -> int:
    """``os.write`` until all of ``data`` is written; returns its length."""
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:])
    return done
