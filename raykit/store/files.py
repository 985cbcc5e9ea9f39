"""A store's files: where they are (a local path or a URL), where a store is
written (``DST`` and ``DST.partial``) and how they are trusted (checksums, file records, the content
fingerprint). Sections below, in that order. One writer per store: ``raykit.locks``.

Store locations: a local path, or a URL with a scheme (``https://``, ``s3://``, ``memory://``...).

Text is a URL only when it contains ``://`` (and is not ``file://``); everything else is a local path,
even when it contains characters fsspec would otherwise read as URL syntax (``::`` chains, ``#``).
Opening a location turns fsspec's failures (an unknown or uninstalled protocol, a refused
connection) into :class:`~raykit.errors.StoreError` lines that name the location.

Reading a committed store's files (whole and checked, or in byte ranges, also from servers that ignore
HTTP ``Range``) is the byte layer's: ``raykit.store.byteview``.

Where a store is written: checks on ``DST`` and the ``DST.partial`` work folder beside it
(docs/format.md, "Commit protocol"). ``DST`` must be absent, an empty folder, or (with ``overwrite``)
a store; ``DST.partial/plan.json`` records what the unfinished work is for: a rerun with the same plan
resumes it, another or an unreadable plan (with a warning) discards it.

Checksums of a ray store (docs/format.md, "Integrity"): the per-chunk CRC of the decoded field
bytes (the same in every backend, checked on every read), per-file SHA-256, and the content
fingerprint, which hashes the logical content only (camera table rows, scene, splits, fields, chunk
CRCs), so a store and its copy in the other backend share it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pyarrow as pa

from raykit.errors import (
    ConfigError,
    RaykitWarning,
    StoreError,
)
from raykit.fileio import (
    atomic_write_bytes,
    atomic_write_json,
    sha256_file,
)

__all__ = [
    "CHUNK_CHECKSUM",
    "OVERWRITE_HINT",
    "bytes_record",
    "check_destination",
    "chunk_checksum",
    "content_fingerprint",
    "file_record",
    "filesystem",
    "is_url",
    "json_digest",
    "local_files_bytes",
    "prepare_partial",
    "read_errors",
    "write_files",
]


def is_url(text: str) -> bool:
    """Whether ``text`` names a remote location (a scheme other than ``file://``)."""
    return "://" in text and not text.startswith("file://")


def local_files_bytes(paths: Sequence[str]) -> int | None:
    """Total bytes of the files ``paths`` when there are some and every one is a local file, else None."""
    if not paths or not all(isinstance(p, str) and p and os.path.isfile(p) for p in paths):
        return None
    return sum(os.path.getsize(p) for p in paths)


def filesystem(url: str) -> tuple[Any, str]:
    """``(fsspec filesystem, root path)`` of a URL (``is_url``).

    Raises:
        StoreError: unknown protocol, or one whose package is not installed.
    """
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise StoreError(
            f"{url}: protocol {protocol!r} needs a package that is not installed ({exc})"
        ) from None
    except ValueError as exc:
        raise StoreError(
            f"{url}: cannot open ({exc}); expected a local path or an fsspec URL (http(s)://, s3://, "
            "gs://, memory://, ...)"
        ) from None


def read_errors() -> tuple[type[BaseException], ...]:
    """Exception types a remote read raises when the location cannot be reached (refused, reset,
    timed out, HTTP error status)."""
    errors: list[type[BaseException]] = [OSError, TimeoutError]
    try:
        import aiohttp

        errors.append(aiohttp.ClientError)
    except ImportError:  # pragma: no cover - aiohttp comes with fsspec[http]
        pass
    return tuple(errors)


OVERWRITE_HINT = "pass --overwrite (overwrite=True) to replace it"


def check_destination(dst: Path, overwrite: bool) -> None:
    """Refuse a ``dst`` that is a file, a folder of other things, or a store without ``overwrite``."""
    if dst.is_file() or (dst.exists() and not dst.is_dir()):
        raise ConfigError(f"{dst}: exists and is a file, not a raykit store; refusing to replace it")
    if not dst.exists():
        return
    if (dst / "manifest.json").exists():
        if not overwrite:
            raise ConfigError(f"{dst}: a store already exists there ({OVERWRITE_HINT})")
        return
    try:
        occupied = any(dst.iterdir())
    except OSError as exc:
        raise StoreError(f"{dst}: cannot list the destination folder ({exc.strerror or exc})") from None
    if occupied:
        raise ConfigError(f"{dst}: exists and is not a raykit store; refusing to replace it")


def _saved_key(plan_path: Path) -> str | None:
    """The key recorded in ``plan.json``; None when it is missing; warns when it is unreadable."""
    if not plan_path.exists():
        return None
    try:
        saved = json.loads(plan_path.read_text(encoding="utf-8"))
        key = saved.get("key") if isinstance(saved, dict) else None
        if not isinstance(key, str):
            raise ValueError("no 'key' string")
    except (OSError, ValueError) as exc:
        warnings.warn(
            f"{plan_path}: unreadable plan of an interrupted write ({exc}); discarding "
            f"{plan_path.parent} and starting again",
            RaykitWarning,
            stacklevel=3,
        )
        return None
    return key


def prepare_partial(dst: Path, plan: Mapping[str, Any], key: str) -> Path:
    """``DST.partial`` holding this plan: kept when its ``plan.json`` has ``key``, else emptied first.

    Raises:
        ConfigError: ``DST.partial`` is a file or a symlink (not raykit's; never removed).
        StoreError: the folder cannot be created or written (read-only or virtual file system, no
            permission), naming it.
    """
    partial = dst.with_name(dst.name + ".partial")
    plan_path = partial / "plan.json"
    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        raise ConfigError(
            f"{partial}: exists and is not a folder, so it is not the work folder of an interrupted "
            "write; remove or rename it"
        )
    try:
        if partial.exists() and _saved_key(plan_path) != key:
            shutil.rmtree(partial)
        partial.mkdir(parents=True, exist_ok=True)
        atomic_write_json(plan_path, {"key": key, "plan": plan})
    except OSError as exc:
        raise StoreError(
            f"{partial}: cannot create the store's work folder ({exc.strerror or exc}); choose a DST "
            "in a writable folder"
        ) from None
    return partial


CHUNK_CHECKSUM = "crc32c"  # the index.json key (and algorithm) of new stores; "crc32" (zlib) before


def chunk_checksum(values: Mapping[str, np.ndarray], order: Sequence[str], kind: str = CHUNK_CHECKSUM) -> int:
    """Checksum of the C-contiguous bytes of ``values[name]`` for ``name`` in ``order``, one stream.

    ``kind`` is ``"crc32c"`` (Castagnoli, hardware-accelerated: about 2.5x faster than zlib's CRC-32
    here) or ``"crc32"`` (zlib's, what stores written before it recorded).
    """
    if kind not in ("crc32c", "crc32"):
        raise ValueError(f"chunk checksum: expected 'crc32c' or 'crc32', got {kind!r}")
    crc = 0
    for name in order:
        data = np.ascontiguousarray(values[name]).reshape(-1).view(np.uint8)
        if kind == "crc32":
            crc = zlib.crc32(data.data, crc)
        else:
            readonly = data.view()
            readonly.flags.writeable = False  # google_crc32c takes read-only buffers only
            crc = google_crc32c.extend(crc, readonly)
    return crc


def file_record(path: Path) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of a local file."""
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def bytes_record(data: bytes | memoryview | Sequence[bytes]) -> dict[str, Any]:
    """``{"size", "sha256"}`` of bytes about to be written (or of pieces written one after the other):
    equals ``file_record`` of the written file."""
    pieces = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return {"size": sum(len(piece) for piece in pieces), "sha256": digest.hexdigest()}


def write_files(root: Path, files: Mapping[str, bytes | list[bytes]], records: dict[str, Any]) -> None:
    """Write ``files`` (relative path -> bytes, whole or in pieces written one after the other) under
    ``root``, each atomically, and add their records (``bytes_record``: hashed from memory, never
    re-read) to ``records``."""
    for rel, data in files.items():
        atomic_write_bytes(root / rel, data)
        records[rel] = bytes_record(data)


def json_digest(obj: Any) -> str:
    """Hex SHA-256 of canonical JSON (sorted keys, no spaces) of ``obj``."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def content_fingerprint(
    table: pa.Table,
    scene: Mapping[str, Any],
    splits: Mapping[str, Mapping[str, Any]],
    fields: Mapping[str, Mapping[str, Any]],
    chunk_crcs: Mapping[str, Sequence[int]],
    checksum: str = CHUNK_CHECKSUM,
) -> str:
    """One hex digest of a store's logical content (the same for both backends).

    ``checksum`` names the algorithm of ``chunk_crcs`` (``chunk_checksum``); ``"crc32"`` leaves it out
    of the digest, so fingerprints of stores from before crc32c are unchanged.
    """
    content: dict[str, Any] = {
        "cameras": json_digest(table.to_pylist()),  # the rows' values, whatever the parquet encoding
        "scene": dict(scene),
        "splits": {k: dict(v) for k, v in splits.items()},
        "fields": {k: dict(v) for k, v in fields.items()},
        "chunks": {k: list(v) for k, v in chunk_crcs.items()},
    }
    if checksum != "crc32":
        content["chunk_checksum"] = checksum
    return json_digest(content)
