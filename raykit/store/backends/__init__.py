"""The interface every store backend implements, and the registry that names them.

A backend is the physical form of the payload; everything else about a store is the same whatever the
backend. Its halves: ``Backend`` (writing shards and metadata, opening a reader), ``PayloadReader``
(reading chunks) and ``Backend.images``, an ``ImagesPayload`` (the images layout). Backends are
stateless frozen objects (picklable: writer tasks carry them). A new backend is one module defining
``BACKEND``, one line in ``_MODULES`` and a subclass of the suite in ``tests/store/test_contract.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from raykit.store.schema import FieldSpec, SplitInfo
from raykit.store.spec import BACKENDS, StoreSpec

if TYPE_CHECKING:
    from raykit.store.files import RangeFetcher

__all__ = [
    "BACKENDS",
    "Backend",
    "ByteRead",
    "EncodedShard",
    "ImageShard",
    "ImagesPayload",
    "PayloadReader",
    "PayloadSpec",
    "StagedImage",
    "backend_named",
]


# name -> module defining ``BACKEND``; imported on first use, so reading a zarr store never imports the
# WebDataset backend and the other way round.
_MODULES = {"zarr": "raykit.store.backends.zarr", "wds": "raykit.store.backends.wds"}


# ``read(rel, start, stop)``: a byte range of a store's file, as ``bytes`` or a read-only uint8 array
ByteRead = Callable[[str, int, int], "bytes | np.ndarray"]


@dataclass(frozen=True)
class PayloadSpec:
    """What a backend needs to know about a payload besides its rays: the fields (name -> spec, in
    stored order), the store's layout (chunk and shard sizes, codec settings) and which fields
    each split stores (``stored``: split name -> field names; a split not named stores every field; a
    format-3 split with derived pids stores no ``pid``)."""

    fields: Mapping[str, FieldSpec]
    layout: StoreSpec
    stored: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def fields_of(self, split: str) -> dict[str, FieldSpec]:
        """The fields split ``split`` stores, name -> spec, in stored order."""
        names = self.stored.get(split)
        return dict(self.fields) if names is None else {k: v for k, v in self.fields.items() if k in names}

    @classmethod
    def of(
        cls, fields: Mapping[str, FieldSpec], layout: StoreSpec, splits: Mapping[str, SplitInfo]
    ) -> PayloadSpec:
        """The spec of a payload whose splits are ``splits`` (``SplitInfo.pids`` says whether a split
        stores its pids)."""
        stored = {
            name: tuple(k for k in fields if k != "pid" or info.pids == "stored")
            for name, info in splits.items()
        }
        return cls(fields, layout, stored)


@dataclass(frozen=True)
class EncodedShard:
    """One shard of every field, encoded: ``files``, relative path -> its bytes (whole or in pieces
    written one after the other); ``index``, the entries the backend adds to the split's ``index.json``
    record, key -> one value per chunk of the shard (e.g. WebDataset member offsets)."""

    files: dict[str, bytes | list[bytes]]
    index: dict[str, list[Any]] = field(default_factory=dict)


class PayloadReader(Protocol):
    """Reads the payload of one committed store."""

    def chunk_files(self, split: str, index: int) -> list[str]:
        """Relative paths of the files holding chunk ``index`` of ``split``."""
        ...

    def read_chunk(self, info: SplitInfo, index: int) -> dict[str, np.ndarray]:
        """Field name -> (n, ...) values of chunk ``index`` of split ``info`` (n rays of the chunk)."""
        ...


@dataclass(frozen=True)
class ImageShard:
    """One shard file of an images split: ``images``, the split-local indices of the images it holds
    (whole or in part); for a byte-array backend, ``offsets`` (each one's first byte in the split's
    array) and ``total`` (the array's bytes)."""

    shard: int
    images: tuple[int, ...]
    offsets: tuple[int, ...] = ()
    total: int = 0


@dataclass(frozen=True)
class StagedImage:
    """One encoded image as a shard is assembled from it: bytes, extension, camera record."""

    data: bytes
    ext: str
    record: Mapping[str, Any]


class ImagesPayload(Protocol):
    """How one backend stores the images layout (``Backend.images``)."""

    def root_metadata(self) -> dict[str, bytes]:
        """Files of the payload as a whole: relative path -> bytes."""
        ...

    def plan_split(
        self, split: str, names: Sequence[str], entry: Mapping[str, Sequence[Any]], layout: StoreSpec
    ) -> tuple[list[ImageShard], dict[str, list[Any]], dict[str, bytes]]:
        """The split's shards, its ``index.json`` entries known before any shard is written, and its
        metadata files, from each image's name and its ``index.json`` entries so far (``image_format``,
        the extension; ``image_bytes``, the stored size)."""
        ...

    def encode_shard(
        self, split: str, shard: ImageShard, images: Sequence[StagedImage], layout: StoreSpec
    ) -> tuple[str, bytes | list[bytes], dict[str, list[Any]]]:
        """The shard's relative path, bytes, and ``index.json`` entries for its images."""
        ...

    def files_of(self, entry: Mapping[str, Any], split: str, i: int, layout: StoreSpec) -> list[str]:
        """Relative paths of the files holding image ``i`` (``entry``: the split's ``index.json``)."""
        ...

    def image_parts(
        self, read: ByteRead, where: str, entry: Mapping[str, Any], split: str, i: int, layout: StoreSpec
    ) -> list[bytes | np.ndarray]:
        """The stored bytes of image ``i``, in pieces that joined give the file (views of what
        ``read(rel, start, stop)`` returned: no copy)."""
        ...


class Backend(Protocol):
    """Writes a payload and opens readers on it."""

    @property
    def name(self) -> str:
        """The name recorded in the manifest (``"zarr"``, ``"wds"``)."""
        ...

    @property
    def images(self) -> ImagesPayload:
        """How this backend stores and reads the images layout (``ImagesPayload``)."""
        ...

    def shard_files(self, split: str, shard: int, spec: PayloadSpec) -> list[str]:
        """Relative paths of the files holding shard ``shard`` of ``split``."""
        ...

    def encode_shard(
        self, info: SplitInfo, shard: int, data: Mapping[str, np.ndarray], spec: PayloadSpec
    ) -> EncodedShard:
        """Encode shard ``shard`` of split ``info`` from ``data``: field name -> (n, ...) the shard's
        rays (the last shard may be short), fields in ``spec.fields`` order."""
        ...

    def write_metadata(self, root: Path, splits: Mapping[str, SplitInfo], spec: PayloadSpec) -> list[str]:
        """Write the payload's metadata files under ``root`` atomically; their relative paths."""
        ...

    def field_bytes(
        self, splits: Mapping[str, SplitInfo], files: Mapping[str, Any], index: Mapping[str, Any]
    ) -> dict[str, dict[str, int]]:
        """Payload bytes per split and stored field of a committed store (``files``: the manifest's
        records; ``index``: ``index.json``); container overhead under a name of its own (``"tar"``)."""
        ...

    def open_reader(
        self, url: str, spec: PayloadSpec, index: Mapping[str, Any], ranges: RangeFetcher | None = None
    ) -> PayloadReader:
        """A reader of the committed store at ``url`` with its ``index.json`` contents; ``ranges``
        reads byte ranges of a remote store (``raykit.store.files``), None for a local one."""
        ...


def backend_named(name: str) -> Backend:
    """The backend called ``name``.

    Raises:
        KeyError: no backend has that name (callers turn it into a ``ConfigError`` or, for a
            manifest, a ``StoreCorruptError``).
    """
    if name not in _MODULES:
        raise KeyError(f"unknown store backend {name!r}; expected one of {BACKENDS}")
    backend: Backend = importlib.import_module(_MODULES[name]).BACKEND
    return backend
