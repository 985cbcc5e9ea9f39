"""Worker fault suite: real scripts, real SIGKILLs, the process tree listed before and after.

Promises checked (docs/loading.md, "Worker processes"): a SIGKILLed worker gives ``WorkerError`` and
the script then exits with its own status within 5 s; a SIGKILLed parent takes every worker with it
within 2 s; workers start from any ``__main__`` (a file with or without a main guard, ``-c``,
standard input); no traceback of the standard library's machinery reaches stderr; nothing is left
running. ``test_repeated_with_a_busy_core`` (slow, run by CI) repeats the kills 20 times with one core
kept busy.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from raykit.loaders import RayLoader

from .processes import alive, busy_core, children, environment, stdlib_tracebacks, tagged, wait_gone

_LOADER = """
import os, signal, sys, time
from raykit.errors import WorkerError
from raykit.loaders import RayLoader
from raykit.store import open_store

def make_loader():
    return RayLoader(open_store(sys.argv[1]), batch_size=16, group_rays=16, prefetch=1, num_workers=2,
                     cache_bytes=0, mix_chunks=1, make_batch=lambda raw: raw)
"""

# No main guard: the workers must start all the same. The last round's loader stays alive at exit.
_KILL_WORKER = (
    _LOADER
    + """
for _ in range(int(sys.argv[2])):
    loader = make_loader()
    loader.wait_for_workers()
    pids = loader.worker_pids()
    batches = loader.forever()
    next(batches)
    os.kill(pids[0], signal.SIGKILL)
    try:
        for _ in batches:
            pass
    except WorkerError as exc:
        assert f"pid {pids[0]} (killed by SIGKILL)" in str(exc), exc
        print("caught", time.time(), *pids, flush=True)
sys.exit(3)
"""
)

_KILL_PARENT = (
    _LOADER
    + """
if __name__ == "__main__":
    loader = make_loader()
    loader.wait_for_workers()
    print("workers", *loader.worker_pids(), flush=True)
    for batch in loader.forever():
        time.sleep(0.01)
"""
)

# Rounds of a SIGKILLed parent without re-importing torch each time: the parent is a forked child.
_KILL_FORKED_PARENTS = (
    _LOADER
    + """
from pathlib import Path

