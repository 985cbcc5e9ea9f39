"""Reading a store: ``RayStore`` (``open_store``) is its face: the manifest, the camera table and
the spec, which hands out the readers that do the reading, each through a narrow ``StoreView``
(url, checked byte ranges, index, table, spec; ``raykit.store.byteview``), never the store:

- ``reader``: the one reader of its layout (``raykit.store.layouts``): ``RaySplits`` (ray chunks,
  over the backend's ``RayChunks``) or ``ImageSplits`` (stored images);
- ``component_reader``: masks, depth and per-frame metadata (``raykit.store.components``);
- ``storage``: its files, read checked against the manifest (``raykit.store.byteview.StoreBytes``).

A committed store is read from a local path or any fsspec URL, checking what is read (docs/format.md,
"Integrity"): corruption raises a ``StoreCorruptError`` naming the file instead of returning wrong
rays; a store replaced while being read, a ``StoreChangedError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from raykit.errors import RayRangeError, StoreCorruptError, StoreError, StoreNotFoundError, StoreVersionError
from raykit.fileio import UntrustedFileError
from raykit.store.backends import backend_named
from raykit.store.byteview import StoreBytes, StoreView
from raykit.store.components import ComponentInfo, ComponentReader
from raykit.store.files import is_url, json_digest
from raykit.store.layouts import ImageSplits, RaySplits, Timed
from raykit.store.order import TRAIN_ORDER
from raykit.store.points import POINTS_SCHEMA, SparsePoints
from raykit.store.schema import (
    FieldSpec,
    RawRays,
    SceneInfo,
    SplitInfo,
    split_sort_key,
)
from raykit.store.spec import IMAGES_LAYOUT, RAYS_LAYOUT, StoreSpec
from raykit.store.table import CameraTable, read_camera_table, read_parquet

__all__ = ["RayStore", "Timed", "open_store"]

T = TypeVar("T")

_SMALL = ("cameras.parquet", "index.json")  # with the ``zarr.json`` documents: read verified at open


def open_store(path_or_url: str | Path, *, verify: bool = False) -> RayStore:
    """Open the committed store at ``path_or_url`` (a local path or an fsspec URL).

    Raises:
        StoreNotFoundError: no store there, no manifest (e.g. an incomplete write), or a missing file.
        StoreVersionError: the store was written by a newer format version.
        StoreCorruptError: a metadata file fails its checksum (or, with ``verify``, any file).
    """
    text = str(path_or_url)
    url = text.rstrip("/") if is_url(text) else str(Path(text.removeprefix("file://")).resolve())
    return RayStore(url, verify=verify)


class RayStore:
    """A committed ray store (``docs/format.md``): its ``manifest``, camera ``table`` (``table_arrow``:
    the same as read, a pyarrow table) and ``spec``, and the readers it hands out (``reader``: the one
    of its layout; ``component_reader``; ``storage``: its files). ``backend`` is the manifest's
    backend name; ``legacy``: format 1 or 2 (every pid stored, one checksum)."""

    def __init__(self, url: str, *, verify: bool = False) -> None:
        self.url = url
        self.storage = StoreBytes(url)
        self.manifest: dict[str, Any] = self.storage.manifest
        files = self.storage
        self.files: Mapping[str, Any] = files.records  # relative path -> ``{size, sha256}``
        where = files.where("manifest.json")
        try:
            self.backend: str = self.manifest["backend"]
            self.fields = FieldSpec.parse_all(self.manifest["fields"], where)
            names = sorted(self.manifest["splits"], key=split_sort_key)
            self.legacy: bool = self.manifest["format_version"] <= 2
            self.splits = {k: SplitInfo.from_dict(self.manifest["splits"][k]) for k in names}
            if self.legacy and any(info.pids != "stored" for info in self.splits.values()):
                raise StoreCorruptError(f"{where}: format 1 and 2 splits store their pids")
            # the manifest's key "layout" holds the whole spec (its name from format 1 on)
            self.spec = StoreSpec.from_dict(self.manifest["layout"], where, str(self.backend))
            derived = any(i.pids == "derived" and i.shuffled for i in self.splits.values())
            if derived and self.spec.train_order != TRAIN_ORDER:
                raise StoreVersionError(
                    f"{where}: train order {self.spec.train_order!r} is not one this raykit derives "
                    f"pids from ({TRAIN_ORDER!r}); upgrade raykit"
                )
            self.scene = SceneInfo.from_dict(self.manifest["scene"])
            self.fingerprint: str = self.manifest["content_fingerprint"]
            # the small files, verified: cameras.parquet, index.json, zarr.json (the zarr reader's)
            small = self.metadata = {
                rel: files.read_verified(rel)
                for rel in files.records
                if rel in _SMALL or rel.endswith("zarr.json")
            }
            self.table_arrow: pa.Table = read_camera_table(
                small["cameras.parquet"], files.where("cameras.parquet")
            )
            self.index: dict[str, Any] = files.loads(small["index.json"], "index.json")
            self.table = CameraTable.from_arrow(self.table_arrow)
            narrow = (files.read_range, files.sizes, small, self.index, self.table, self.spec, self.fields)
            self.view = view = StoreView(url, *narrow, self.splits, self.legacy)
            self.reader: RaySplits | ImageSplits = self._open_reader(where)
            # the split's camera-table rows (``StoreView.rows``) and pid order; the colour channels served
            self.split_rows, self.split_order, self.rgba_channels = view.rows, view.order, view.channels
            self.decode_pids = self.table.decode  # (N,) uint32 pids -> image (N,), pixel (N, 2) (x, y)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, StoreError):
                raise
            if isinstance(exc, UntrustedFileError):
                raise StoreCorruptError(str(exc)) from None
            raise StoreCorruptError(f"{self.url}: store metadata incomplete or malformed: {exc!r}") from exc
        if verify:
            self.verify_files()

    def _open_reader(self, where: str) -> RaySplits | ImageSplits:
        try:
            backend = backend_named(self.backend)
        except KeyError:
            raise StoreCorruptError(f"{where}: unknown backend {self.backend!r}") from None
        if self.layout() == IMAGES_LAYOUT:
            return ImageSplits(self.view, backend)
        return RaySplits(self.view, backend.open_reader(self.view))

    def _guarded(self, read: Callable[[], T]) -> T:
        """``read()``; a failure because the store was replaced since it was opened (``convert
        --overwrite``) raises ``StoreChangedError``: chunks of two versions are never mixed."""
        try:
            return read()
        except (StoreCorruptError, StoreNotFoundError) as exc:
            self.storage.raise_if_replaced(exc)
            raise

    def layout(self, split: str | None = None) -> str:
        """``"rays"`` or ``"images"``: how ``split`` is stored (docs/format.md); with no split, the
        store's: ``"images"`` when every split stores images (what a copy keeps by default)."""
        if split is not None:
            return self.view.split(split).layout
        images = bool(self.splits) and all(info.holds_images for info in self.splits.values())
        return IMAGES_LAYOUT if images else RAYS_LAYOUT

    def verify_files(self) -> None:
        """Hash every file listed in the manifest; raise on the first mismatch."""
        for rel in self.files:
            self.storage.read_verified(rel)

    @property
    def world_from_source(self) -> np.ndarray:
        """(4, 4) similarity from the source frame to the store's world frame."""
        return self.scene.matrix()

    @cached_property
    def points(self) -> pa.Table | None:
        """The capture's sparse 3-D points (``raykit.store.schema``: ``point_id``, ``xyz`` in the
        store's world frame, ``rgb``, ``error``, ``track_length``), or None when the store has none;
        read on first use and checked against the manifest's SHA-256."""
        entry = self.manifest.get("points")
        if entry is None:
            return None
        rel = str(entry["path"])
        return read_parquet(self.storage.read_verified(rel), POINTS_SCHEMA, self.storage.where(rel))

    def sparse_points(self) -> SparsePoints | None:  # ``points`` as numpy arrays, or None
        return None if self.points is None else SparsePoints.from_table(self.points)

    def images(self, split: str) -> list[str]:
        """Names of ``split``'s images in table (pid) order."""
        return [self.table.names[i] for i in self.split_rows(split)]

    def image_index(self, name: str) -> int:
        """Row of image ``name`` in the camera table."""
        try:
            return self.table.names.index(name)
        except ValueError:
            raise RayRangeError(f"{self.url}: no image named {name!r}") from None

    def image_shape(self, name: str) -> tuple[int, int, int]:
        """``(height, width, channels)`` of image ``name`` as ``read_image`` returns it."""
        i = self.image_index(name)
        return int(self.table.height[i]), int(self.table.width[i]), self.rgba_channels

    # -- rays and images: the layout's ``reader`` ------------------------------------------------------
    def read_chunk(self, split: str, index: int) -> RawRays:
        """Chunk ``index`` of ``split``, checked against its recorded CRC."""
        info = self.view.split(split)
        if not 0 <= index < info.n_chunks:
            raise RayRangeError(f"{self.url}: chunk {index} of split {split!r} outside [0, {info.n_chunks})")
        return self._guarded(lambda: self.reader.read_chunk(info, index))

    def read(self, split: str, start: int, stop: int) -> RawRays:
        """Rays ``[start, stop)`` of ``split`` in stored order."""
        return self._guarded(lambda: self.reader.read(split, start, stop))

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Relative paths of the files holding chunk ``index`` of ``split`` (of an images store: the
        files of the images its rays view covers)."""
        return self.reader.chunk_files(split, index)

    def image_raw(self, name: str) -> RawRays:
        """Compact rays of every pixel of image ``name`` in row-major order."""
        return self._guarded(lambda: self.reader.image_raw(self.image_index(name)))

    def read_image(self, name: str, timed: Timed | None = None, downscale: int = 1) -> np.ndarray:
        """The pixels of image ``name``: (H, W, C) uint8, C = ``rgba_channels``; with ``downscale``
        k, resolution level k, (H // k, W // k, C) (``raykit.imagedecode``'s rule: JPEG decoded at
        1/k in the DCT domain, anything else area-filtered).

        The one way every loader reads a whole image, whatever the layout: from its rays (``image_raw``)
        or its stored file, decoded (``timed(step, seconds)`` told how long reading and decoding took).
        """
        return self._guarded(lambda: self.reader.read_image(self.image_index(name), timed, downscale))

    def read_split_image(self, split: str, local: int, timed: Timed | None = None) -> np.ndarray:
        """Image ``local`` (index within ``split``, table order): (H, W, C) uint8 as ``read_image``."""
        return self.read_image(self.table.names[int(self.split_rows(split)[local])], timed)

    def image_files(self, split: str, local: int) -> list[str]:
        """Relative paths of the files holding image ``local`` (index within ``split``) of an
        images-layout split; empty for a split that stores rays."""
        return self.reader.image_files(split, local)

    # -- components and per-frame metadata: the ``component_reader`` ----------------------------------
    @cached_property
    def component_reader(self) -> ComponentReader:
        """The reader of the store's components and per-frame metadata (``raykit.store.components``)."""
        return ComponentReader(self.view, backend_named(self.backend), self.manifest, self.storage.read_json)

    @property
    def components(self) -> dict[str, ComponentInfo]:  # name (``"mask"``, ``"depth"``) -> its record
        return self.component_reader.components

    @cached_property
    def store_fingerprint(self) -> str:
        """The content (pixel) fingerprint when the store has no component, else the SHA-256 of it and
        of every component's fingerprint: adding a component changes this, never ``fingerprint``."""
        if not self.components:
            return self.fingerprint
        prints = {k: v.fingerprint for k, v in self.components.items()}
        return json_digest({"content": self.fingerprint, "components": prints})

    def read_component(self, component: str, name: str, downscale: int = 1) -> np.ndarray:
        """Component ``component`` of image ``name`` at the stored resolution, or with ``downscale`` k
        at level k (the size ``read_image(name, downscale=k)`` has; nearest sample).

        Returns:
            mask: ``uint8 (H, W)``, 0 = pixel not used (a 1-bit mask reads 0 or 255); depth:
            ``float32 (H, W)``, in metres when the component's ``unit`` is ``"m"``, 0 = unknown.

        Raises:
            RayRangeError: no such component or image. StoreCorruptError: altered bytes.
        """
        return self.component_reader.read(component, self.image_index(name), downscale)

    def read_split_components(
        self, component: str, split: str, local: Iterable[int]
    ) -> Iterator[tuple[int, np.ndarray]]:
        """``(i, array)``: component ``component`` of each image ``i`` of ``local`` (indices within
        ``split``, each once, in split order) as ``read_component`` reads it, the stored bytes of
        images lying together read at once: a loader's first epoch."""
        return self.component_reader.read_split(component, split, local)

    def frame_metadata(self, name: str) -> dict[str, Any]:
        """Per-frame metadata of image ``name`` kept by the converter (unknown ``transforms.json``
        per-frame keys, EXIF exposure, ISO, shutter and time, COLMAP rig, frame and sensor ids; a
        JSON-able dict), ``{}`` when none."""
        self.image_index(name)
        return self.component_reader.frame_metadata(name)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        """Pickle as its location: unpickling reopens the store (worker processes, dask tasks)."""
        return open_store, (self.url,)

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}: {v.n_rays} rays" for k, v in self.splits.items())
        return f"RayStore({self.url!r}, backend={self.backend!r}, {counts})"
