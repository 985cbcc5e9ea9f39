"""Per-image components of a store: masks, depth maps and DyNeRF's temporal weights (docs/format.md,
"Components"), and the per-frame metadata beside them.

A component holds one array per image of the camera table, at the image's stored size: a mask
``uint8 (H, W)`` (0 = pixel not used; stored as 1 bit a pixel, ``np.packbits`` of ``mask > 0`` along
rows, or as 8 bits), a depth map ``float32 (H, W)`` (0 = unknown; stored as float16 or float32, in
metres when ``unit`` is ``"m"``) or a temporal weight map ``isg``/``ist`` ``float16 (H // factor,
W // factor)`` (``raykit.temporal_weights``: level ``factor`` of the image, ``factor`` recorded).
Each image's array is one ``.npy`` file's bytes (C order, no pickle), the same bytes in both backends
and both layouts:

* zarr: per split, the split's arrays end to end in the sharded ``uint8`` array
  ``zarr/{split}/{component}`` (inner chunks of 64 KiB, ``bytes`` + ``crc32c``, shards of 64 MiB),
  each one's first byte in ``zarr/{split}/{component}_offsets``, as the images layout stores images;
* wds: tars ``wds/{component}/{split}-{shard:06d}.tar`` of members ``{split}_{i:08d}.{component}.npy``
  (``i``: the image's index in its split), closed once they hold 64 MiB.

``index-{component}.json`` records per split each array's size and CRC-32C (checked on every read)
and where it lies (zarr ``offset``; wds ``shard``, ``member``); the manifest's ``components`` key
describes each component (``ComponentInfo``) and ``files`` lists every file with its SHA-256. Writing
one (``raykit.store.write.components``) writes only its own files, each atomically, and the caller
rewrites the manifest last (``raykit.store.write.add_component``: an existing store;
``raykit.store.write.commit``: a new one).
Per-frame metadata (``frames.json``: image name -> JSON object) is optional likewise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from raykit.errors import ConfigError, RayRangeError, SourceError, StoreCorruptError
from raykit.imagedecode import downscale_nearest
from raykit.store.backends import (
    Backend,
    component_blobs,
    held_first,
    join_parts,
    npy_bytes,
    npy_header,
    npy_values,
    read_blob,
    read_blobs,
)
from raykit.store.byteview import StoreView

__all__ = [
    "COMPONENTS",
    "COMPONENT_DTYPES",
    "FRAMES_FILE",
    "ComponentInfo",
    "ComponentReader",
    "component_files",
    "component_shape",
    "decode_component",
    "encode_component",
    "stored_size",
]

COMPONENTS = ("mask", "depth", "isg", "ist")
WEIGHTS = ("isg", "ist")  # DyNeRF's temporal weights: float16 at level ``factor`` of the image
COMPONENT_DTYPES = {"mask": ("bit", "uint8"), "depth": ("float16", "float32"), "isg": ("float16",),
                    "ist": ("float16",)}  # fmt: skip
DEFAULT_DTYPES = {"mask": "bit", "depth": "float32", "isg": "float16", "ist": "float16"}
UNITS = ("", "m")
FRAMES_FILE = "frames.json"


@dataclass(frozen=True)
class ComponentInfo:
    """One component of a store (the manifest's ``components`` record).

    Attributes:
        name: ``"mask"``, ``"depth"``, ``"isg"`` or ``"ist"``.
        dtype: mask ``"bit"`` (1 bit a pixel: 0 or 255 when read) or ``"uint8"``; depth ``"float16"``
            or ``"float32"``.
        unit: ``"m"`` when depths are in metres, else ``""`` (unknown scale; masks: ``""``).
        scale: the factor applied to the source values when written (e.g. nerfstudio's
            ``depth_unit_scale_factor``, 1e-3 for millimetre PNGs).
        index: the relative path of its ``index-{name}.json``.
        n_images: images it covers (every image of the camera table).
        stored_bytes: the bytes of its per-image arrays (``.npy``) in all.
        fingerprint: SHA-256 over its name, dtype, unit and every image's CRC-32C in table order.
        source: where it came from (JSON-able description; the temporal weights' options).
        factor: the arrays' level (``isg``/``ist``: each pixel a ``factor`` x ``factor`` block of its
            image; masks and depth: 1, the image's size).
    """

    name: str
    dtype: str = ""
    unit: str = ""
    scale: float = 1.0
    index: str = ""
    n_images: int = 0
    stored_bytes: int = 0
    fingerprint: str = ""
    source: Mapping[str, Any] = field(default_factory=dict)
    factor: int = 1

    def __post_init__(self) -> None:
        if self.name not in COMPONENTS:
            raise ConfigError(f"component: expected one of {', '.join(COMPONENTS)}, got {self.name!r}")
        dtype = self.dtype or DEFAULT_DTYPES[self.name]
        if dtype not in COMPONENT_DTYPES[self.name]:
            raise ConfigError(
                f"component {self.name}: expected dtype in "
                f"{', '.join(COMPONENT_DTYPES[self.name])}, got {dtype!r}"
            )
        if self.unit not in UNITS or (self.name == "mask" and self.unit):
            raise ConfigError(f"component {self.name}: expected unit 'm' (depth) or '', got {self.unit!r}")
        if not (isinstance(self.scale, int | float) and math.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(f"component {self.name}: expected a finite scale > 0, got {self.scale!r}")
        levels = range(1, 65) if self.name in WEIGHTS else (1,)
        if type(self.factor) is not int or self.factor not in levels:
            raise ConfigError(
                f"component {self.name}: expected a level factor in {levels}, got {self.factor!r}"
            )
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "scale", float(self.scale))
        object.__setattr__(self, "index", self.index or f"index-{self.name}.json")
        object.__setattr__(self, "source", dict(self.source))

    def to_dict(self) -> dict[str, Any]:
        """The manifest record: every attribute but the name (its key), and ``factor`` when 1."""
        return {k: v for k, v in asdict(self).items() if k != "name" and (k, v) != ("factor", 1)}

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, Any], where: str) -> ComponentInfo:
        try:
            return cls(
                name=name,
                dtype=str(d["dtype"]),
                unit=str(d.get("unit", "")),
                scale=float(d.get("scale", 1.0)),
                index=str(d["index"]),
                n_images=int(d["n_images"]),
                stored_bytes=int(d.get("stored_bytes", 0)),
                fingerprint=str(d["fingerprint"]),
                source=dict(d.get("source") or {}),
                factor=int(d.get("factor", 1)),
            )
        except (ConfigError, KeyError, TypeError, ValueError) as exc:
            raise StoreCorruptError(f"{where}: component {name!r}: malformed record ({exc})") from None


def component_files(files: Iterable[str]) -> set[str]:
    """The files of ``files`` (relative paths) that belong to components, whatever the backend."""
    found = set()
    for rel in files:
        parts = rel.split("/")
        index = rel.startswith("index-") and rel.removeprefix("index-").removesuffix(".json") in COMPONENTS
        zarr = len(parts) >= 3 and parts[0] == "zarr" and parts[2].removesuffix("_offsets") in COMPONENTS
        wds = len(parts) == 3 and parts[0] == "wds" and parts[1] in COMPONENTS
        if index or zarr or wds:
            found.add(rel)
    return found


# -- one image's array ---------------------------------------------------------------------------------


def encode_component(info: ComponentInfo, values: np.ndarray, where: str) -> bytes:
    """The stored bytes of one image's component: ``values`` (H, W) (mask: any integer or bool type,
    0 = not used; depth: float, 0 = unknown, NaN and inf also unknown) as an ``.npy`` of ``info.dtype``.

    Raises:
        SourceError: not 2-D, or a negative depth (naming ``where``).
    """
    values = np.asarray(values)
    if values.ndim != 2:
        raise SourceError(f"{where}: expected a single-channel {info.name} (H, W), got shape {values.shape}")
    if info.name in WEIGHTS:
        weights = np.asarray(values, dtype=np.float16)
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise SourceError(f"{where}: {info.name} weights must be finite and >= 0")
        return npy_bytes(weights)
    if info.name == "mask":
        if info.dtype == "bit":
            return npy_bytes(np.packbits(values > 0, axis=1))
        return npy_bytes(np.clip(values, 0, 255).astype(np.uint8) if values.dtype != np.uint8 else values)
    depth = np.asarray(values, dtype=np.float32)
    depth = np.where(np.isfinite(depth), depth, np.float32(0))
    if (depth < 0).any():
        raise SourceError(f"{where}: negative depth values (min {float(depth.min()):.4g}); expected >= 0")
    if info.dtype == "float16" and depth.size and float(depth.max()) > float(np.finfo(np.float16).max):
        raise SourceError(f"{where}: depth {float(depth.max()):.6g} exceeds float16's range; store float32")
    return npy_bytes(depth.astype(info.dtype))


def component_shape(info: ComponentInfo, height: int, width: int) -> tuple[int, int]:
    """The (rows, columns) of component ``info``'s array of an image of ``(height, width)``."""
    return height // info.factor, width // info.factor


def _stored_form(info: ComponentInfo, height: int, width: int) -> tuple[np.dtype[Any], tuple[int, int]]:
    """The dtype and shape of the ``.npy`` stored for an image of ``(height, width)``."""
    height, width = component_shape(info, height, width)
    if info.dtype == "bit":
        return np.dtype(np.uint8), (height, (width + 7) // 8)
    return np.dtype(info.dtype), (height, width)


def stored_size(info: ComponentInfo, height: int, width: int) -> int:
    """Bytes of the ``.npy`` stored for an image of ``(height, width)`` (``encode_component``'s)."""
    dtype, shape = _stored_form(info, height, width)
    return len(npy_header(dtype.str, shape)) + shape[0] * shape[1] * dtype.itemsize


def decode_component(info: ComponentInfo, data: bytes, height: int, width: int, where: str) -> np.ndarray:
    """Stored bytes -> mask ``uint8 (H, W)`` (a 1-bit mask as 0/255) or depth ``float32 (H, W)``.

    The ``.npy`` header is checked against the expected dtype and shape before anything is loaded: a
    received store's header claiming a huge shape is an error, not an allocation.

    Raises:
        StoreCorruptError: not an ``.npy`` of the expected dtype and shape (one line naming ``where``).
    """
    dtype, shape = _stored_form(info, height, width)
    values = npy_values(data, dtype, shape, info.name, where)
    if info.dtype == "bit":
        return np.unpackbits(values, axis=1, count=width) * np.uint8(255)
    return values.astype(np.float32) if info.name == "depth" else values.copy()


# -- reading -------------------------------------------------------------------------------------------


class ComponentReader:
    """A committed store's components and per-frame metadata, read through its ``view`` (``backend``:
    the manifest's; ``manifest``: its ``components`` and ``frame_metadata`` records; ``read_json``:
    a checked JSON file of the store, ``raykit.store.byteview.StoreBytes.read_json``)."""

    def __init__(
        self, view: StoreView, backend: Backend, manifest: Mapping[str, Any], read_json: Callable[[str], Any]
    ) -> None:
        self.view, self.backend, self._manifest, self._read_json = view, backend, manifest, read_json
        self._indices: dict[str, dict[str, Any]] = {}

    @cached_property
    def components(self) -> dict[str, ComponentInfo]:
        """Name (``"mask"``, ``"depth"``) -> ``ComponentInfo``; empty when the store has none (components
        of names this raykit does not know are left out)."""
        records, where = self._manifest.get("components") or {}, f"{self.view.url}/manifest.json"
        return {k: ComponentInfo.from_dict(k, v, where) for k, v in records.items() if k in COMPONENTS}

    def _index(self, component: str) -> dict[str, Any]:
        if component not in self._indices:
            info = self.components.get(component)
            if info is None:
                have = ", ".join(self.components) or "none"
                raise RayRangeError(f"{self.view.url}: no {component!r} component (the store has: {have})")
            self._indices[component] = self._read_json(info.index)
        return self._indices[component]

    def _located(self, component: str, split: str, local: Sequence[int]) -> dict[str, Any]:
        """The split's ``index-{component}.json`` entry, once images ``local`` of it are in it."""
        entry, rows = self._index(component).get(split), self.view.rows(split)
        outside = [i for i in local if not 0 <= i < len(rows)]
        if outside:
            raise RayRangeError(f"{self.view.url}: split {split!r} has no image {outside[0]}")
        n = len(entry.get("bytes", ())) if isinstance(entry, dict) else 0
        missing = [i for i in local if i >= n]
        if missing or not isinstance(entry, dict):
            name = self.view.table.names[int(rows[missing[0]])] if missing else split
            raise StoreCorruptError(
                f"{self.view.url}/{self.components[component].index}: no entry for image {name!r}"
            )
        return entry

    def _at(self, component: str, row: int) -> tuple[str, int, dict[str, Any]]:
        """Camera-table row ``row``'s split, index in it and the split's index entry."""
        split = self.view.table.splits[row]
        local = int(np.searchsorted(self.view.rows(split), row))
        return split, local, self._located(component, split, [local])

    def files(self, component: str, row: int) -> list[str]:
        """Relative paths of the files holding component ``component`` of camera-table row ``row``."""
        split, local, entry = self._at(component, row)
        return [
            rel for rel, _, _ in self.backend.blob_ranges(component_blobs(component), split, entry, local)
        ]

    def stored(
        self, component: str, row: int, held: Mapping[str, np.ndarray] | None = None
    ) -> tuple[bytes, str]:
        """The stored bytes (an ``.npy``) of component ``component`` of camera-table row ``row``, checked
        against their CRC-32C, and the file they lie in; ``held``: files already in memory (relative
        path -> read-only uint8 array), read from there instead of the store."""
        split, local, entry = self._at(component, row)
        read, blobs = held_first(self.view.read, held), component_blobs(component)
        parts = read_blob(self.backend, blobs, read, self.view.url, split, entry, local)
        return join_parts(parts), self.files(component, row)[0]

    def _decoded(self, component: str, row: int, data: bytes, rel: str) -> np.ndarray:
        table, info = self.view.table, self.components[component]
        h, w, where = (
            int(table.height[row]),
            int(table.width[row]),
            f"{self.view.url}/{rel}: {table.names[row]!r}",
        )
        return decode_component(info, data, h, w, where)

    def read(self, component: str, row: int, downscale: int = 1) -> np.ndarray:
        """Component ``component`` of camera-table row ``row`` (``RayStore.read_component``)."""
        return downscale_nearest(self._decoded(component, row, *self.stored(component, row)), downscale)

    def read_split(
        self, component: str, split: str, local: Iterable[int]
    ) -> Iterator[tuple[int, np.ndarray]]:
        """``(i, array)`` of each image ``i`` of ``local`` (``RayStore.read_split_components``)."""
        wanted, rows = [int(i) for i in local], self.view.rows(split)
        entry, blobs = self._located(component, split, wanted), component_blobs(component)
        for i, parts in read_blobs(self.backend, blobs, self.view.read, self.view.url, split, entry, wanted):
            rel = self.backend.blob_ranges(blobs, split, entry, i)[0][0]
            yield i, self._decoded(component, int(rows[i]), join_parts(parts), rel)

    @cached_property
    def _frames(self) -> dict[str, Any]:
        return dict(self._read_json(FRAMES_FILE)) if self._manifest.get("frame_metadata") else {}

    def frame_metadata(self, name: str) -> dict[str, Any]:
        """Per-frame metadata of image ``name`` (``RayStore.frame_metadata``), ``{}`` when none."""
        return dict(self._frames.get(name) or {})
