"""The camera table (``cameras.parquet``): one row per image, in pid order.

Rows are ordered by split (``train``, ``val``, ``test``, then others by name) and then by image name;
a row's index is the ``image`` value of its rays.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raykit.errors import ConfigError, StoreCorruptError
from raykit.fileio import atomic_path
from raykit.store.schema import MAX_PIXELS, TIME_FIELDS, ImageRecord, decode_pids, split_sort_key

if TYPE_CHECKING:
    from raykit.cameras import Camera

__all__ = [
    "CAMERA_TABLE_SCHEMA",
    "TIME_COLUMNS",
    "CameraTable",
    "build_camera_table",
    "order_records",
    "read_camera_table",
    "read_parquet",
    "write_camera_table",
    "write_parquet",
]

_SPLIT_NAME = re.compile(r"[A-Za-z0-9_-]+")

CAMERA_TABLE_SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("name", pa.string()),
        ("split", pa.string()),
        ("camera_id", pa.int64()),
        ("model", pa.string()),
        ("model_id", pa.int32()),
        ("width", pa.int64()),
        ("height", pa.int64()),
        ("params", pa.list_(pa.float64())),
        ("c2w", pa.list_(pa.float64(), 16)),
        ("near", pa.float64()),
        ("far", pa.float64()),
        ("pixel_offset", pa.int64()),
        ("n_pixels", pa.int64()),
        ("ray_start", pa.int64()),
        ("ray_stop", pa.int64()),
        ("has_alpha", pa.bool_()),
        ("source_path", pa.string()),
        ("source_sha256", pa.string()),
    ]
)
TIME_COLUMNS = pa.schema([("time", pa.float64()), ("camera_index", pa.int64()), ("frame_index", pa.int64())])
"""Optional columns (``raykit.store.FrameTime``), after the others: written when any image has the value
(then every image has it); a store without them is static."""


def order_records(records: Sequence[ImageRecord]) -> list[ImageRecord]:
    """Records in table order (split, then name); raises ConfigError on duplicate names or no records."""
    if not records:
        raise ConfigError("write_store: expected at least one image record, got none")
    names = [r.name for r in records]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"write_store: image names must be unique, got duplicates {dupes[:5]}")
    problems = [
        f"image {r.name!r}: expected a split name of letters, digits, '_' or '-', got {r.split!r}"
        for r in records
        if not _SPLIT_NAME.fullmatch(r.split)
    ]
    bad = np.full((4, 4), np.nan)  # a c2w of another shape: reported as not a 4x4
    c2w = np.stack([np.asarray(r.c2w, np.float64) if np.shape(r.c2w) == (4, 4) else bad for r in records])
    bounds = np.array([[np.nan if v is None else v for v in (r.near, r.far)] for r in records], np.float64)
    problems += record_problems(names, c2w, bounds[:, 0], bounds[:, 1])
    problems += _time_problems(records)
    if problems:
        raise ConfigError("write_store: invalid image records: " + "; ".join(problems[:10]))
    ordered = sorted(records, key=lambda r: (split_sort_key(r.split), r.name))
    total = sum(r.camera.width * r.camera.height for r in ordered)
    if total >= MAX_PIXELS:
        raise ConfigError(f"write_store: expected fewer than 2**32 pixels in one store, got {total}")
    return ordered


def _time_problems(records: Sequence[ImageRecord]) -> list[str]:
    """Lines for ``FrameTime`` values out of range, and for a field some records have and others lack."""
    problems = [f"image {r.name!r}: {p}" for r in records for p in r.time_problems()]
    for name in TIME_FIELDS:
        lacking = [r.name for r in records if getattr(r, name) is None]
        if lacking and len(lacking) < len(records):
            problems.append(
                f"{len(records) - len(lacking)} of {len(records)} images have a {name} "
                f"(image {lacking[0]!r} has none); expected every image or none"
            )
    return problems


def record_problems(names: Sequence[str], c2w: np.ndarray, near: np.ndarray, far: np.ndarray) -> list[str]:
    """One line per image whose pose or bounds are bad, the writer's check of its records and
    ``raykit validate``'s of a camera table: ``c2w`` (N, 4, 4) a finite 4x4 with last row
    ``[0, 0, 0, 1]`` and an orthonormal right-handed rotation; ``near``, ``far`` (N,) (NaN: unknown)
    finite, non-negative and ``near < far``."""
    finite = np.isfinite(c2w).all(axis=(1, 2))
    safe = np.where(finite[:, None, None], c2w, np.eye(4))
    affine = finite & np.isclose(safe[:, 3], [0, 0, 0, 1]).all(axis=1)
    rot = safe[:, :3, :3]
    gram = np.einsum("nji,njk->nik", rot, rot)  # rot.T @ rot per pose
    proper = np.isclose(gram, np.eye(3), atol=1e-4).all(axis=(1, 2)) & (np.linalg.det(rot) > 0)
    bounds = np.stack([near, far])
    sound = (np.isnan(bounds) | (np.isfinite(bounds) & (bounds >= 0))).all(axis=0)
    ordered = ~(near >= far)  # False for NaN: an unknown bound
    problems = []
    for i in np.flatnonzero(~affine | ~proper | ~sound | ~ordered):
        who = f"image {names[int(i)]!r}"
        if not affine[i]:
            problems.append(f"{who}: expected c2w a finite 4x4 with last row [0, 0, 0, 1]")
        elif not proper[i]:
            problems.append(f"{who}: expected c2w with an orthonormal right-handed rotation")
        if not sound[i]:
            problems.append(f"{who}: expected finite non-negative near/far, got {near[i]}, {far[i]}")
        elif not ordered[i]:
            problems.append(f"{who}: expected near < far, got {near[i]}, {far[i]}")
    return problems


def build_camera_table(
    records: Sequence[ImageRecord],
    has_alpha: Sequence[bool],
    source_sha256: Sequence[str],
    shuffled_splits: set[str],
) -> pa.Table:
    """Camera table of ordered ``records`` (see :func:`order_records`)."""
    n_pixels = np.array([r.camera.width * r.camera.height for r in records], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(n_pixels)[:-1]]).astype(np.int64)
    split_start = {r.split: int(offsets[i]) for i, r in reversed(list(enumerate(records)))}
    rows: dict[str, list[Any]] = {name: [] for name in CAMERA_TABLE_SCHEMA.names}
    for i, rec in enumerate(records):
        cam = rec.camera
        start = None if rec.split in shuffled_splits else int(offsets[i]) - split_start[rec.split]
        values = {
            "index": i,
            "name": rec.name,
            "split": rec.split,
            "camera_id": int(cam.camera_id),
            "model": cam.model,
            "model_id": int(cam.model_id),
            "width": int(cam.width),
            "height": int(cam.height),
            "params": [float(p) for p in cam.params],
            "c2w": [float(v) for v in np.asarray(rec.c2w, dtype=np.float64).reshape(16)],
            "near": None if rec.near is None else float(rec.near),
            "far": None if rec.far is None else float(rec.far),
            "pixel_offset": int(offsets[i]),
            "n_pixels": int(n_pixels[i]),
            "ray_start": start,
            "ray_stop": None if start is None else start + int(n_pixels[i]),
            "has_alpha": bool(has_alpha[i]),
            "source_path": rec.source_path,
            "source_sha256": source_sha256[i],
        }
        for key, value in values.items():
            rows[key].append(value)
    table = pa.table(rows, schema=CAMERA_TABLE_SCHEMA)
    for column in TIME_COLUMNS:
        if getattr(records[0], column.name) is not None:
            times = [getattr(r, column.name) for r in records]
            table = table.append_column(column, pa.array(times, type=column.type))
    return table


def write_parquet(table: pa.Table, path: Path) -> None:
    """Write ``table`` at ``path``, atomically, with fixed options (the same bytes for the same table):
    ``cameras.parquet`` and ``points3D.parquet``."""
    with atomic_path(path) as tmp:
        pq.write_table(table, str(tmp), compression="zstd", write_statistics=False, store_schema=False)


def write_camera_table(table: pa.Table, root: Path) -> None:
    """Write ``table`` as ``root/cameras.parquet`` (``write_parquet``)."""
    write_parquet(table, root / "cameras.parquet")


def read_parquet(data: bytes, schema: pa.Schema, where: str, optional: pa.Schema | None = None) -> pa.Table:
    """Parse parquet bytes and check that they hold ``schema``'s columns (``cameras.parquet``,
    ``points3D.parquet``), then those of ``optional`` they have, of its types; ``where`` names the
    file in errors.

    Not ``pq.read_table``: its dataset scanner's worker threads may drop the last reference to ``data``
    after the call returned, and one doing so while the interpreter exits aborts the process
    ("terminate called without an active exception", status 134). Here everything runs on this thread.
    """
    try:
        table = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read(use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise StoreCorruptError(f"{where}: unreadable parquet: {exc}") from exc
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise StoreCorruptError(f"{where}: expected columns {missing}, not found")
    extra = [c for c in optional or () if c.name in table.column_names]
    for column in extra:
        if table.schema.field(column.name).type != column.type:
            found = table.schema.field(column.name).type
            raise StoreCorruptError(f"{where}: expected column {column.name} of {column.type}, got {found}")
    return table.select([*schema.names, *(c.name for c in extra)])


def read_camera_table(data: bytes, where: str) -> pa.Table:
    """Parse and check ``cameras.parquet`` bytes (``read_parquet``), with its time columns if any."""
    return read_parquet(data, CAMERA_TABLE_SCHEMA, where, TIME_COLUMNS)


@dataclass(frozen=True)
class CameraTable:
    """The camera table as numpy arrays (I images, C distinct cameras).

    ``camera_keys`` are the distinct cameras' records ``(model, width, height, params, camera_id)``;
    ``cameras`` builds ``raykit.cameras.Camera`` objects from them on first use, which imports torch
    (``raykit info`` and ``validate`` of a rays store need none). ``time``, ``rig_camera`` and
    ``frame_index`` are the ``TIME_COLUMNS`` (``rig_camera``: the ``camera_index`` column, the rig
    camera of a multi-view video), each None when the store has no such column (a static capture).
    """

    names: list[str]
    splits: list[str]
    camera_keys: list[tuple[str, int, int, tuple[float, ...], int]]
    camera_index: np.ndarray  # (I,) int64 into cameras
    c2w: np.ndarray  # (I, 4, 4) float64
    near: np.ndarray  # (I,) float64, NaN when unknown
    far: np.ndarray  # (I,) float64, NaN when unknown
    width: np.ndarray  # (I,) int64
    height: np.ndarray  # (I,) int64
    pixel_offset: np.ndarray  # (I,) int64
    ray_start: np.ndarray  # (I,) int64, -1 in shuffled splits
    has_alpha: np.ndarray  # (I,) bool
    time: np.ndarray | None = None  # (I,) float64
    rig_camera: np.ndarray | None = None  # (I,) int64
    frame_index: np.ndarray | None = None  # (I,) int64

    @cached_property
    def cameras(self) -> list[Camera]:
        """The distinct cameras (C), each labelled with its first image's name."""
        from raykit.cameras import Camera

        first = np.unique(self.camera_index, return_index=True)[1]
        return [
            Camera(model=m, width=w, height=h, params=p, camera_id=c, label=f"image {self.names[i]}")
            for (m, w, h, p, c), i in zip(self.camera_keys, first, strict=True)
        ]

    @property
    def n_pixels(self) -> np.ndarray:
        return self.width * self.height

    @classmethod
    def from_arrow(cls, table: pa.Table) -> CameraTable:
        d = table.to_pydict()
        lookup: dict[tuple[Any, ...], int] = {}
        index = []
        for i in range(table.num_rows):
            key = (d["model"][i], d["width"][i], d["height"][i], tuple(d["params"][i]), d["camera_id"][i])
            index.append(lookup.setdefault(key, len(lookup)))

        def floats(name: str) -> np.ndarray:
            return np.array([np.nan if v is None else v for v in d[name]], dtype=np.float64)

        return cls(
            names=list(d["name"]),
            splits=list(d["split"]),
            camera_keys=list(lookup),
            camera_index=np.array(index, dtype=np.int64),
            c2w=np.array(d["c2w"], dtype=np.float64).reshape(-1, 4, 4),
            near=floats("near"),
            far=floats("far"),
            width=np.array(d["width"], dtype=np.int64),
            height=np.array(d["height"], dtype=np.int64),
            pixel_offset=np.array(d["pixel_offset"], dtype=np.int64),
            ray_start=np.array([-1 if v is None else v for v in d["ray_start"]], dtype=np.int64),
            has_alpha=np.array(d["has_alpha"], dtype=bool),
            time=floats("time") if "time" in d else None,
            rig_camera=np.array(d["camera_index"], dtype=np.int64) if "camera_index" in d else None,
            frame_index=np.array(d["frame_index"], dtype=np.int64) if "frame_index" in d else None,
        )

    def decode(self, pid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N,) uint32 pids -> (image (N,) int64, pixel (N, 2) int64 ``(x, y)``)."""
        return decode_pids(self.pixel_offset, self.width, pid)
