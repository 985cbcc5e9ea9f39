"""A ``raykit`` command in a child process that pauses at a known point of its work until Ctrl-C, so a
test interrupts it there for certain instead of racing it (a fast machine would otherwise finish first).

The child runs the real command; the one change is that its first atomic rename (``os.rename`` or
``os.replace``, the last step of every raykit write) onto a path matching a pattern tells the test
(a line on a pipe) and then waits. The test sends SIGINT: the main thread gets its
``KeyboardInterrupt`` wherever it is (in the wait, if the rename was its own), and a worker thread
that waited goes on, as it would have without the pause.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

_CHILD = r"""
import fnmatch, os, signal, sys, threading
from raykit.cli import main

pattern, fd = sys.argv[1], int(sys.argv[2])
resume, lock, paused = threading.Event(), threading.Lock(), []


def on_sigint(signum, frame):
    resume.set()
    signal.default_int_handler(signum, frame)


def pausing(real):
    def rename(src, dst, *args, **kwargs):
        real(src, dst, *args, **kwargs)
        with lock:
            first = not paused and fnmatch.fnmatch(os.fspath(dst), pattern)
            if first:
                paused.append(os.fspath(dst))
        if first:
            os.write(fd, (paused[0] + "\n").encode())
            resume.wait()

    return rename


signal.signal(signal.SIGINT, on_sigint)
os.rename, os.replace = pausing(os.rename), pausing(os.replace)
sys.exit(main(sys.argv[3:]))
"""


def start_paused(
    pattern: str, args: list[str], env: dict[str, str], timeout: float = 120
) -> tuple[subprocess.Popen[str], str]:
    """Start ``raykit *args`` and wait until it has renamed a file or directory onto a path matching
    ``pattern`` (``fnmatch``, on the full path); returns the process (stderr piped) and that path.

    Raises:
        AssertionError: the command exited, or did not get there within ``timeout`` seconds.
    """
    read, write = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, pattern, str(write), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            pass_fds=(write,),
        )
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as pipe:
        ready, _, _ = select.select([pipe], [], [], timeout)
        line = pipe.readline().decode().strip() if ready else ""
    if not line:
        proc.kill()
        _, stderr = proc.communicate()
        command = " ".join(["raykit", *args])
        raise AssertionError(f"{command} never wrote {pattern} (exit {proc.returncode}): {stderr}")
    assert Path(line).exists(), line
    return proc, line


# Imported by every Python process started with ``paused_rank_env``'s PYTHONPATH (torchrun's workers
# too): the first-attempt worker of one rank pauses after its first rename onto a path matching the
# pattern, and says so in a file, until it is killed (torchrun stops it when the group restarts).
_SITECUSTOMIZE = r"""
import fnmatch, os, threading

_pattern = os.environ.get("RAYKIT_TEST_PAUSE_PATTERN")
if (
    _pattern
    and os.environ.get("RANK") == os.environ.get("RAYKIT_TEST_PAUSE_RANK")
    and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
):
    _lock, _paused = threading.Lock(), []

    def _pausing(real):
        def rename(src, dst, *args, **kwargs):
            real(src, dst, *args, **kwargs)
            with _lock:
                first = not _paused and fnmatch.fnmatch(os.fspath(dst), _pattern)
                if first:
                    _paused.append(os.fspath(dst))
            if first:
                with open(os.environ["RAYKIT_TEST_PAUSE_NOTE"] + ".tmp", "w") as note:
                    note.write(os.fspath(dst))
                real(os.environ["RAYKIT_TEST_PAUSE_NOTE"] + ".tmp", os.environ["RAYKIT_TEST_PAUSE_NOTE"])
                threading.Event().wait()

        return rename

    os.rename, os.replace = _pausing(os.rename), _pausing(os.replace)
"""


def paused_rank_env(folder: Path, pattern: str, rank: int, pythonpath: str) -> dict[str, str]:
    """Environment entries under which torchrun's first-attempt worker of ``rank`` pauses for good
    after its first rename onto a path matching ``pattern`` (``fnmatch``), so a test acts on the run
    at that point for certain instead of racing it; ``wait_paused(folder)`` waits for it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return {
        "PYTHONPATH": os.pathsep.join([str(folder), pythonpath]),
        "RAYKIT_TEST_PAUSE_PATTERN": pattern,
        "RAYKIT_TEST_PAUSE_RANK": str(rank),
        "RAYKIT_TEST_PAUSE_NOTE": str(folder / "paused"),
    }


def wait_paused(folder: Path, proc: subprocess.Popen[str], timeout: float = 240) -> Path:
    """The path the worker of ``paused_rank_env(folder, ...)`` paused after renaming onto, once it
    has (the note appears atomically, written by the paused worker itself).

    Raises:
        AssertionError: the command exited, or no worker paused within ``timeout`` seconds.
    """
    note, deadline = folder / "paused", time.monotonic() + timeout
    while not note.exists():  # the worker stays paused from the moment the note exists
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no worker paused (exit {proc.poll()})")
        time.sleep(0.02)
    return Path(note.read_text())
