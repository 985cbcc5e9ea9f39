"""Worker processes a loader starts and ends itself (from any ``__main__``, never hung, never orphaned);
:class:`~raykit.loaders.fetcher.ChunkFetcher` reads a loader's chunks on them.

A worker is a fresh interpreter (``python -c <boot>``, never ``multiprocessing``): it imports
``raykit`` and the chunk source's module (with the parent's ``sys.path``) but never the parent's
``__main__``; a source whose class lives there cannot be rebuilt, so :func:`pickle_source` raises
``ConfigError`` before anything starts.

Each worker has two pipes of its own. The parent writes the pickled source, then ``(task, index)``
requests; the worker answers ``(0, "ready", pid)`` once, then ``(task, "ok", chunk)`` or
``(task, "error", exception)`` per request, in order (arrays as out-of-band pickle buffers). Answers
are matched to tasks by id, so a consumer that stops early abandons its tasks without confusing the
next one.

Lifecycle (exit on a dead parent, ``close()``, SIGINT): ``docs/loading.md``, "Worker processes".
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing.connection
import multiprocessing.spawn
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from raykit.errors import ConfigError

__all__ = ["WorkerDied", "WorkerProcess", "close_workers", "pickle_source", "serve"]

_GRACE_S = 1.0  # how long a closed worker may take to exit before it is killed
_PIPE_BYTES = 1 << 20  # a worker's answer pipe holds a whole chunk (64 Ki rays x 4 bytes) at once
_PATH_VARIABLE = "RAYKIT_WORKER_PATH"
_BOOT = (
    "import json, os, sys\n"
    f"sys.path[:0] = json.loads(os.environ.pop({_PATH_VARIABLE!r}))\n"
    "from raykit.loaders.processes import serve\n"
    "serve(int(sys.argv[1]), int(sys.argv[2]))\n"
)


class WorkerDied(Exception):
    """The worker's pipe ended: the process is gone (``returncode`` once known)."""


