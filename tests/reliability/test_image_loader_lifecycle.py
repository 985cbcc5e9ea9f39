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

from .conftest import HEIGHT, WIDTH, subprocess_env
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


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("workers", "cache_bytes"), [(0, 0), (2, 0), (0, 1 << 20), (2, 1 << 20)])
def test_set_downscale_inside_the_loop_takes_effect_at_the_next_epoch(
    stores: dict[str, Any], workers: int, cache_bytes: int
) -> None:
    """The natural place of a coarse-to-fine change, inside ``for batch in loader:`` (issue 60: it
    hung at the next step): the epoch goes on at its level, the next one is at the new level."""
    with ImageLoader(stores["zarr"], "train", seed=1) as reference:
        order = [b.names for _ in range(3) for b in reference]
    options = {"num_workers": workers, "cache_bytes": cache_bytes, "prefetch": 1}
    with ImageLoader(stores["zarr"], "train", seed=1, **options) as loader:
        served = []
        for epoch in range(3):
            for k, batch in enumerate(loader):
                served.append((batch.names, tuple(batch.images.shape[1:3])))
                if epoch == 0 and k == 1:
                    loader.set_downscale(2)
                    assert loader.downscale == 1  # this epoch goes on at its level
                if epoch == 1 and k == 0:
                    loader.set_downscale(2)  # the level served: nothing to do
        assert loader.downscale == 2
    n = len(order) // 3
    assert [names for names, _ in served] == order
    assert {shape for _, shape in served[:n]} == {(HEIGHT, WIDTH)}
    assert {shape for _, shape in served[n:]} == {(HEIGHT // 2, WIDTH // 2)}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_goes_on_after_close_and_a_new_iteration_takes_a_pending_level(
    stores: dict[str, Any], workers: int
) -> None:
    """``close()`` while a loop runs (its producer thread is gone) does not leave the loop waiting:
    it goes on from the loader's position; a level asked for while the loop runs is taken by the
    next iteration, from where the loop left off (nerfstudio's datamanager drops its stream)."""
    with ImageLoader(stores["zarr"], "train", seed=1) as reference:
        order = [b.names for b in reference]
    with ImageLoader(
        stores["zarr"], "train", seed=1, num_workers=workers, cache_bytes=0, prefetch=1
    ) as loader:
        it = iter(loader)
        assert next(it).names == order[0]
        loader.close()
        assert next(it).names == order[1]
        loader.set_downscale(2)
        assert loader.downscale == 1
        del it  # the loop left
        rest = [(b.names, tuple(b.images.shape[1:3])) for b in loader]
        assert loader.downscale == 2
    assert rest == [(names, (HEIGHT // 2, WIDTH // 2)) for names in order[2:]]
    assert not _raykit_threads()
