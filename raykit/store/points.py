"""Sparse 3-D points of a capture (COLMAP ``points3D``), stored as ``points3D.parquet``: one row per point
in point-id order, in the store's **world frame** (columns ``POINTS_SCHEMA``; docs/format.md,
"points3D.parquet"). Splatting trainers initialise their Gaussians from them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["POINTS_FILE", "POINTS_SCHEMA", "SparsePoints", "check_points", "points_digest", "points_entry"]

POINTS_FILE = "points3D.parquet"
POINTS_SCHEMA = pa.schema(
    [
        ("point_id", pa.int64()),
        ("xyz", pa.list_(pa.float64(), 3)),
        ("rgb", pa.list_(pa.uint8(), 3)),
        ("error", pa.float64()),
        ("track_length", pa.int64()),
    ]
)


@dataclass(frozen=True, eq=False)
class SparsePoints:
    """``P`` sparse points as arrays.

    Attributes:
        point_id: (P,) int64 source point ids.
        xyz: (P, 3) float64 positions.
        rgb: (P, 3) uint8 colours.
        error: (P,) float64 reprojection errors (pixels).
        track_length: (P,) int64 observations per point.
    """

    point_id: np.ndarray
    xyz: np.ndarray
    rgb: np.ndarray
    error: np.ndarray
    track_length: np.ndarray

    def __len__(self) -> int:
        return int(self.point_id.shape[0])

    def transformed(self, world_from_source: np.ndarray) -> SparsePoints:
        """The points mapped by the (4, 4) similarity ``world_from_source`` (positions only)."""
        m = np.asarray(world_from_source, dtype=np.float64)
        xyz = self.xyz @ m[:3, :3].T + m[:3, 3]
        return SparsePoints(self.point_id, xyz, self.rgb, self.error, self.track_length)

    def to_table(self) -> pa.Table:
        """The points as a table of ``POINTS_SCHEMA``."""
        n = len(self)
        xyz = pa.FixedSizeListArray.from_arrays(pa.array(self.xyz.reshape(-1), pa.float64()), 3)
        rgb = pa.FixedSizeListArray.from_arrays(pa.array(self.rgb.reshape(-1), pa.uint8()), 3)
        columns = [
            pa.array(self.point_id.reshape(n), pa.int64()),
            xyz,
            rgb,
            pa.array(self.error.reshape(n), pa.float64()),
            pa.array(self.track_length.reshape(n), pa.int64()),
        ]
        return pa.Table.from_arrays(columns, schema=POINTS_SCHEMA)

    @classmethod
    def from_table(cls, table: pa.Table) -> SparsePoints:
        """Arrays of a ``POINTS_SCHEMA`` table."""

        def fixed(name: str, dtype: Any) -> np.ndarray:
            column = table.column(name).combine_chunks()  # a list array of 3 values per row
            values = column.values.slice(
                column.offset * 3, len(column) * 3
            )  # .flatten() needs pyarrow.compute
            return np.asarray(values.to_numpy(zero_copy_only=False), dtype=dtype).reshape(-1, 3)

        return cls(
            table.column("point_id").to_numpy().astype(np.int64),
            fixed("xyz", np.float64),
            fixed("rgb", np.uint8),
            table.column("error").to_numpy().astype(np.float64),
            table.column("track_length").to_numpy().astype(np.int64),
        )


def points_digest(points: SparsePoints) -> str:
    """SHA-256 of the points' values (keys the writer's plan, so a resumed write has the same points)."""
    digest = hashlib.sha256()
    for array in (points.point_id, points.xyz, points.rgb, points.error, points.track_length):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def points_entry(points: SparsePoints) -> dict[str, Any]:
    """The manifest's ``points`` entry."""
    return {"path": POINTS_FILE, "n_points": len(points)}


def check_points(table: pa.Table, entry: dict[str, Any], where: str) -> list[str]:
    """Problems of a points table against its manifest entry (``raykit validate``), one line each."""
    points = SparsePoints.from_table(table)
    problems = []
    if len(points) != entry.get("n_points"):
        problems.append(f"{where}: expected {entry.get('n_points')} points (manifest), got {len(points)}")
    if not np.all(np.isfinite(points.xyz)):
        problems.append(f"{where}: {int((~np.isfinite(points.xyz)).any(axis=1).sum())} points are not finite")
    if np.any(points.track_length < 0) or np.any(points.error < 0):
        problems.append(f"{where}: negative track lengths or reprojection errors")
    if len(np.unique(points.point_id)) != len(points):
        problems.append(f"{where}: point ids are not unique")
    return problems
