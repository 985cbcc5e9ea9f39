"""Writer tasks: decode images into staging files (phase 1) and gather the rays of one shard (phase 2).

Every task is a module-level function of one picklable job, so any ``concurrent.futures.Executor``
(a process pool, a dask ``Client.get_executor()``) can run it. Tasks write their outputs atomically
and leave a small JSON record keyed by their inputs; a rerun with the same inputs reuses any output
whose record and checksums still match.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import SourceError
from raykit.fileio import atomic_path, atomic_write_json, sha256_file
from raykit.store.integrity import file_record
from raykit.store.schema import ImageRecord, SplitInfo

__all__ = [
    "StageJob",
    "StagingSource",
    "StoreSource",
    "record_matches",
    "stage_image",
]


def record_matches(record_path: Path, key: str, root: Path) -> dict[str, Any] | None:
    """The stored result of a finished task if its key matches and its files are intact, else None."""
    if not record_path.exists():
        return None
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("key") != key:
        return None
    for rel, expected in record["result"].get("files", {}).items():
        path = root / rel
        if not path.exists() or file_record(path) != expected:
            return None
    result: dict[str, Any] = record["result"]
    return result


@dataclass(frozen=True)
class StageJob:
    """Decode image ``index`` of the table into ``root/staging/{index:06d}.npy`` as uint8 (H*W, C)."""

    root: str
    index: int
    record: ImageRecord
    key: str

    @property
    def rel(self) -> str:
        return f"staging/{self.index:06d}.npy"


def _check_pixels(rec: ImageRecord, pixels: Any) -> np.ndarray:
    array = np.asarray(pixels)
    expected = (rec.camera.height, rec.camera.width)
    if (
        array.dtype != np.uint8
        or array.ndim != 3
        or array.shape[:2] != expected
        or array.shape[2] not in (3, 4)
    ):
        raise SourceError(
            f"{rec.source_path or rec.name}: expected uint8 pixels of shape "
            f"({expected[0]}, {expected[1]}, 3|4) matching its camera, got {array.dtype} {array.shape}"
        )
    return array


def stage_image(job: StageJob) -> dict[str, Any]:
    """Phase-1 task. Returns ``{"files": {rel: record}, "channels": 3|4, "source_sha256": hex}``."""
    root = Path(job.root)
    record_path = root / f"staging/{job.index:06d}.json"
    done = record_matches(record_path, job.key, root)
    if done is not None:
        return done
    rec = job.record
    pixels = _check_pixels(rec, rec.load())
    with atomic_path(root / job.rel) as tmp, open(tmp, "wb") as handle:
        np.save(handle, np.ascontiguousarray(pixels.reshape(-1, pixels.shape[2])), allow_pickle=False)
    source_sha = rec.source_sha256
    if not source_sha and rec.source_path and os.path.isfile(rec.source_path):
        source_sha = sha256_file(rec.source_path)
    result = {
        "files": {job.rel: file_record(root / job.rel)},
        "channels": int(pixels.shape[2]),
        "source_sha256": source_sha,
    }
    atomic_write_json(record_path, {"key": job.key, "result": result})
    return result


@dataclass(frozen=True)
class StagingSource:
    """Rays of a store being written, gathered from staging files (and the train permutation).

    Attributes:
        root: the partial directory.
        pixel_offset: (I,) first pid of every image, as a tuple.
        channels: channels stored (3 or 4); RGB images get alpha 255 when 4.
        materialize: None, ``"float16"`` or ``"float32"``: also generate origins/directions.
    """

    root: str
    pixel_offset: tuple[int, ...]
    channels: int
    materialize: str | None

    def gather(self, info: SplitInfo, start: int, stop: int) -> dict[str, np.ndarray]:
        """Field name -> values of rays ``[start, stop)`` of split ``info``."""
        root = Path(self.root)
        if info.shuffled:
            perm = np.load(root / f"perm-{info.name}.npy", mmap_mode="r")
            pid = np.asarray(perm[start:stop], dtype=np.int64) + info.pid_start
        else:
            pid = np.arange(start, stop, dtype=np.int64) + info.pid_start
        offsets = np.asarray(self.pixel_offset, dtype=np.int64)
        image = np.searchsorted(offsets, pid, side="right") - 1
        rgba = np.full((len(pid), self.channels), 255, dtype=np.uint8)
        order = np.argsort(image, kind="stable")
        bounds = [*np.searchsorted(image[order], np.unique(image), side="left").tolist(), len(pid)]
        for lo, hi in itertools.pairwise(bounds):
            rows = order[lo:hi]
            i = int(image[rows[0]])
            staged = np.load(root / f"staging/{i:06d}.npy", mmap_mode="r")
            rgba[rows, : staged.shape[1]] = staged[pid[rows] - offsets[i]]
        out: dict[str, np.ndarray] = {"rgba": rgba, "pid": pid.astype(np.uint32)}
        if self.materialize:
            out.update(_materialize(root / "cameras.parquet", pid.astype(np.uint32), self.materialize))
        return out


def _materialize(cameras_path: Path, pid: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    import torch

    from raykit.store.table import CameraTable, ray_generator, read_camera_table

    table = CameraTable.from_arrow(read_camera_table(cameras_path.read_bytes(), str(cameras_path)))
    generator = ray_generator(table, "cpu")
    image, pixel = table.decode(pid)
    origins, directions, *_ = generator.generate(torch.from_numpy(image), torch.from_numpy(pixel))
    return {
        "origins": origins.numpy().astype(dtype),
        "directions": directions.numpy().astype(dtype),
    }


@dataclass(frozen=True)
class StoreSource:
    """Rays gathered from another committed store (``raykit copy``)."""

    url: str

    def gather(self, info: SplitInfo, start: int, stop: int) -> dict[str, np.ndarray]:
        from raykit.store.reader import open_store

        raw = open_store(self.url).read(info.name, start, stop)
        return {"rgba": raw.rgba, "pid": raw.pid, **raw.extra}
