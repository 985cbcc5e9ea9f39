"""Per-image components of a store: masks and depth maps (docs/format.md, "Components"), and the
per-frame metadata beside them.

A component holds one array per image of the camera table, at the image's stored size: a mask
``uint8 (H, W)`` (0 = pixel not used; stored as 1 bit a pixel, ``np.packbits`` of ``mask > 0`` along
rows, or as 8 bits) or a depth map ``float32 (H, W)`` (0 = unknown; stored as float16 or float32, in
metres when ``unit`` is ``"m"``). Each image's array is one ``.npy`` file's bytes (C order, no pickle),
the same bytes in both backends and both layouts:

* zarr: per split, the split's arrays end to end in the sharded ``uint8`` array
  ``zarr/{split}/{component}`` (inner chunks of 64 KiB, ``bytes`` + ``crc32c``, shards of 64 MiB),
  each one's first byte in ``zarr/{split}/{component}_offsets``, as the images layout stores images;
* wds: tars ``wds/{component}/{split}-{shard:06d}.tar`` of members ``{split}_{i:08d}.{component}.npy``
  (``i``: the image's index in its split), closed once they hold 64 MiB.

``index-{component}.json`` records per split each array's size and CRC-32C (checked on every read)
and where it lies (zarr ``offset``; wds ``shard``, ``member``); the manifest's ``components`` key
describes each component (``ComponentInfo``) and ``files`` lists every file with its SHA-256. Writing
one (``write_component``) writes only its own files, each atomically, and the caller rewrites the
manifest last (``raykit.store.write.add_component``: an existing store; ``raykit.store.write.commit``:
a new one).
Per-frame metadata (``frames.json``: image name -> JSON object) is optional likewise.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from raykit.errors import ConfigError, RayRangeError, SourceError, StoreCorruptError
from raykit.fileio import atomic_write_json
from raykit.imagedecode import downscale_nearest
from raykit.ordered import in_order
from raykit.store.backends import (
    Backend,
    backend_named,
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
from raykit.store.files import file_record, json_digest, write_files
from raykit.store.schema import ImageRecord

__all__ = [
    "COMPONENTS",
    "COMPONENT_DTYPES",
    "FRAMES_FILE",
    "ComponentInfo",
    "ComponentReader",
    "component_files",
    "decode_component",
    "encode_component",
    "stored_size",
    "write_component",
    "write_extras",
]

COMPONENTS = ("mask", "depth")
COMPONENT_DTYPES = {"mask": ("bit", "uint8"), "depth": ("float16", "float32")}
DEFAULT_DTYPES = {"mask": "bit", "depth": "float32"}
UNITS = ("", "m")
FRAMES_FILE = "frames.json"


@dataclass(frozen=True)
class ComponentInfo:
    """One component of a store (the manifest's ``components`` record).

    Attributes:
        name: ``"mask"`` or ``"depth"``.
        dtype: mask ``"bit"`` (1 bit a pixel: 0 or 255 when read) or ``"uint8"``; depth ``"float16"``
            or ``"float32"``.
        unit: ``"m"`` when depths are in metres, else ``""`` (unknown scale; masks: ``""``).
        scale: the factor applied to the source values when written (e.g. nerfstudio's
            ``depth_unit_scale_factor``, 1e-3 for millimetre PNGs).
        index: the relative path of its ``index-{name}.json``.
        n_images: images it covers (every image of the camera table).
        stored_bytes: the bytes of its per-image arrays (``.npy``) in all.
        fingerprint: SHA-256 over its name, dtype, unit and every image's CRC-32C in table order.
        source: where it came from (JSON-able description).
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
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "scale", float(self.scale))
        object.__setattr__(self, "index", self.index or f"index-{self.name}.json")
        object.__setattr__(self, "source", dict(self.source))

    def to_dict(self) -> dict[str, Any]:
        """The manifest record: every attribute but the name (its key)."""
        return {k: v for k, v in asdict(self).items() if k != "name"}

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


def _stored_form(info: ComponentInfo, height: int, width: int) -> tuple[np.dtype[Any], tuple[int, int]]:
    """The dtype and shape of the ``.npy`` stored for an image of ``(height, width)``."""
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


# -- the payload of one component -----------------------------------------------------------------------


