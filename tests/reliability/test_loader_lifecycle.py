"""Loader lifecycle: close, context manager, garbage collection, interpreter exit, dead workers,
and worker start-up from any ``__main__`` (docs/reliability.md)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.errors import ConfigError, WorkerError
from raykit.loaders import RayLoader

from .conftest import subprocess_env
from .processes import children, wait_gone


def _raykit_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("raykit-")]


def test_close_is_idempotent_and_with_releases(stores: dict[str, Any]) -> None:
    with RayLoader(stores["zarr"], batch_size=64, make_batch=lambda r: r) as loader:
        it = iter(loader)
        first = next(it).pid
        assert _raykit_threads()
        loader.close()  # while an iterator is alive: its thread stops
        loader.close()
        assert not [t for t in _raykit_threads() if t == "raykit-loader"]
    loader.close()
    assert not _raykit_threads()
    again = next(iter(loader)).pid  # iterating again restarts what is needed
    assert len(again) == len(first)
    loader.close()
    assert not _raykit_threads()


def test_unclosed_loader_released_by_garbage_collection(stores: dict[str, Any]) -> None:
    loader = RayLoader(stores["zarr"], batch_size=64, num_workers=1, make_batch=lambda r: r)
    loader.wait_for_workers()
    it = iter(loader)
    next(it)
    workers = loader.worker_pids()
    assert workers and _raykit_threads()
    del it, loader
    gc.collect()
    deadline = time.monotonic() + 10
    while (wait_gone(workers, 0.05) or _raykit_threads()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not wait_gone(workers, 0)
    assert not _raykit_threads()


_RAISING = """
import atexit, sys, threading
from raykit.loaders import RayLoader
from raykit.store import open_store

def report():  # public atexit hooks run after threading's: the loader must be released by then
    alive = [t.name for t in threading.enumerate() if t.name.startswith("raykit-")]
    print("alive at exit:", alive, file=sys.stderr)

if __name__ == "__main__":
    atexit.register(report)
    loader = RayLoader(
        open_store(sys.argv[1]), batch_size=16, group_rays=16, prefetch=1, num_workers=int(sys.argv[2])
    )
    batches = iter(loader)  # a module global: alive until the interpreter tears down
    for i, batch in enumerate(batches):
        if i == 3:
            raise ValueError("boom in the training loop")
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_exception_in_loop_keeps_exit_status(stores: dict[str, Any], tmp_path: Path, workers: int) -> None:
    script = tmp_path / "train.py"
    script.write_text(_RAISING)
    out = subprocess.run(
        [sys.executable, str(script), stores["zarr"].url, str(workers)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    assert "ValueError: boom in the training loop" in out.stderr
    assert "alive at exit: []" in out.stderr, out.stderr
    for noise in ("terminate called", "InvalidStateError", "CANCELLED"):
        assert noise not in out.stderr
    assert out.stderr.count("Traceback") == 1


_UNGUARDED = """
import sys
from raykit.loaders import RayLoader
from raykit.store import open_store

store = open_store(sys.argv[1])
loader = RayLoader(store, batch_size=64, num_workers=2)
loader.wait_for_workers()
print(sum(1 for _ in loader), len(loader.worker_pids()))
"""


def test_unguarded_script_starts_workers(stores: dict[str, Any], tmp_path: Path) -> None:
    # Workers are fresh interpreters that never run the parent's __main__: no guard is needed.
    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED)
    out = subprocess.run(
        [sys.executable, str(script), stores["zarr"].url],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    batches, workers = map(int, out.stdout.split())
    assert batches > 0 and workers == 2
    assert "Traceback" not in out.stderr


_MAIN_SOURCE = """
import sys
import numpy as np
from raykit.loaders import MemorySource, RayLoader

class Mine(MemorySource):
    pass

if __name__ == "__main__":
    source = Mine(np.zeros((64, 4), np.uint8), np.arange(64, dtype=np.uint32), 16)
    RayLoader(source, batch_size=16, num_workers=2)
"""


def test_a_source_defined_in_main_is_refused_before_anything_starts(tmp_path: Path) -> None:
    script = tmp_path / "main_source.py"
    script.write_text(_MAIN_SOURCE)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=subprocess_env(), timeout=120
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("raykit.errors.ConfigError: loader: num_workers > 0"), out.stderr
    assert "Mine is defined there" in last and "num_workers=0" in last


def test_workers_start_when_first_needed(stores: dict[str, Any]) -> None:
    before = children(os.getpid())
    loader = RayLoader(stores["zarr"], batch_size=64, num_workers=2, make_batch=lambda r: r)
    assert children(os.getpid()) == before and loader.worker_pids() == []
    loader.close()
    with pytest.raises(ConfigError, match=r"num_workers: expected an integer in \[0, "):
        RayLoader(stores["zarr"], batch_size=64, num_workers=-1)


@pytest.mark.parametrize("backend", ["zarr"])
def test_killed_worker_raises_naming_it_then_restarts(stores: dict[str, Any], backend: str) -> None:
    kw: dict[str, Any] = dict(batch_size=64, seed=5, cache_bytes=0, mix_chunks=1, make_batch=lambda r: r)
    expected = [b.pid for b in RayLoader(stores[backend], **kw)]
    loader = RayLoader(stores[backend], num_workers=2, prefetch=1, group_rays=64, **kw)
    loader.wait_for_workers()
    victim = loader.worker_pids()[0]
    it = iter(loader)
    next(it)  # workers busy with the epoch
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    # The signal can take a moment to land on a loaded machine; the tiny epoch must not end first.
    assert not wait_gone([victim], 10)
    with pytest.raises(WorkerError, match=rf"loader worker process pid {victim} \((killed by SIGKILL|ended)"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 10
    loader.epoch, loader.batch = 0, 0  # the same epoch again, on fresh workers
    got = [b.pid for b in loader]
    loader.close()
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def test_python_dash_m_package_starts_workers(stores: dict[str, Any], tmp_path: Path) -> None:
    # ``python -m pkg`` runs ``pkg/__main__.py`` unguarded (``python -m raykit bench --workers 1``).
    package = tmp_path / "job"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(_UNGUARDED)
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    out = subprocess.run(
        [sys.executable, "-m", "job", stores["zarr"].url],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) > 0
