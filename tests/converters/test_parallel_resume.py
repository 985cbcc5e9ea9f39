"""Determinism across executors (a real Dask LocalCluster) and atomic, resumable conversion under SIGKILL."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from raykit.converters import convert
from raykit.errors import StoreError
from raykit.store import open_store

from ..reliability.paused import start_paused


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _assert_same_bytes(a: Path, b: Path) -> None:
    ta, tb = _tree(a), _tree(b)
    assert sorted(ta) == sorted(tb)
    different = [name for name in ta if ta[name] != tb[name]]
    assert different == []


LAYOUT = {"chunk_rays": 128, "shard_chunks": 2}


def _serial_and(tmp_path: Path, make, name: str, **options) -> tuple[Path, Any]:
    """Convert a small capture serially (one thread) into ``one/`` and with ``options`` into ``name/``;
    check that both hold the same bytes. Returns the capture and the serial store."""
    src = make.blender(tmp_path / "src", counts={"train": 4, "test": 2}, size=(16, 12))
    single = convert(src, tmp_path / "one" / "s.zarr", threads=1, **LAYOUT)
    other = convert(src, tmp_path / name / "s.zarr", **options, **LAYOUT)
    assert single.fingerprint == other.fingerprint
    _assert_same_bytes(tmp_path / "one" / "s.zarr", tmp_path / name / "s.zarr")
    return src, single


@pytest.mark.slow
def test_dask_clusters_give_identical_bytes(tmp_path: Path, make) -> None:
    src, single = _serial_and(tmp_path, make, "two", workers=2)
    from dask.distributed import LocalCluster

    cluster_options = {"n_workers": 1, "threads_per_worker": 2, "processes": False, "protocol": "tcp"}
    with LocalCluster(dashboard_address=None, **cluster_options) as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        remote = convert(src, tmp_path / "sched" / "s.zarr", scheduler=cluster.scheduler_address, **LAYOUT)
    assert remote.fingerprint == single.fingerprint
    _assert_same_bytes(tmp_path / "one" / "s.zarr", tmp_path / "sched" / "s.zarr")


def test_threads_give_identical_bytes(tmp_path: Path, make) -> None:
    _serial_and(tmp_path, make, "threads", threads=3)


def test_executor_options_are_checked() -> None:
    import concurrent.futures

    from raykit.converters.executor import conversion_executor
    from raykit.errors import ConfigError

    with conversion_executor(1, None, 2) as pool:
        assert isinstance(pool, concurrent.futures.ThreadPoolExecutor)
    with conversion_executor(1, None, 1) as none:
        assert none is None
    for bad in ({"threads": 0}, {"workers": 0}, {"scheduler": "tcp://127.0.0.1:1", "threads": 2}):
        with pytest.raises(ConfigError), conversion_executor(**bad):  # type: ignore[arg-type]
            pass


DONE = "tasks/[!.]*.json"  # shard records (atomic: temporary files start with a dot)


def _opens(path: Path) -> bool:
    try:
        open_store(str(path), verify=True)
    except (StoreError, OSError, ValueError):
        return False
    return True


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_sigkill_leaves_no_store_and_rerun_resumes(tmp_path: Path, make, backend: str) -> None:
    src = make.blender(tmp_path / "src", counts={"train": 12, "test": 4}, size=(64, 64))
    dst = tmp_path / "kill" / "store"
    partial = dst.with_name(dst.name + ".partial")
    layout = ["--chunk-rays", "1024", "--shard-chunks", "1", "--no-progress"]
    args = ["convert", str(src), str(dst), "--format", backend, *layout]
    # killed once its first shard is recorded (the child waits there: no race to lose)
    proc, _ = start_paused(f"{partial}/{DONE}", args, os.environ.copy())
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    finished = [json.loads(p.read_text()) for p in sorted(partial.glob(DONE))]
    kept = {rel: (partial / rel).stat().st_mtime_ns for rec in finished for rel in rec["result"]["files"]}
    assert kept, "no shard was complete when the process was killed"
    assert not _opens(dst) and not _opens(partial)
    resumed = convert(src, dst, backend=backend, chunk_rays=1024, shard_chunks=1)
    assert not partial.exists()
    assert {rel: (dst / rel).stat().st_mtime_ns for rel in kept} == kept  # finished shards were reused
    clean = convert(src, tmp_path / "clean" / "store", backend=backend, chunk_rays=1024, shard_chunks=1)
    assert resumed.fingerprint == clean.fingerprint
    _assert_same_bytes(dst, tmp_path / "clean" / "store")
