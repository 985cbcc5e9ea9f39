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
