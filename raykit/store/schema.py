"""Metadata of a ray store: format version, scene and split records, image records and pixel ids
(the capture's sparse points: ``raykit.store.points``).

Vocabulary: ``N`` rays, ``I`` images, ``C`` = 3 or 4 colour channels. A ray's pixel identity is one
``uint32`` global pixel id ``pid = pixel_offset[image] + y * W[image] + x`` where ``image`` is the row
of ``cameras.parquet`` (images ordered by split, then name) and ``pixel_offset`` is the cumulative
pixel count of the rows before it. Every split's images are therefore one contiguous pid range.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from raykit.errors import ConfigError, StoreCorruptError, StoreVersionError
from raykit.ranges import Range, range_problems
from raykit.store.spec import LAYOUTS, RAYS_LAYOUT, holds_images

if TYPE_CHECKING:
    from raykit.cameras import Camera
    from raykit.store.order import SplitOrder

__all__ = [
    "FIELD_ORDER",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_PIXELS",
    "PIDS",
    "SPLIT_ORDER",
    "DerivedRays",
    "FieldSpec",
    "FrameTime",
    "ImageRecord",
    "RawRays",
    "SceneInfo",
    "SplitInfo",
    "decode_pids",
    "encode_pids",
    "split_sort_key",
]

FORMAT_NAME = "raykit-store"
# 3: pids derived from the split's order, not stored (SplitInfo.pids); 2: chunk checksums are CRC-32C
# (index.json key "crc32c"); 1: zlib CRC-32. Every version still opens, validates, reads and copies.
FORMAT_VERSION = 3
PIDS = ("derived", "stored")  # a split's pids: computed from its order at read time, or stored
SPLIT_ORDER = ("train", "val", "test")
MAX_PIXELS = 2**32  # pids are uint32
FIELD_ORDER = ("rgba", "pid", "origins", "directions")  # storage and checksum order of fields

_IDENTITY = tuple(tuple(float(v) for v in row) for row in np.eye(4))


def split_sort_key(split: str) -> tuple[int, str]:
    """Sort key putting ``train``, ``val``, ``test`` first (in that order), then other splits by name."""
    rank = SPLIT_ORDER.index(split) if split in SPLIT_ORDER else len(SPLIT_ORDER)
    return rank, split


def _matrix4(value: Any, what: str) -> tuple[tuple[float, ...], ...]:
    array = np.asarray(value, dtype=np.float64)
    if array.shape != (4, 4) or not np.all(np.isfinite(array)):
        raise ConfigError(f"{what}: expected a finite 4x4 matrix, got shape {array.shape}")
    return tuple(tuple(float(v) for v in row) for row in array)


@dataclass(frozen=True)
class SceneInfo:
    """Where the store's world frame comes from, and the scene's extent.

    Attributes:
        world_frame: short description of the store's world frame (axes, units).
        world_from_source: (4, 4) similarity ``s * R | t`` mapping source-frame points to store-world
            points; poses in the store are ``world_from_source @ c2w_source`` with rotation columns
            renormalised (scale applies to positions only).
        transform_method: how ``world_from_source`` was chosen (e.g. ``"identity"``,
            ``"center-and-scale-cameras"``), with its parameters in ``transform_params``.
        bounds: axis-aligned scene box ``((xmin, ymin, zmin), (xmax, ymax, zmax))`` in store world, or None.
        near, far: scene-wide ray bounds when known (per-image values live in the camera table).
    """

    world_frame: str = "source"
    world_from_source: tuple[tuple[float, ...], ...] = _IDENTITY
    transform_method: str = "identity"
    transform_params: Mapping[str, Any] = field(default_factory=dict)
    bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    near: float | None = None
    far: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "world_from_source", _matrix4(self.world_from_source, "world_from_source"))
        if self.bounds is not None:
            lo, hi = (tuple(float(v) for v in corner) for corner in self.bounds)
            if len(lo) != 3 or len(hi) != 3 or any(a > b for a, b in zip(lo, hi, strict=True)):
                raise ConfigError(
                    f"scene bounds: expected ((x0,y0,z0),(x1,y1,z1)) with lo<=hi, got {self.bounds}"
                )
            object.__setattr__(self, "bounds", (lo, hi))
        for name in ("near", "far"):
            value = getattr(self, name)
            object.__setattr__(self, name, None if value is None else float(value))
        object.__setattr__(self, "transform_params", dict(self.transform_params))

    def matrix(self) -> np.ndarray:
        """(4, 4) float64 ``world_from_source``."""
        return np.array(self.world_from_source, dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        """The manifest's ``scene`` record: every attribute (tuples are JSON arrays)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SceneInfo:
        """The record ``d``; a key it lacks (or holds as null) takes its default."""
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if d.get(f.name) is not None})


