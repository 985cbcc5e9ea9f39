"""The writer's explicit staging objects: both staging areas hold the same rows; memory staging stays in
its process; merge buffers are per thread and per object, and go with the object."""

from __future__ import annotations

import contextlib
import gc
import pickle
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

from raykit.errors import SourceError
from raykit.store.write.gather import MergeBuffers
from raykit.store.write.staging import (
    DiskStaging,
    MemoryStaging,
    StagingArea,
    pack_rgba,
    staging_file,
)
from raykit.store.write.tasks import PhaseClock


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_staging_areas_read_back_what_was_put(tmp_path: Path, kind: str) -> None:
    area: StagingArea = DiskStaging(str(tmp_path)) if kind == "disk" else MemoryStaging(str(tmp_path))
    rows = {i: np.random.default_rng(i).integers(0, 2**32, 50 + i, dtype=np.uint32) for i in range(3)}
    files = {}
    for i, r in rows.items():
        files.update(area.put(i, r, PhaseClock()))
    if kind == "disk":
        assert sorted(files) == [staging_file(i) for i in range(3)]
        assert all((tmp_path / rel).stat().st_size == files[rel]["size"] for rel in files)
    else:
        assert files == {} and not (tmp_path / "staging").exists()
    for i, r in rows.items():
        out = np.empty(20, dtype=np.uint32)
        area.read(i, 7, out)
        np.testing.assert_array_equal(out, r[7:27])


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_rgb_rows_are_staged_in_three_bytes_and_released_runs_are_freed(tmp_path: Path, kind: str) -> None:
    area: StagingArea = DiskStaging(str(tmp_path)) if kind == "disk" else MemoryStaging(str(tmp_path))
    rgb = np.random.default_rng(0).integers(0, 256, (300_000, 3), dtype=np.uint8)
    rows = pack_rgba(rgb)  # alpha 255: what the stage task puts for an RGB image
    files = area.put(0, rows, PhaseClock(), channels=3)
    out = np.empty(1000, dtype=np.uint32)
    area.read(0, 123, out, channels=3)
    np.testing.assert_array_equal(out, rows[123:1123])  # packed again, alpha 255
    if kind == "memory":
        assert files == {}
        return
    path = tmp_path / staging_file(0)
    assert path.stat().st_size == files[staging_file(0)]["size"] == 3 * len(rows)
    before = path.stat().st_blocks
    area.release(0, 1000, 290_000, channels=3)  # rows a shard task has written
    area.read(0, 290_000, out[:500], channels=3)  # the rest reads as it was
    np.testing.assert_array_equal(out[:500], rows[290_000:290_500])
    area.read(0, 0, out, channels=3)
    np.testing.assert_array_equal(out, rows[:1000])
    freed = np.fromfile(path, dtype=np.uint8)[3 * 1000 : 3 * 290_000]
    if path.stat().st_blocks < before:  # the file system punched the hole: the rows read as zeros
        assert not freed.any() and path.stat().st_size == 3 * len(rows)


def test_damaged_staging_file_names_the_file(tmp_path: Path) -> None:
    area = DiskStaging(str(tmp_path))
    area.put(4, np.arange(10, dtype=np.uint32), PhaseClock())
    with pytest.raises(SourceError, match=r"000004\.px: staging file truncated"):
        area.read(4, 5, np.empty(10, dtype=np.uint32))


def test_memory_staging_stays_in_its_process_and_is_dropped_on_close(tmp_path: Path) -> None:
    with contextlib.closing(MemoryStaging("out.partial")) as area:
        area.put(0, np.arange(4, dtype=np.uint32), PhaseClock())
        with pytest.raises(TypeError, match="in-memory staging cannot leave its process"):
            pickle.dumps(area)
    with pytest.raises(SourceError, match=r"out\.partial: image 0 is not staged in memory"):
        area.read(0, 0, np.empty(1, dtype=np.uint32))
    assert pickle.loads(pickle.dumps(DiskStaging(str(tmp_path)))) == DiskStaging(str(tmp_path))


def test_merge_buffers_are_reused_per_thread_and_freed_with_their_object() -> None:
    buffers = MergeBuffers()
    a = buffers.alloc_for("pid")("pid", (4, 8))
    b = buffers.alloc_for("pid")("pid", (2, 8))  # same thread, same field: the same memory
    assert np.shares_memory(a, b)
    assert not np.shares_memory(a, buffers.alloc_for("rgba")("pid", (4, 8)))
    assert not np.shares_memory(a, MergeBuffers().alloc_for("pid")("pid", (4, 8)))
    other: list[np.ndarray] = []
    thread = threading.Thread(
        target=lambda m: other.append(m.alloc_for("pid")("pid", (4, 8))), args=(buffers,)
    )
    thread.start()
    thread.join()
    assert not np.shares_memory(a, other[0])
    assert isinstance(pickle.loads(pickle.dumps(buffers)), MergeBuffers)  # a worker's own buffers
    base = a.base
    while getattr(base, "base", None) is not None:
        base = base.base
    ref = weakref.ref(base)
    del a, b, buffers, base
    gc.collect()
    assert ref() is None  # nothing kept them alive: no process-wide registry, nothing to free by hand
