"""The ray store: one logical format (``docs/format.md``) with Zarr v3 and WebDataset backends."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raykit.store.lock import store_lock
from raykit.store.reader import RayRangeError, RayStore, open_store
from raykit.store.schema import (
    FORMAT_VERSION,
    FieldSpec,
    ImageRecord,
    RawRays,
    SceneInfo,
    SplitInfo,
    decode_pids,
    encode_pids,
)

if TYPE_CHECKING:
    from raykit.store.writer import BACKENDS, DEFAULT_CHUNK_RAYS, DEFAULT_SHARD_CHUNKS, write_store

_WRITER = ("BACKENDS", "DEFAULT_CHUNK_RAYS", "DEFAULT_SHARD_CHUNKS", "write_store")


def __getattr__(name: str) -> Any:
    """The writer's names, imported on first use: reading a store (``raykit info``, ``validate``, the
    loaders) does not pay for the writer's imports."""
    if name in _WRITER:
        from raykit.store import writer

        return getattr(writer, name)
    raise AttributeError(f"module 'raykit.store' has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "DEFAULT_CHUNK_RAYS",
    "DEFAULT_SHARD_CHUNKS",
    "FORMAT_VERSION",
    "FieldSpec",
    "ImageRecord",
    "RawRays",
    "RayRangeError",
    "RayStore",
    "SceneInfo",
    "SplitInfo",
    "decode_pids",
    "encode_pids",
    "open_store",
    "store_lock",
    "write_store",
]