@dataclass(frozen=True)
class SplitInfo:
    """One split of a store: its rays are ``pid_start .. pid_start + n_rays`` in some order.

    ``shuffled``: a seeded permutation, else image after image, row-major (docs/format.md). ``pids``:
    ``"derived"`` (format 3: computed from the order, ``raykit.store.order.SplitOrder``) or
    ``"stored"``; ``layout``: ``"rays"`` (chunks of rays) or ``"images"`` (encoded images).
    """

    name: str
    n_rays: int
    n_images: int
    chunk_rays: int
    shuffled: bool
    pid_start: int = 0
    pids: str = "stored"
    layout: str = RAYS_LAYOUT

    def __post_init__(self) -> None:
        if self.pids not in PIDS:
            raise StoreCorruptError(f"split {self.name!r}: expected pids in {PIDS}, got {self.pids!r}")
        if self.layout not in LAYOUTS:
            raise StoreVersionError(
                f"split {self.name!r}: layout {self.layout!r} is not one this raykit reads "
                f"({', '.join(LAYOUTS)})"
            )

    @property
    def n_chunks(self) -> int:
        return math.ceil(self.n_rays / self.chunk_rays)

    @property
    def holds_images(self) -> bool:
        """Whether the split stores encoded images (the images layout) rather than ray chunks."""
        return holds_images(self.layout)

    def stored_fields(self, fields: Mapping[str, FieldSpec]) -> dict[str, FieldSpec]:
        """The fields this split stores, name -> spec, in stored order: all of ``fields`` but ``pid``
        when its pids are derived (format 3)."""
        return {k: v for k, v in fields.items() if k != "pid" or self.pids == "stored"}

    def chunk_range(self, index: int) -> tuple[int, int]:
        """Ray range ``[start, stop)`` of chunk ``index`` within the split."""
        start = index * self.chunk_rays
        return start, min(start + self.chunk_rays, self.n_rays)

    def legacy_dict(self) -> dict[str, Any]:
        """The record of formats 1 and 2 (no ``pids``, ``layout``); also what the fingerprint hashes
        of a ``"rays"`` split, so a copy with or without stored pids keeps its fingerprint."""
        return {
            "name": self.name,
            "n_rays": self.n_rays,
            "n_images": self.n_images,
            "n_chunks": self.n_chunks,
            "chunk_rays": self.chunk_rays,
            "shuffled": self.shuffled,
            "pid_start": self.pid_start,
        }

    def to_dict(self) -> dict[str, Any]:
        """The manifest record (format 3)."""
        return {**self.legacy_dict(), "pids": self.pids, "layout": self.layout}

    def fingerprint_dict(self) -> dict[str, Any]:
        """What the content fingerprint hashes: the record less how the pids are kept."""
        record = self.legacy_dict()
        return {**record, "layout": self.layout} if self.holds_images else record

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SplitInfo:
        return cls(
            name=str(d["name"]),
            n_rays=int(d["n_rays"]),
            n_images=int(d["n_images"]),
            chunk_rays=int(d["chunk_rays"]),
            shuffled=bool(d["shuffled"]),
            pid_start=int(d.get("pid_start", 0)),
            pids=str(d.get("pids", "stored")),
            layout=str(d.get("layout", RAYS_LAYOUT)),
        )


