"""ImageLoader keeps its host's exit status and releases its threads and workers, like RayLoader."""

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

import pytest

from raykit.errors import WorkerError
from raykit.loaders import ImageLoader

from .conftest import subprocess_env
from .processes import wait_gone

_RAISING = """
import atexit, sys, threading
from raykit.loaders import ImageLoader
from raykit.store import open_store

def report():  # public atexit hooks run after threading's: the loader must be released by then
    alive = [t.name for t in threading.enumerate() if t.name.startswith("raykit-")]
    print("alive at exit:", alive, file=sys.stderr)

if __name__ == "__main__":
    atexit.register(report)
    loader = ImageLoader(open_store(sys.argv[1]), "train", prefetch=1, num_workers=int(sys.argv[2]),
                         cache_bytes=0)
    batches = iter(loader)  # a module global: alive until the interpreter tears down
    for i, batch in enumerate(batches):
        if i == 3:
            raise ValueError("boom in the training loop")
"""


def _raykit_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("raykit-")]


@pytest.mark.parametrize("workers", [0, 2])
def test_exception_in_loop_keeps_exit_status(stores: dict[str, Any], tmp_path: Path, workers: int) -> None:
    script = tmp_path / "train.py"
    script.write_text(_RAISING)
    out = subprocess.run(
        [sys.executable, str(script), stores["zarr"].url, str(workers)],
        capture_output=True, text=True, env=subprocess_env(), timeout=120,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert "ValueError: boom in the training loop" in out.stderr
    assert "alive at exit: []" in out.stderr, out.stderr
    for noise in ("terminate called", "InvalidStateError", "CANCELLED"):
        assert noise not in out.stderr
    assert out.stderr.count("Traceback") == 1


def test_unclosed_loader_is_released_by_garbage_collection(stores: dict[str, Any]) -> None:
    loader = ImageLoader(stores["zarr"], "test", num_workers=2, cache_bytes=0)
    loader.wait_for_workers()
    workers = loader.worker_pids()
    it = iter(loader)
    next(it)
    del it, loader
    gc.collect()
    deadline = time.monotonic() + 10
    while (wait_gone(workers, 0.05) or _raykit_threads()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) == 2 and not wait_gone(workers, 0) and not _raykit_threads()


@pytest.mark.slow
def test_killed_worker_raises_naming_it_then_restarts(stores: dict[str, Any]) -> None:
    def names(loader: ImageLoader) -> list[tuple[str, ...]]:
        return [b.names for b in loader]

    expected = names(ImageLoader(stores["zarr"], "train", seed=3, cache_bytes=0))
    loader = ImageLoader(stores["zarr"], "train", seed=3, num_workers=2, cache_bytes=0)
    loader.wait_for_workers()
    victim = loader.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerError, match=f"pid {victim}"):
        names(loader)
    loader.load_state_dict({**loader.state_dict(), "epoch": 0, "batch": 0})
    assert names(loader) == expected
    loader.close()
