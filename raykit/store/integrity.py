"""Checksums of a ray store: per-chunk CRC-32 of the logical rays, per-file SHA-256, content fingerprint.

* Every chunk's CRC-32 is computed over its decoded field bytes (fields in manifest order), so it is
  the same for every backend and is checked on every chunk read: a flipped, truncated or missing
  payload byte can never yield silently wrong rays.
* Every file's size and SHA-256 is in the manifest; ``raykit validate`` (and ``open_store(verify=True)``)
  recompute them. Small metadata files are checked whenever a store is opened.
* The content fingerprint hashes the logical content only (camera table rows, scene, split layout,
  fields, chunk CRCs), so a store and its copy in the other backend share it.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from raykit.fileio import sha256_file

__all__ = [
    "camera_table_digest",
    "chunk_crc32",
    "content_fingerprint",
    "file_record",
    "json_digest",
]


def chunk_crc32(values: Mapping[str, np.ndarray], order: Sequence[str]) -> int:
    """CRC-32 of the C-contiguous bytes of ``values[name]`` for ``name`` in ``order``."""
    crc = 0
    for name in order:
        crc = zlib.crc32(np.ascontiguousarray(values[name]).reshape(-1).view(np.uint8).data, crc)
    return crc


def file_record(path: Path) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of a local file."""
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def json_digest(obj: Any) -> str:
    """Hex SHA-256 of canonical JSON (sorted keys, no spaces) of ``obj``."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def camera_table_digest(table: pa.Table) -> str:
    """Digest of the camera table's rows (logical values, independent of parquet encoding)."""
    return json_digest(table.to_pylist())


def content_fingerprint(
    table: pa.Table,
    scene: Mapping[str, Any],
    splits: Mapping[str, Mapping[str, Any]],
    fields: Mapping[str, Mapping[str, Any]],
    chunk_crcs: Mapping[str, Sequence[int]],
) -> str:
    """One hex digest of a store's logical content (the same for both backends)."""
    return json_digest(
        {
            "cameras": camera_table_digest(table),
            "scene": dict(scene),
            "splits": {k: dict(v) for k, v in splits.items()},
            "fields": {k: dict(v) for k, v in fields.items()},
            "chunks": {k: list(v) for k, v in chunk_crcs.items()},
        }
    )