TIME = Range()
"""A view's time: any finite number (D-NeRF's lie in [0, 1])."""
TIME_INDEX = Range(0, 2**31 - 1, integer=True)
"""A rig camera's or a video frame's index."""


@dataclass(frozen=True, eq=False, kw_only=True)
class FrameTime:
    """When a view was taken, for captures that move (D-NeRF, nerfstudio ``time``, multi-view video):
    the one definition of these fields, shared by a parser's ``SourceView`` and the writer's
    ``ImageRecord`` (keyword-only, after their other fields). A store keeps each as a column of its
    camera table when any view has one (then every view must).

    Attributes:
        time: the view's time (any finite number; in [0, 1] for D-NeRF), or None for a static capture.
        camera_index: the rig camera (0-based) of a multi-view video's frame, or None.
        frame_index: the frame's index in its camera's video, or None.
    """

    time: float | None = None
    camera_index: int | None = None
    frame_index: int | None = None

    def time_problems(self) -> list[str]:
        """One line per field outside its range (None is fine)."""
        ranges = {"time": TIME, "camera_index": TIME_INDEX, "frame_index": TIME_INDEX}
        return range_problems({k: (v, r) for k, r in ranges.items() if (v := getattr(self, k)) is not None})


TIME_FIELDS = tuple(f.name for f in dataclasses.fields(FrameTime))


@dataclass(frozen=True, eq=False)
class ImageRecord(FrameTime):
    """One source image handed to the writer by a converter.

    Attributes:
        name: unique image name (e.g. its path relative to the capture's image folder).
        split: split name (``train``, ``val``, ``test`` or another).
        camera: intrinsics of this image.
        c2w: (4, 4) camera-to-world, OpenCV camera axes, in the store's world frame.
        near, far: ray bounds for this image when known.
        source_path: where the pixels came from (informational; hashed when it is a local file).
        load: picklable callable returning the pixels ``uint8 (H, W, 3|4)``.
        source_sha256: hex SHA-256 of the source file when the caller already knows it.
        components: per-image components, name (``"mask"``, ``"depth"``) -> picklable callable
            returning the array at the image's size (``raykit.store.components``; written when the
            write asks for that component).
        metadata: JSON-able per-frame metadata (``RayStore.frame_metadata``).
        time, camera_index, frame_index: see :class:`FrameTime`.
    """

    name: str
    split: str
    camera: Camera
    c2w: np.ndarray
    near: float | None
    far: float | None
    source_path: str
    load: Callable[[], np.ndarray]
    source_sha256: str = ""
    components: Mapping[str, Callable[[], np.ndarray]] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FieldSpec:
    """One per-ray payload field: ``dtype`` and ``channels`` (0 for a scalar per ray)."""

    name: str
    dtype: str
    channels: int

    def shape(self, n: int) -> tuple[int, ...]:
        return (n, self.channels) if self.channels else (n,)

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "channels": self.channels}

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, Any]) -> FieldSpec:
        return cls(name=name, dtype=str(d["dtype"]), channels=int(d["channels"]))

    @staticmethod
    def parse_all(d: Mapping[str, Any], where: str) -> dict[str, FieldSpec]:
        """Manifest ``fields`` -> specs in :data:`FIELD_ORDER`; raises on unknown or missing fields."""
        unknown = sorted(set(d) - set(FIELD_ORDER))
        if unknown or "rgba" not in d or "pid" not in d:
            raise StoreCorruptError(
                f"{where}: expected fields rgba, pid [origins, directions], got {sorted(d)}"
            )
        return {name: FieldSpec.from_dict(name, d[name]) for name in FIELD_ORDER if name in d}