def write_component(
    root: Path,
    backend: str,
    info: ComponentInfo,
    images: Sequence[tuple[str, str, int, int]],
    load: Callable[[int], np.ndarray],
    progress: Callable[[Iterable[Any]], Iterable[Any]] = iter,
) -> tuple[ComponentInfo, dict[str, dict[str, Any]]]:
    """Write component ``info`` of the store at ``root`` (its files only, each atomically; the caller
    writes the manifest last), each split's arrays laid out by the ``backend`` as the images layout's
    images are (``raykit.store.backends.Blobs``), one shard held at a time.

    Args:
        backend: ``"zarr"`` or ``"wds"``.
        images: per camera-table row, ``(name, split, height, width)``.
        load: ``load(row)`` -> the row's array at its stored size (``encode_component``'s input);
            called on a few threads, the arrays written in row order (the bytes do not depend on it).
        progress: wraps the iterator of written rows (a progress bar).

    Returns:
        ``info`` completed (index path, counts, fingerprint) and the records of the files written
        (relative path -> ``{size, sha256}``), its index file included.

    Raises:
        SourceError: an array of the wrong size or values (one line naming the image).
    """

    def encoded(row: int) -> bytes:  # on a thread: decoding files and numpy release the GIL
        name, _, height, width = images[row]
        values = np.asarray(load(row))
        if values.shape[:2] != (height, width):
            shape = f"{values.shape[1]}x{values.shape[0]}" if values.ndim >= 2 else str(values.shape)
            raise SourceError(f"image {name!r}: {info.name} is {shape}, expected {width}x{height}")
        return encode_component(info, values, f"image {name!r}")

    store, blobs = backend_named(backend), component_blobs(info.name)
    files: dict[str, Any] = {}

    index: dict[str, Any] = {}
    splits: dict[str, list[int]] = {}  # each split's rows: one run of the table
    for row, (_, split, _, _) in enumerate(images):
        splits.setdefault(split, []).append(row)
    threads = max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(threads, "raykit-component") as pool:
        arrays = iter(progress(in_order(pool, encoded, range(len(images)), 2 * threads)))
        for split, rows in splits.items():
            sizes = [stored_size(info, images[r][2], images[r][3]) for r in rows]
            shards, planned, metadata = store.plan_blobs(blobs, split, sizes)
            entry = index[split] = {"bytes": sizes, "crc32c": [], **planned}
            held: dict[int, bytes] = {}  # split-local index -> bytes, for the shards to come
            for shard in shards:
                while len(entry["crc32c"]) <= shard.images[-1]:
                    _, data = next(arrays)
                    i = len(entry["crc32c"])
                    if len(data) != sizes[i]:
                        raise ValueError(f"component {info.name}: {len(data)} bytes, expected {sizes[i]}")
                    entry["crc32c"].append(int(google_crc32c.value(data)))
                    held[i] = data
                items = [(held[i], f"{info.name}.npy", None) for i in shard.images]
                rel, data, entries = store.encode_blobs(blobs, split, shard, items)
                write_files(root, {rel: data}, files)
                for key, values in entries.items():
                    entry.setdefault(key, []).extend(values)
                held = {shard.images[-1]: held[shard.images[-1]]}  # it may run into the next shard
            write_files(root, metadata, files)
    atomic_write_json(root / info.index, index)
    files[info.index] = file_record(root / info.index)
    crcs = [crc for split in index for crc in index[split]["crc32c"]]
    stored = sum(n for split in index for n in index[split]["bytes"])
    fingerprint = json_digest({"name": info.name, "dtype": info.dtype, "unit": info.unit, "crc32c": crcs})
    done = replace(info, n_images=len(images), stored_bytes=stored, fingerprint=fingerprint)
    return done, dict(files)


def write_extras(
    partial: Path,
    table: Any,
    backend: str,
    records: Sequence[ImageRecord],
    components: Sequence[ComponentInfo],
    extras_from: Any,
    files: dict[str, Any],
) -> dict[str, Any]:
    """Write the ``components`` of ``records`` and their per-frame metadata into ``partial`` (or, for a
    copy, those of the ``RayStore`` ``extras_from``); their file records go into ``files``. ``table``: the
    camera table written. Returns the manifest keys that describe them (none when there are none:
    such a store's bytes are those of a store without)."""
    names = table.column("name").to_pylist()
    columns = ("split", "height", "width")
    rows = zip(names, *(table.column(k).to_pylist() for k in columns), strict=True)
    images = [(n, s, int(h), int(w)) for n, s, h, w in rows]
    src = extras_from
    wanted = (
        list(components)
        if src is None
        else [dataclasses.replace(i, index="") for i in src.components.values()]
    )
    by_name = {r.name: r for r in records}
    extra: dict[str, Any] = {}
    for info in wanted:
        if src is not None:
            load = functools.partial(_copied_component, src, info.name, names)
        else:
            missing = [n for n in names if info.name not in by_name[n].components]
            if missing:
                raise SourceError(
                    f"image {missing[0]!r}: no {info.name} ({len(missing)} of {len(names)} images have none)"
                )
            load = functools.partial(_record_component, by_name, info.name, names)
        done, written = write_component(partial, backend, info, images, load)
        files.update(written)
        extra.setdefault("components", {})[info.name] = done.to_dict()
    if src is not None:
        frames = {n: src.frame_metadata(n) for n in names}
    else:
        frames = {n: dict(by_name[n].metadata) for n in names if n in by_name}
    frames = {k: v for k, v in frames.items() if v}
    if frames:
        atomic_write_json(partial / FRAMES_FILE, frames)
        files[FRAMES_FILE] = file_record(partial / FRAMES_FILE)
        extra["frame_metadata"] = {"path": FRAMES_FILE, "n_frames": len(frames)}
    return extra


def _record_component(records: Mapping[str, ImageRecord], name: str, names: Sequence[str], row: int) -> Any:
    return records[names[row]].components[name]()


def _copied_component(store: Any, name: str, names: Sequence[str], row: int) -> Any:
    return store.read_component(name, names[row])
