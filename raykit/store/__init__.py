"""The ray store: one logical format (``docs/format.md``) with Zarr v3 and WebDataset backends."""

from __future__ import annotations

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
from raykit.store.writer import BACKENDS, DEFAULT_CHUNK_RAYS, DEFAULT_SHARD_CHUNKS, write_store

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
    "write_store",
]
