"""Read a committed ray store from a local path or any fsspec URL.

Opening reads ``manifest.json`` and checks the small metadata files (camera table, chunk index, zarr
metadata) against their recorded SHA-256. Every chunk read checks the CRC-32 of the decoded rays and,
on first use of a payload file, its size; so corruption raises a ``StoreCorruptError`` naming the file
instead of returning wrong rays. ``verify=True`` also hashes every payload file up front.

Length (about 420 lines): opening, checks, chunk reads (stored or derived pids) and the per-image
reads share the store's parsed metadata; splitting them would only pass it around.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from raykit.errors import (
    StoreChangedError,
    StoreCorruptError,
    StoreError,
    StoreNotFoundError,
    StoreVersionError,
)
from raykit.rays import RayBatch, RayGenerator
from raykit.store.backend import PayloadReader, PayloadSpec, backend_named
from raykit.store.images_layout import IMAGES_LAYOUT, ImagesReader, split_layout, store_layout
from raykit.store.integrity import chunk_checksum, json_digest
from raykit.store.location import filesystem, is_url, read_errors
from raykit.store.order import TRAIN_ORDER, SplitOrder, shared_order
from raykit.store.points import SparsePoints, read_points
from raykit.store.remote import RangeFetcher
from raykit.store.schema import (
    DerivedRays,
    FieldSpec,
    RawRays,
    SceneInfo,
    SplitInfo,
    check_manifest_header,
    split_sort_key,
)
from raykit.store.table import CameraTable, ray_generator, read_camera_table

__all__ = ["RayRangeError", "RayStore", "open_store"]

_SMALL = ("cameras.parquet", "index.json")


class RayRangeError(StoreError, IndexError):
    """A split, chunk, ray range or image that the store does not have."""


def _normalise(path_or_url: str | Path) -> str:
    text = str(path_or_url)
    if is_url(text):
        return text.rstrip("/")
    return str(Path(text.removeprefix("file://")).resolve())


def open_store(path_or_url: str | Path, *, verify: bool = False) -> RayStore:
    """Open the committed store at ``path_or_url`` (a local path or an fsspec URL).

    Raises:
        StoreNotFoundError: no store there, no manifest (e.g. an incomplete write), or a missing file.
        StoreVersionError: the store was written by a newer format version.
        StoreCorruptError: a metadata file fails its checksum (or, with ``verify``, any file).
    """
    return RayStore(_normalise(path_or_url), verify=verify)


class RayStore:
    """A committed ray store. See ``docs/format.md``.

    ``backend`` is the manifest's backend name; ``payload`` the backend's reader
    (``raykit.store.backend.PayloadReader``: ``chunk_files``, ``read_chunk`` without checksum checks).
    """

    def __init__(self, url: str, *, verify: bool = False) -> None:
        self.url = url
        self._fs, self._root = filesystem(url)
        self.manifest: dict[str, Any] = self._read_manifest()
        self._checked: set[str] = set()
        try:
            self._parse_manifest()
            small = {rel: self.read_verified(rel) for rel in self._metadata_files()}
            self.cameras: pa.Table = read_camera_table(
                small["cameras.parquet"], self._where("cameras.parquet")
            )
            self.index: dict[str, Any] = json.loads(small["index.json"])
            # index key crc32c in format 2; zlib crc32 in format 1 (and in copies of format-1 stores)
            self._crc_kind = "crc32c" if all("crc32c" in self.index[k] for k in self.splits) else "crc32"
            self._crc = {k: np.asarray(self.index[k][self._crc_kind], dtype=np.int64) for k in self.splits}
            # format 3 checks stored pids apart ("pid_crc32c"); formats 1 and 2 sum every field at once
            self._pid_crc = {
                k: np.asarray(self.index[k][f"pid_{self._crc_kind}"], dtype=np.int64)
                for k, info in self.splits.items()
                if not self.legacy and info.pids == "stored"
            }
            self.chunk_checksum: str = self._crc_kind  # "crc32c" or "crc32" (``integrity.chunk_checksum``)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, StoreError):
                raise
            raise StoreCorruptError(f"{self.url}: store metadata incomplete or malformed: {exc!r}") from exc
        self.payload: PayloadReader = self._open_payload()
        self._generators: dict[str, RayGenerator] = {}
        self._orders: dict[str, SplitOrder] = {}
        if verify:
            self.verify_files()

    # -- opening -----------------------------------------------------------------------------------
    def _parse_manifest(self) -> None:
        self.backend: str = self.manifest["backend"]
        self.fields = FieldSpec.parse_all(self.manifest["fields"], self._where("manifest.json"))
        names = sorted(self.manifest["splits"], key=split_sort_key)
        self.legacy: bool = self.manifest["format_version"] <= 2  # every pid stored, one checksum
        splits = {k: SplitInfo.from_dict(self.manifest["splits"][k]) for k in names}
        if self.legacy and any(info.pids != "stored" for info in splits.values()):
            raise StoreCorruptError(f"{self._where('manifest.json')}: format 1 and 2 splits store their pids")
        self.splits = splits
        order = self.manifest["layout"].get("train_order")
        if any(i.pids == "derived" and i.shuffled for i in splits.values()) and order != TRAIN_ORDER:
            raise StoreVersionError(
                f"{self._where('manifest.json')}: train order {order!r} is not one this raykit derives "
                f"pids from ({TRAIN_ORDER!r}); upgrade raykit"
            )
        self.scene = SceneInfo.from_dict(self.manifest["scene"])
        self.fingerprint: str = self.manifest["content_fingerprint"]

    def _where(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _read_manifest(self) -> dict[str, Any]:
        where = self._where("manifest.json")
        try:
            data = self._fs.cat_file(f"{self._root}/manifest.json")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise StoreNotFoundError(self._no_manifest_message()) from exc
        except read_errors() as exc:
            raise StoreError(f"{where}: cannot read ({type(exc).__name__}: {exc})") from None
        try:
            manifest = json.loads(data)
        except ValueError as exc:
            raise StoreCorruptError(f"{where}: not valid JSON: {exc}") from exc
        if not isinstance(manifest, dict):
            raise StoreCorruptError(f"{where}: expected a JSON object, got {type(manifest).__name__}")
        check_manifest_header(manifest, where)
        body = {k: v for k, v in manifest.items() if k != "manifest_digest"}
        if manifest.get("manifest_digest") != json_digest(body):
            raise StoreCorruptError(f"{where}: manifest_digest does not match the manifest's content")
        return manifest

    def _no_manifest_message(self) -> str:
        if self.url.endswith(".partial") or self._fs.exists(f"{self._root}.partial"):
            return f"incomplete store (an interrupted write; rerun it to resume): {self.url}"
        if not self._fs.exists(self._root):
            return f"no such store: {self.url}"
        if self._fs.isfile(self._root):
            return f"not a raykit store: {self.url} is a file (a store is a folder holding manifest.json)"
        return f"not a raykit store (no manifest.json): {self.url}"

    def _metadata_files(self) -> list[str]:
        return [rel for rel in self.manifest["files"] if rel in _SMALL or rel.endswith("zarr.json")]

    def _manifest_entry(self, rel: str) -> dict[str, Any]:
        """The manifest's size and checksum record of file ``rel``."""
        expected = self.manifest["files"].get(rel)
        if expected is None:
            raise StoreCorruptError(f"{self._where('manifest.json')}: expected an entry for {rel}, not found")
        return dict(expected)

    def read_verified(self, rel: str) -> bytes:
        """Bytes of file ``rel`` (relative to the store) after checking its size and SHA-256."""
        expected = self._manifest_entry(rel)
        try:
            data = self._fs.cat_file(f"{self._root}/{rel}")
        except FileNotFoundError as exc:
            raise StoreNotFoundError(f"{self._where(rel)}: file missing") from exc
        if len(data) != expected["size"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
            raise StoreCorruptError(
                f"{self._where(rel)}: checksum mismatch (expected {expected['size']} bytes with sha256 "
                f"{expected['sha256'][:12]}..., got {len(data)} bytes with sha256 "
                f"{hashlib.sha256(data).hexdigest()[:12]}...)"
            )
        self._checked.add(rel)
        return bytes(data)

    def _open_payload(self) -> PayloadReader:
        try:
            backend = backend_named(self.backend)
        except KeyError:
            raise StoreCorruptError(
                f"{self._where('manifest.json')}: unknown backend {self.backend!r}"
            ) from None
        ranges = None
        if "://" in self.url and not self.url.startswith("file://"):  # remote: honest byte ranges
            sizes = {rel: int(entry["size"]) for rel, entry in self.manifest["files"].items()}
            ranges = RangeFetcher(self._fs, self._root, self.url, sizes)
        self.payload_spec = PayloadSpec.of(self.fields, self.manifest["layout"], self.splits)
        if store_layout(self.manifest) == IMAGES_LAYOUT:  # encoded images (raykit.store.images_layout)
            return ImagesReader(self.url, self.backend, self.manifest["layout"], self.index, ranges,
                                self._ray_starts())  # fmt: skip
        return backend.open_reader(self.url, self.payload_spec, self.index, ranges)

    def _ray_starts(self) -> dict[str, list[int]]:
        table = self.table
        out = {}
        for split, info in self.splits.items():
            rows = [i for i, s in enumerate(table.splits) if s == split]
            out[split] = [int(table.ray_start[i]) for i in rows] + [info.n_rays]
        return out

    def layout(self, split: str) -> str:
        """``"rays"`` or ``"images"``: how ``split`` is stored (docs/format.md)."""
        self._split(split)
        return split_layout(self.manifest, split)

    def _check_file(self, rel: str) -> None:
        if rel in self._checked:
            return
        expected = self._manifest_entry(rel)
        try:
            size = self._fs.size(f"{self._root}/{rel}")
        except FileNotFoundError as exc:
            raise StoreNotFoundError(f"{self._where(rel)}: payload file missing") from exc
        if size != expected["size"]:
            raise StoreCorruptError(
                f"{self._where(rel)}: expected {expected['size']} bytes, got {size} (truncated?)"
            )
        self._checked.add(rel)

    def verify_files(self) -> None:
        """Hash every file listed in the manifest; raise on the first mismatch."""
        for rel in self.manifest["files"]:
            self.read_verified(rel)

    # -- metadata ----------------------------------------------------------------------------------
    @property
    def world_from_source(self) -> np.ndarray:
        """(4, 4) similarity from the source frame to the store's world frame."""
        return self.scene.matrix()

    @cached_property
    def table(self) -> CameraTable:
        """The camera table as numpy arrays and ``Camera`` objects."""
        return CameraTable.from_arrow(self.cameras)

    @cached_property
    def points(self) -> pa.Table | None:
        """The capture's sparse 3-D points (``raykit.store.points``: ``point_id``, ``xyz`` in the
        store's world frame, ``rgb``, ``error``, ``track_length``), or None when the store has none.

        Read on first use and checked against the manifest's SHA-256.
        """
        entry = self.manifest.get("points")
        if entry is None:
            return None
        rel = str(entry["path"])
        return read_points(self.read_verified(rel), self._where(rel))

    def sparse_points(self) -> SparsePoints | None:
        """``points`` as numpy arrays, or None."""
        table = self.points
        return None if table is None else SparsePoints.from_table(table)

    def images(self, split: str) -> list[str]:
        """Names of ``split``'s images in table (pid) order."""
        self._split(split)
        return [n for n, s in zip(self.table.names, self.table.splits, strict=True) if s == split]

    def _split(self, split: str) -> SplitInfo:
        if split not in self.splits:
            raise RayRangeError(f"{self.url}: no split {split!r}; expected one of {sorted(self.splits)}")
        return self.splits[split]

    # -- raw reads ---------------------------------------------------------------------------------
    def read_chunk(self, split: str, index: int) -> RawRays:
        """Chunk ``index`` of ``split``, checked against its recorded CRC-32.

        Raises:
            StoreChangedError: the read failed because the store was replaced since it was opened
                (``convert --overwrite``): chunks of two versions are never mixed.
        """
        try:
            return self._read_chunk(split, index)
        except (StoreCorruptError, StoreNotFoundError) as exc:
            self._raise_if_replaced(exc)
            raise

    def _raise_if_replaced(self, exc: Exception) -> None:
        """Raise ``StoreChangedError`` (from ``exc``) if the manifest on disk is not the one opened."""
        try:
            now = json.loads(self._fs.cat_file(f"{self._root}/manifest.json")).get("content_fingerprint")
        except (OSError, ValueError):
            now = None  # gone or half replaced: changed as well
        if now != self.fingerprint:
            raise StoreChangedError(
                f"{self.url}: the store was replaced while being read (opened with fingerprint "
                f"{self.fingerprint[:12]}..., now {str(now)[:12]}...); reopen it to read the new "
                f"version ({exc})"
            ) from exc

    def _read_chunk(self, split: str, index: int) -> RawRays:
        info = self._split(split)
        if not 0 <= index < info.n_chunks:
            raise RayRangeError(f"{self.url}: chunk {index} of split {split!r} outside [0, {info.n_chunks})")
        if self.layout(split) == IMAGES_LAYOUT:  # decoded from the stored images
            from raykit.store import images_read

            return images_read.read_rays(self, split, *info.chunk_range(index))
        files = self.payload.chunk_files(split, index)
        for rel in files:
            self._check_file(rel)
        values = self.payload.read_chunk(info, index)
        summed = [k for k in self.fields if k in values and (self.legacy or k != "pid")]
        self._check_crc(files[0], split, index, chunk_checksum(values, summed, self._crc_kind), self._crc)
        extra = {k: v for k, v in values.items() if k not in ("rgba", "pid")}
        if info.pids == "derived":
            return DerivedRays(values["rgba"], self.split_order(split), info.chunk_range(index)[0], extra)
        if not self.legacy:
            crc = chunk_checksum(values, ["pid"], self._crc_kind)
            pid_file = next((rel for rel in files if "/pid/" in rel), files[0])
            self._check_crc(pid_file, split, index, crc, self._pid_crc, "pid ")
        return RawRays(values["rgba"], values["pid"], extra)

    def _check_crc(
        self, rel: str, split: str, index: int, crc: int, expected: dict[str, np.ndarray], what: str = ""
    ) -> None:
        if crc != expected[split][index]:
            raise StoreCorruptError(
                f"{self._where(rel)}: chunk {index} of split {split!r} fails its {what}checksum "
                f"(expected {self._crc_kind} {int(expected[split][index]):08x}, got {crc:08x})"
            )

    def split_order(self, split: str) -> SplitOrder:
        """The order of ``split``: it derives the split's pids (``SplitOrder.pids``, ``pids_torch``)."""
        info = self._split(split)
        order = self._orders.get(split)
        if order is None:
            rows = [i for i, s in enumerate(self.table.splits) if s == split]
            order = self._orders[split] = shared_order(
                int(self.manifest["layout"]["seed"]), split, info.shuffled, tuple(rows),
                tuple(int(self.table.n_pixels[i]) for i in rows),
                tuple(int(self.table.pixel_offset[i]) for i in rows),
            )  # fmt: skip
        return order

    def read(self, split: str, start: int, stop: int) -> RawRays:
        """Rays ``[start, stop)`` of ``split`` in stored order."""
        info = self._split(split)
        if not 0 <= start <= stop <= info.n_rays:
            raise RayRangeError(
                f"{self.url}: rays [{start}, {stop}) of split {split!r} outside [0, {info.n_rays}]"
            )
        if start == stop:
            return self._empty()
        first, last = start // info.chunk_rays, (stop - 1) // info.chunk_rays
        raw = RawRays.concat([self.read_chunk(split, i) for i in range(first, last + 1)])
        offset = first * info.chunk_rays
        return raw.take(slice(start - offset, stop - offset))

    def _empty(self) -> RawRays:
        c = self.fields["rgba"].channels
        extra = {
            k: np.zeros((0, 3), dtype=s.dtype) for k, s in self.fields.items() if k not in ("rgba", "pid")
        }
        return RawRays(np.zeros((0, c), np.uint8), np.zeros(0, np.uint32), extra)

    # -- rays --------------------------------------------------------------------------------------
    def decode_pids(self, pid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N,) uint32 pids -> ``(image (N,) int64, pixel (N, 2) int64 (x, y))``."""
        return self.table.decode(pid)

    def ray_generator(self, device: torch.device | str = "cpu") -> RayGenerator:
        """A ``raykit.rays.RayGenerator`` for this store's images on ``device`` (memoised)."""
        key = str(torch.device(device))
        if key not in self._generators:
            self._generators[key] = ray_generator(
                self.table, device, near=self.scene.near, far=self.scene.far
            )
        return self._generators[key]

    def to_batch(self, raw: RawRays, device: torch.device | str = "cpu") -> RayBatch:
        """Generate a ``RayBatch`` on ``device`` from compact rays."""
        generator = self.ray_generator(device)
        pid = torch.from_numpy(raw.pid.astype(np.int64))
        image, pixel, rays = generator.generate_from_pids(pid)
        colour = torch.from_numpy(np.ascontiguousarray(raw.rgba)).to(generator.device)
        extra = {
            k: torch.from_numpy(np.ascontiguousarray(v)).to(generator.device) for k, v in raw.extra.items()
        }
        return RayBatch.from_rays(colour, image, pixel, rays, extra)

    def image_index(self, name: str) -> int:
        """Row of image ``name`` in the camera table."""
        try:
            return self.table.names.index(name)
        except ValueError:
            raise RayRangeError(f"{self.url}: no image named {name!r}") from None

    def image_raw(self, name: str) -> RawRays:
        """Compact rays of every pixel of image ``name`` in row-major order.

        Evaluation splits read one contiguous range; a shuffled split is scanned chunk by chunk.
        """
        i = self.image_index(name)
        if self.layout(self.table.splits[i]) == IMAGES_LAYOUT:  # one stored image, decoded
            from raykit.store import images_read

            return images_read.image_raw(self, name)
        split, start = self.table.splits[i], int(self.table.ray_start[i])
        n = int(self.table.n_pixels[i])
        if start >= 0:
            return self.read(split, start, start + n)
        lo = int(self.table.pixel_offset[i])
        parts = []
        for c in range(self.splits[split].n_chunks):
            raw = self.read_chunk(split, c)
            parts.append(raw.take(np.flatnonzero((raw.pid >= lo) & (raw.pid < lo + n))))
        raw = RawRays.concat(parts)
        return raw.take(np.argsort(raw.pid, kind="stable"))

    def image_shape(self, name: str) -> tuple[int, int, int]:
        """``(height, width, channels)`` of image ``name`` as ``read_image`` returns it."""
        i = self.image_index(name)
        return int(self.table.height[i]), int(self.table.width[i]), self.rgba_channels

    @property
    def rgba_channels(self) -> int:
        """Colour channels every image of this store is served with (3 = rgb, 4 = rgba)."""
        return int(self.fields["rgba"].channels)

    def read_image(self, name: str) -> np.ndarray:
        """The pixels of image ``name``: (H, W, C) uint8, C = ``rgba_channels``.

        The one way every loader reads a whole image, whatever the store's layout: a ray-layout store
        gathers the image's rays (``image_raw``); an images-layout store decodes the stored file.
        """
        h, w, c = self.image_shape(name)
        if self.layout(self.table.splits[self.image_index(name)]) == IMAGES_LAYOUT:
            from raykit.store import images_read

            return images_read.read_image(self, name)
        raw = self.image_raw(name)
        return np.ascontiguousarray(raw.rgba[:, :c]).reshape(h, w, c)

    def image_rays(self, name: str, device: torch.device | str = "cpu") -> RayBatch:
        """``RayBatch`` of every pixel of image ``name`` in row-major order, on ``device``."""
        return self.to_batch(self.image_raw(name), device)

    @property
    def files(self) -> Mapping[str, Any]:
        return self.manifest["files"]

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Pickle as its location: unpickling reopens the store (worker processes, dask tasks)."""
        return open_store, (self.url,)

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}: {v.n_rays} rays" for k, v in self.splits.items())
        return f"RayStore({self.url!r}, backend={self.backend!r}, {counts})"
