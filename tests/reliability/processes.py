"""Process-tree helpers of the worker fault suite (Linux ``/proc``): who carries a tag, who is whose child."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

TAG = "RAYKIT_FAULT_TAG"  # environment variable every process of one scenario inherits


def _state(pid: int) -> str | None:
    """The process's state letter (``R``, ``S``, ``Z``...), or ``None`` when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    return _state(pid) not in (None, "Z")


def tagged(tag: str) -> list[int]:
    """Live processes whose environment has ``RAYKIT_FAULT_TAG=tag`` (a script and its workers)."""
    found = []
    needle = f"{TAG}={tag}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0") and alive(int(entry.name)):
                found.append(int(entry.name))
    return sorted(found)


def children(pid: int) -> list[int]:
    """Live direct children of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid and alive(int(entry.name)):
                    found.append(int(entry.name))
    return sorted(found)


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` s for ``pids`` to exit; the ones still alive then."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


@contextlib.contextmanager
def busy_core() -> Iterator[int]:
    """A process spinning on one core while the block runs (its pid)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield spinner.pid
    finally:
        spinner.kill()
        spinner.wait()


def stdlib_tracebacks(stderr: str) -> list[str]:
    """The exception lines of tracebacks in ``stderr`` that are not raykit's own errors."""
    lines = stderr.splitlines()
    ends = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            following = [x for x in lines[i + 1 :] if x and not x.startswith((" ", "\t"))]
            ends.append(following[0] if following else "<cut short>")
    return [e for e in ends if not e.startswith("raykit.errors.")] + [
        line for line in lines if "Exception in thread" in line or "InvalidStateError" in line
    ]


def environment(tag: str) -> dict[str, str]:
    """The child environment of the suite: this checkout first on the path, and the scenario's tag."""
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]), TAG: tag}
