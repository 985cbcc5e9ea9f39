"""The writer's explicit staging objects: both staging areas hold the same rows; memory staging stays in
its process; merge buffers are per thread and per object, and go with the object."""

from __future__ import annotations

import gc
import pickle
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest

from raykit.errors import SourceError
from raykit.store.phases import PhaseClock
from raykit.store.staging_area import DiskStaging, MemoryStaging, MergeBuffers, StagingArea, staging_file


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


def test_damaged_staging_file_names_the_file(tmp_path: Path) -> None:
    area = DiskStaging(str(tmp_path))
    area.put(4, np.arange(10, dtype=np.uint32), PhaseClock())
    with pytest.raises(SourceError, match=r"000004\.px: staging file truncated"):
        area.read(4, 5, np.empty(10, dtype=np.uint32))


def test_memory_staging_stays_in_its_process_and_is_dropped_on_close(tmp_path: Path) -> None:
    with MemoryStaging("out.partial") as area:
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