def gone_within(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = []
        for pid in pids:
            try:
                states.append(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
        if all(state == "Z" for state in states):
            return True
        time.sleep(0.02)
    return False

for _ in range(int(sys.argv[2])):
    read, write = os.pipe()
    parent = os.fork()
    if parent == 0:
        loader = make_loader()
        loader.wait_for_workers()
        os.write(write, " ".join(map(str, loader.worker_pids())).encode() + b"\\n")
        for batch in loader.forever():
            time.sleep(0.01)
    workers = [int(p) for p in os.fdopen(read).readline().split()]
    os.kill(parent, signal.SIGKILL)
    os.waitpid(parent, 0)
    print("gone" if gone_within(workers, 2.0) else "left", *workers, flush=True)
"""
)

_ONE_EPOCH = (
    _LOADER
    + """
loader = make_loader()
loader.wait_for_workers()
print(sum(1 for _ in loader), len(loader), *loader.worker_pids(), flush=True)
"""
)


def _run(args: list[str], tag: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment(tag), **kw,
    )  # fmt: skip


def _kill_worker_rounds(script: Path, store: str, rounds: int, beside: int | None = None) -> None:
    """``rounds`` kills of a worker in one script; ``beside``: a process of ours running meanwhile."""
    tag, before = uuid.uuid4().hex, [p for p in children(os.getpid()) if p != beside]
    process = _run([str(script), store, str(rounds)], tag)
    out, err = process.communicate(timeout=60 + 15 * rounds)
    exited = time.time()
    caught = [line.split() for line in out.splitlines() if line.startswith("caught")]
    assert process.returncode == 3, err
    assert len(caught) == rounds, (out, err)
    assert exited - float(caught[-1][1]) < 5.0  # its own exit status, within 5 s of WorkerError
    assert stdlib_tracebacks(err) == [] and "Traceback" not in err, err
    assert tagged(tag) == [] and [p for p in children(os.getpid()) if p != beside] == before
    assert not [pid for line in caught for pid in line[2:] if alive(int(pid))]


def _kill_parent(script: Path, store: str) -> None:
    tag, before = uuid.uuid4().hex, children(os.getpid())
    process = _run([str(script), store], tag)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("workers"), process.stderr.read() if process.stderr else line
    workers = [int(p) for p in line.split()[1:]]
    assert len(workers) == 2 and all(alive(p) for p in workers)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    assert wait_gone(workers, 2.0) == []  # every worker gone within 2 s of the parent
    _out, err = process.communicate(timeout=5)  # and nobody holds the parent's pipes any more
    assert stdlib_tracebacks(err) == [], err
    assert tagged(tag) == [] and children(os.getpid()) == before


@pytest.fixture
def scripts(tmp_path: Path) -> dict[str, Path]:
    found = {}
    for name, text in (
        ("kill_worker", _KILL_WORKER),
        ("kill_parent", _KILL_PARENT),
        ("epoch", _ONE_EPOCH),
        ("kill_forked_parents", _KILL_FORKED_PARENTS),
    ):
        found[name] = tmp_path / f"{name}.py"
        found[name].write_text(text)
    return found


def test_killed_worker_then_the_script_exits_with_its_own_status(
    stores: dict[str, Any], scripts: dict[str, Path]
) -> None:
    _kill_worker_rounds(scripts["kill_worker"], stores["zarr"].url, 1)


def test_killed_parent_takes_its_workers_along(stores: dict[str, Any], scripts: dict[str, Path]) -> None:
    _kill_parent(scripts["kill_parent"], stores["zarr"].url)


@pytest.mark.parametrize("how", ["file", "-c", "stdin"])
def test_workers_start_from_any_main(stores: dict[str, Any], scripts: dict[str, Path], how: str) -> None:
    tag, script = uuid.uuid4().hex, scripts["epoch"]
    args = {"file": [str(script)], "-c": ["-c", script.read_text()], "stdin": ["-"]}[how]
    with open(script) if how == "stdin" else open(os.devnull) as stdin:
        process = _run([*args, stores["zarr"].url], tag, stdin=stdin)
        out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    n, expected, *pids = out.split()
    assert int(n) == int(expected) > 0 and len(pids) == 2  # read by the workers, to the end
    assert "Traceback" not in err and tagged(tag) == []


def test_close_ends_the_workers(stores: dict[str, Any]) -> None:
    before = children(os.getpid())
    loader = RayLoader(stores["zarr"], batch_size=64, num_workers=2, make_batch=lambda raw: raw)
    loader.wait_for_workers()
    pids = loader.worker_pids()
    assert len(pids) == 2 and sorted(set(children(os.getpid())) - set(before)) == sorted(pids)
    loader.close()
    assert not [p for p in pids if alive(p)] and children(os.getpid()) == before


@pytest.mark.slow
def test_repeated_with_a_busy_core(stores: dict[str, Any], scripts: dict[str, Path]) -> None:
    rounds = int(os.environ.get("RAYKIT_FAULT_ROUNDS", "20"))
    tag, before = uuid.uuid4().hex, children(os.getpid())
    with busy_core():  # the two scripts run side by side
        process = _run([str(scripts["kill_forked_parents"]), stores["zarr"].url, str(rounds)], tag)
        _kill_worker_rounds(scripts["kill_worker"], stores["zarr"].url, rounds, beside=process.pid)
        out, err = process.communicate(timeout=60 + 15 * rounds)
    assert process.returncode == 0, err
    assert [line.split()[0] for line in out.splitlines()] == ["gone"] * rounds, out
    assert stdlib_tracebacks(err) == [] and "Traceback" not in err, err
    assert tagged(tag) == [] and children(os.getpid()) == before