@dataclass
class RawRays:
    """Compact rays as stored: ``rgba`` uint8 (N, 3|4) and ``pid`` uint32 (N,) global pixel ids.

    ``extra`` holds materialised fields (``origins``, ``directions``) when the store has them.
    """

    rgba: np.ndarray
    pid: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.pid.shape[0])

    @classmethod
    def concat(cls, parts: Sequence[RawRays]) -> RawRays:
        """Concatenate ray blocks in order (all blocks must have the same fields)."""
        keys = parts[0].extra.keys()
        return cls(
            rgba=np.concatenate([p.rgba for p in parts]),
            pid=np.concatenate([p.pid for p in parts]),
            extra={k: np.concatenate([p.extra[k] for p in parts]) for k in keys},
        )

    def take(self, index: np.ndarray | slice) -> RawRays:
        """(M,) indices or a slice -> the selected rays (a slice gives views)."""
        return RawRays(self.rgba[index], self.pid[index], {k: v[index] for k, v in self.extra.items()})


class DerivedRays(RawRays):
    """One chunk of a format-3 split: colours (and materialised fields) as read, pids derived on access.

    ``pid`` is computed from the split's order (``order.pids(start, start + n)``, ``start``: the chunk's
    first ray in the split) each time it is read, and never kept: ``nbytes`` (what a loader's cache
    counts) is the colours' bytes. ``take`` returns plain ``RawRays`` with the pids of the selected rays.
    """

    def __init__(
        self, rgba: np.ndarray, order: SplitOrder, start: int, extra: dict[str, np.ndarray] | None = None
    ) -> None:
        self.rgba = rgba
        self.order = order
        self.start = int(start)
        self.extra = dict(extra or {})

    @property
    def pid(self) -> np.ndarray:
        """(N,) uint32 pids, derived."""
        return self.order.pids(self.start, self.start + len(self.rgba))

    @pid.setter
    def pid(self, value: np.ndarray) -> None:
        raise AttributeError("DerivedRays.pid is derived from the split's order; it cannot be set")

    def __len__(self) -> int:
        return int(self.rgba.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held: colours and materialised fields (the pids are not held)."""
        return int(self.rgba.nbytes) + sum(int(v.nbytes) for v in self.extra.values())

    def take(self, index: np.ndarray | slice) -> RawRays:
        if isinstance(index, slice):
            lo, hi, step = index.indices(len(self))
            if step == 1:
                hi = max(hi, lo)
                pid = self.order.pids(self.start + lo, self.start + hi)
                return RawRays(self.rgba[lo:hi], pid, {k: v[lo:hi] for k, v in self.extra.items()})
        return RawRays(self.rgba[index], self.pid[index], {k: v[index] for k, v in self.extra.items()})

    def __reduce__(self) -> tuple[Any, ...]:
        return DerivedRays, (self.rgba, self.order, self.start, self.extra)

    def __repr__(self) -> str:
        return f"DerivedRays({len(self)} rays of split {self.order.split!r} from ray {self.start})"


def encode_pids(
    pixel_offset: np.ndarray, width: np.ndarray, image: np.ndarray, pixel: np.ndarray
) -> np.ndarray:
    """Global pixel ids of pixels: (N,) uint32 ``pixel_offset[image] + y * width[image] + x`` for
    ``pixel`` (N, 2) ``(x, y)`` of images ``image`` (N,); ``pixel_offset``, ``width``: (I,) int64."""
    image = np.asarray(image, dtype=np.int64)
    pixel = np.asarray(pixel, dtype=np.int64)
    pid = pixel_offset[image] + pixel[:, 1] * width[image] + pixel[:, 0]
    return pid.astype(np.uint32)


def decode_pids(
    pixel_offset: np.ndarray, width: np.ndarray, pid: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`encode_pids`: (N,) pids -> (image (N,) int64, pixel (N, 2) int64 ``(x, y)``)."""
    pid64 = np.asarray(pid).astype(np.int64)
    image = np.searchsorted(pixel_offset, pid64, side="right") - 1
    local = pid64 - pixel_offset[image]
    w = width[image]
    pixel = np.stack([local % w, local // w], axis=1)
    return image.astype(np.int64), pixel
