"""The one interface every store backend implements, and the registry that names them.

A backend is the physical form of the payload; everything else about a store is the same whatever the
backend. One module per backend defines ``BACKEND``, a stateless frozen object (picklable: writer tasks
carry it) that encodes a shard of either layout and opens a reader of a committed store's ray chunks.
A new backend is one module, one line in ``_MODULES`` and a subclass of the suite in
``tests/store/test_contract.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union

import numpy as np

from raykit.store.schema import FieldSpec, SplitInfo
from raykit.store.spec import BACKENDS, StoreSpec

if TYPE_CHECKING:
    from raykit.store.backends.wds import WdsReader
    from raykit.store.backends.zarr import ZarrReader
    from raykit.store.files import RangeFetcher

__all__ = ["BACKENDS", "Backend", "ByteRead", "ChunkReader", "ImageShard", "StagedImage", "backend_named"]


# name -> module defining ``BACKEND``; imported on first use, so reading a zarr store never imports the
# WebDataset backend and the other way round.
_MODULES = {"zarr": "raykit.store.backends.zarr", "wds": "raykit.store.backends.wds"}


# the reader of a committed store's ray chunks (``Backend.open_reader``)
ChunkReader = Union["ZarrReader", "WdsReader"]


# ``read(rel, start, stop)``: a byte range of a store's file, as ``bytes`` or a read-only uint8 array
ByteRead = Callable[[str, int, int], "bytes | np.ndarray"]


# one encoded image as a shard is assembled from it: bytes, extension, camera record
StagedImage = tuple[bytes, str, Mapping[str, Any]]


@dataclass(frozen=True)
class ImageShard:
    """One shard file of an images split: ``images``, the split-local indices of the images it holds
    (whole or in part); for a byte-array backend, ``offsets`` (each one's first byte in the split's
    array) and ``total`` (the array's bytes)."""

    shard: int
    images: tuple[int, ...]
    offsets: tuple[int, ...] = ()
    total: int = 0


class Backend(Protocol):
    """Writes a payload of either layout and reads it back. ``fields``: a split's stored fields, name
    -> spec in stored order (``SplitInfo.stored_fields``); ``spec``: the store's ``StoreSpec``."""

    @property
    def name(self) -> str:
        """The name recorded in the manifest (``"zarr"``, ``"wds"``)."""
        ...

    # -- the rays layout ---------------------------------------------------------------------------
    def shard_files(self, split: str, shard: int, fields: Mapping[str, FieldSpec]) -> list[str]:
        """Relative paths of the files holding shard ``shard`` of ``split``."""
        ...

    def encode_shard(
        self,
        info: SplitInfo,
        shard: int,
        data: Mapping[str, np.ndarray],
        fields: Mapping[str, FieldSpec],
        spec: StoreSpec,
    ) -> tuple[dict[str, bytes | list[bytes]], dict[str, list[Any]]]:
        """Encode shard ``shard`` of split ``info`` from ``data``: field name -> (n, ...) the shard's
        rays (the last shard may be short), in ``fields`` order. Returns the files (relative path ->
        bytes, whole or in pieces written one after the other) and the entries the backend adds to the
        split's ``index.json`` record (key -> one value per chunk of the shard)."""
        ...

    def write_metadata(
        self, root: Path, splits: Mapping[str, SplitInfo], fields: Mapping[str, FieldSpec], spec: StoreSpec
    ) -> list[str]:
        """Write the rays payload's metadata files under ``root`` atomically; their relative paths."""
        ...

    def field_bytes(
        self, splits: Mapping[str, SplitInfo], files: Mapping[str, Any], index: Mapping[str, Any]
    ) -> dict[str, dict[str, int]]:
        """Payload bytes per split and stored field of a committed store (``files``: the manifest's
        records; ``index``: ``index.json``); container overhead under a name of its own (``"tar"``)."""
        ...

    def open_reader(
        self,
        url: str,
        stored: Mapping[str, Mapping[str, FieldSpec]],
        spec: StoreSpec,
        index: Mapping[str, Any],
        ranges: RangeFetcher | None = None,
    ) -> ChunkReader:
        """A reader of the ray chunks of the committed store at ``url`` (``stored``: split -> its
        stored fields; ``index``: ``index.json``); ``ranges`` reads byte ranges of a remote store
        (``raykit.store.files``), None for a local one. It has ``chunk_files(split, index)`` and
        ``read_chunk(info, index)`` (field name -> (n, ...) values, unchecked)."""
        ...

    # -- the images layout -------------------------------------------------------------------------
    def images_metadata(self) -> dict[str, bytes]:
        """Files of an images payload as a whole: relative path -> bytes."""
        ...

    def plan_images(
        self, split: str, names: Sequence[str], entry: Mapping[str, Sequence[Any]], spec: StoreSpec
    ) -> tuple[list[ImageShard], dict[str, list[Any]], dict[str, bytes]]:
        """An images split's shards, its ``index.json`` entries known before any shard is written, and
        its metadata files, from each image's name and its ``index.json`` entries so far
        (``image_format``, the extension; ``image_bytes``, the stored size)."""
        ...

    def encode_images(
        self, split: str, shard: ImageShard, images: Sequence[StagedImage], spec: StoreSpec
    ) -> tuple[str, bytes | list[bytes], dict[str, list[Any]]]:
        """Shard ``shard`` of an images split from its images (bytes, extension, camera record): its
        relative path, bytes, and ``index.json`` entries for its images."""
        ...

    def image_files(self, entry: Mapping[str, Any], split: str, i: int, spec: StoreSpec) -> list[str]:
        """Relative paths of the files holding image ``i`` (``entry``: the split's ``index.json``)."""
        ...

    def image_parts(
        self, read: ByteRead, where: str, entry: Mapping[str, Any], split: str, i: int, spec: StoreSpec
    ) -> list[bytes | np.ndarray]:
        """The stored bytes of image ``i``, in pieces that joined give the file (views of what
        ``read(rel, start, stop)`` returned: no copy)."""
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