# ---- framing: a message is a count, the part lengths, then the parts (pickle + its buffers) ---------
def send(pipe: io.FileIO, obj: Any) -> None:
    """Write ``obj`` as one message (pickle protocol 5, arrays as out-of-band buffers)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    parts = [memoryview(head), *(b.raw() for b in buffers)]
    _write(pipe, struct.pack(f"<I{len(parts)}Q", len(parts), *(p.nbytes for p in parts)))
    for part in parts:
        _write(pipe, part)


def recv(pipe: io.FileIO) -> Any:
    """Read one message written by :func:`send`. Raises ``EOFError`` when the pipe ended."""
    (count,) = struct.unpack("<I", _read(pipe, 4))
    sizes = struct.unpack(f"<{count}Q", _read(pipe, 8 * count))
    parts = [_read(pipe, size) for size in sizes]
    return pickle.loads(parts[0], buffers=parts[1:])


def _write(pipe: io.FileIO, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        written = pipe.write(view)
        view = view[written or 0 :]


def _read(pipe: io.FileIO, size: int) -> bytearray:
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = pipe.readinto(view[got:])
        if not n:
            raise EOFError("pipe ended")
        got += n
    return data


# ---- the parent's side ------------------------------------------------------------------------
class _NoMainPickler(pickle.Pickler):
    """A pickler that refuses objects whose class or function lives in ``__main__``."""

    def persistent_id(self, obj: Any) -> None:
        owner = obj if isinstance(obj, type) or callable(obj) else type(obj)
        if getattr(owner, "__module__", None) == "__main__":
            name = getattr(owner, "__qualname__", repr(owner))
            raise ConfigError(
                f"loader: num_workers > 0 rebuilds the chunk source in worker processes, which do not "
                f"run your __main__ script; {name} is defined there. Move it into an importable module, "
                "or use num_workers=0."
            )
        return None


def pickle_source(source: Any) -> bytes:
    """``source`` pickled for workers.

    Raises:
        ConfigError: the source (or something it holds) is defined in ``__main__``, or cannot be pickled.
    """
    buffer = io.BytesIO()
    try:
        _NoMainPickler(buffer, protocol=5).dump(source)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"loader: num_workers > 0 sends the chunk source ({type(source).__name__}) to worker processes, "
            f"but it cannot be pickled ({exc}); use num_workers=0"
        ) from exc
    return buffer.getvalue()


def _widen(fd: int) -> None:
    """Give the pipe ``fd`` a 1 MiB buffer where the system allows (Linux: ``F_SETPIPE_SZ``)."""
    with contextlib.suppress(OSError, AttributeError, ImportError):
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


def _executable() -> str:
    """The Python that runs workers (``multiprocessing.set_executable`` is honoured)."""
    exe = multiprocessing.spawn.get_executable() or sys.executable
    if not exe:
        raise ConfigError(
            "loader: num_workers > 0 starts Python worker processes, but this interpreter does not know "
            "its executable (sys.executable is empty); call multiprocessing.set_executable(path) or use "
            "num_workers=0"
        )
    return os.fsdecode(exe)


class WorkerProcess:
    """One worker process and its two pipes (see the module docstring).

    Args:
        source_blob: the source, from :func:`pickle_source` (sent by a short thread, so that a large
            source never blocks the caller while the worker imports).
    """

    def __init__(self, source_blob: bytes) -> None:
        worker_in, to_worker = os.pipe()  # (read end, write end)
        from_worker, worker_out = os.pipe()
        _widen(from_worker)
        env = {**os.environ, _PATH_VARIABLE: json.dumps([p for p in sys.path if isinstance(p, str)])}
        self.process = subprocess.Popen(
            [_executable(), "-c", _BOOT, str(worker_in), str(worker_out)],
            pass_fds=(worker_in, worker_out), env=env, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(worker_in)
        os.close(worker_out)
        self.pid = self.process.pid
        self._out = io.FileIO(to_worker, "wb")
        self._in = io.FileIO(from_worker, "rb")
        self.ready = False
        self.outstanding = 0  # tasks submitted and not answered
        self._next_task = 0
        self._answers: dict[int, tuple[str, Any]] = {}
        self._abandoned: set[int] = set()
        self._send_lock, self._recv_lock = threading.Lock(), threading.Lock()
        self._sender = threading.Thread(
            target=self._send_source, args=(source_blob,), name="raykit-worker-start", daemon=True
        )
        self._sender.start()

    def _send_source(self, blob: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):  # the worker died or was closed meanwhile
            _write(self._out, struct.pack("<IQ", 1, len(blob)))
            _write(self._out, blob)

    def readable(self, timeout: float) -> bool:
        """Whether a message (or the end of the pipe) is waiting, within ``timeout`` seconds."""
        return bool(multiprocessing.connection.wait([self._in.fileno()], timeout))

    def poll_ready(self, timeout: float = 0.0) -> bool:
        """Whether the worker is up (reads its hello when one is waiting).

        Raises:
            WorkerDied: the worker ended; any exception it raised rebuilding the source.
        """
        with self._recv_lock:
            if not self.ready and self.readable(timeout):
                _, kind, value = self._recv()
                if kind == "error":
                    raise value
                self.ready = True
        return self.ready

    def submit(self, index: int) -> int:
        """Ask for chunk ``index``; the task's id, for :meth:`result` or :meth:`abandon`."""
        with self._send_lock:
            self._next_task += 1
            task = self._next_task
            try:
                send(self._out, (task, index))
            except (OSError, ValueError) as exc:
                raise WorkerDied(str(exc)) from None
            self.outstanding += 1
        return task

    def result(self, task: int, timeout: float) -> tuple[bool, Any]:
        """``(True, chunk)`` of task ``task``, or ``(False, None)`` when it is not in within ``timeout``.

        Any thread may read the pipe: answers to other tasks are kept for them (or dropped when
        abandoned).

        Raises:
            WorkerDied: the worker ended; the exception ``read_chunk`` raised in the worker.
        """
        with self._recv_lock:
            while task not in self._answers:
                if not self.readable(timeout):
                    return False, None
                done, kind, value = self._recv()
                self.outstanding -= 1
                if done not in self._abandoned:
                    self._answers[done] = (kind, value)
                self._abandoned.discard(done)
            kind, value = self._answers.pop(task)
        if kind == "error":
            raise value
        return True, value

    def abandon(self, tasks: list[int]) -> None:
        """Drop the answers of ``tasks`` (a consumer that stopped early) when they arrive."""
        with self._recv_lock:
            for task in tasks:
                if self._answers.pop(task, None) is None:
                    self._abandoned.add(task)

    def _recv(self) -> tuple[int, str, Any]:
        try:
            return recv(self._in)
        except (EOFError, OSError, ValueError) as exc:
            raise WorkerDied(str(exc)) from None

    def exit_code(self, wait_s: float = 0.0) -> int | None:
        """The exit code once the process has ended (waiting up to ``wait_s``), else ``None``."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(wait_s) if wait_s > 0 else self.process.poll()
        return None


def close_workers(workers: list[WorkerProcess]) -> None:
    """End ``workers``: close their pipes (a live worker sees the end of its input and exits), give
    them ``_GRACE_S`` to exit, SIGKILL and reap the rest (waiting at most ``_GRACE_S`` each)."""
    for pipe in [p for worker in workers for p in (worker._out, worker._in)]:
        with contextlib.suppress(OSError):
            pipe.close()
    deadline = time.monotonic() + _GRACE_S
    for worker in workers:
        if worker.exit_code(max(0.0, deadline - time.monotonic())) is None:
            with contextlib.suppress(OSError):
                worker.process.kill()
            worker.exit_code(_GRACE_S)
        if worker._sender is not threading.current_thread():
            worker._sender.join(_GRACE_S)


# ---- the worker's side ------------------------------------------------------------------------
def _watch_parent(parent: int) -> None:
    """Exit as soon as the parent process is gone (reparented: a new parent pid)."""
    while os.getppid() == parent:
        time.sleep(0.1)
    os._exit(0)


def serve(fd_in: int, fd_out: int) -> None:
    """The worker's loop: rebuild the source, then answer chunk indices until the input ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    threading.Thread(target=_watch_parent, args=(parent,), name="raykit-parent-watch", daemon=True).start()
    inbox, outbox = io.FileIO(fd_in, "rb"), io.FileIO(fd_out, "wb")
    try:
        try:
            source = recv(inbox)
            hello: tuple[int, str, Any] = (0, "ready", os.getpid())
        except EOFError:
            os._exit(0)
        except Exception as exc:  # the source cannot be rebuilt here: say why, then stop
            source, hello = None, (0, "error", _picklable(exc))
        send(outbox, hello)
        while source is not None:
            task, index = recv(inbox)
            try:
                answer: tuple[int, str, Any] = (task, "ok", source.read_chunk(index))
            except Exception as exc:
                answer = (task, "error", _picklable(exc))
            send(outbox, answer)
    except (EOFError, OSError):
        pass  # the parent closed the pipes or died
    os._exit(0)


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` when it survives pickling, else a ``RuntimeError`` carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
