"""A store's files: where they are (a local path or a URL), where a store is
written (``DST`` and ``DST.partial``) and how they are trusted (checksums, file records, the content
fingerprint, the manifest's header and file records). Sections below, in that order. One writer per store:
``raykit.locks``.

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

from raykit.errors import ConfigError, RaykitWarning, StoreCorruptError, StoreError, StoreVersionError
from raykit.fileio import (
    UntrustedFileError,
    atomic_write_bytes,
    atomic_write_json,
    bytes_record,
    check_relative,
    file_record,
)
from raykit.locks import lock_owner, lock_path
from raykit.store.schema import FORMAT_NAME, FORMAT_VERSION

__all__ = [
    "CHUNK_CHECKSUM",
    "OVERWRITE_HINT",
    "bytes_record",
    "check_destination",
    "check_manifest",
    "check_manifest_files",
    "check_manifest_header",
    "chunk_checksum",
    "content_fingerprint",
    "file_record",
    "filesystem",
    "is_url",
    "json_digest",
    "local_files_bytes",
    "missing_store_message",
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


def write_files(
    root: Path, files: Mapping[str, bytes | memoryview | list[bytes]], records: dict[str, Any]
) -> None:
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


def check_manifest_header(manifest: Mapping[str, Any], where: str) -> None:
    """Raise unless ``manifest`` is a raykit store manifest of a format version this code reads."""
    if manifest.get("format") != FORMAT_NAME:
        raise StoreCorruptError(f"{where}: expected format {FORMAT_NAME!r}, got {manifest.get('format')!r}")
    version = manifest.get("format_version")
    if not isinstance(version, int):
        raise StoreCorruptError(f"{where}: expected an integer format_version, got {version!r}")
    if version > FORMAT_VERSION:
        raise StoreVersionError(
            f"{where}: store format version {version} is newer than this raykit reads "
            f"(<= {FORMAT_VERSION}); upgrade raykit"
        )
    if version < 1:  # 1 and 2 store every pid; 3 derives them (SplitInfo.pids)
        raise StoreVersionError(f"{where}: unknown store format version {version}")


_HEX = frozenset("0123456789abcdef")


def check_manifest_files(manifest: Mapping[str, Any], where: str) -> None:
    """Raise unless every name the manifest gives a path by is a plain path inside the store and every
    file record is ``{"size": int >= 0, "sha256": 64 hex digits}``: file names (no ``..``, absolute
    path, backslash or NUL: ``fileio.safe_path``'s rules), split names (one plain path part each, as
    payload paths are made of them) and the points' path. Symlinks are checked where files are read.

    Raises:
        StoreCorruptError: naming ``where`` and the first bad entry.
    """
    files = manifest.get("files")
    if not isinstance(files, Mapping):
        raise StoreCorruptError(f"{where}: expected 'files' to be an object of file records")
    splits = manifest.get("splits")
    splits = splits if isinstance(splits, Mapping) else {}
    names = [*splits, *(s["name"] for s in splits.values() if isinstance(s, Mapping) and "name" in s)]
    try:
        for rel, entry in files.items():
            check_relative(rel, where)
            size, sha = (
                (entry.get("size"), entry.get("sha256")) if isinstance(entry, Mapping) else (None, None)
            )
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise StoreCorruptError(f"{where}: file {rel!r}: expected a size in bytes, got {size!r}")
            if not isinstance(sha, str) or len(sha) != 64 or not _HEX.issuperset(sha):
                raise StoreCorruptError(f"{where}: file {rel!r}: expected a hex sha256, got {sha!r}"[:300])
        for name in names:
            if not isinstance(name, str) or "/" in name:
                raise StoreCorruptError(f"{where}: split name {name!r} is not a plain name")
            check_relative(name, where)
        points = manifest.get("points")
        if isinstance(points, Mapping) and "path" in points:
            check_relative(points["path"], where)
    except UntrustedFileError as exc:
        raise StoreCorruptError(str(exc)) from None


def missing_store_message(url: str, root: str, fs: Any) -> str:
    """Why no store opens at ``url`` (``root`` on filesystem ``fs``; None: local) without a manifest:
    a write in progress (its lock's owner), an interrupted one, nothing there, a file, another folder."""
    exists = os.path.exists if fs is None else fs.exists
    if url.endswith(".partial") or exists(f"{root}.partial"):
        owner = None if is_url(url) else lock_owner(lock_path(root.removesuffix(".partial")))
        if owner is not None:
            return (
                f"incomplete store: {url} is being written by pid {owner.get('pid', '?')} on host "
                f"{owner.get('host', '?')}; wait for it to finish"
            )
        return f"incomplete store (an interrupted write; rerun it to resume): {url}"
    if not exists(root):
        return f"no such store: {url}"
    if (os.path.isfile if fs is None else fs.isfile)(root):
        return f"not a raykit store: {url} is a file (a store is a folder holding manifest.json)"
    return f"not a raykit store (no manifest.json): {url}"


def check_manifest(manifest: Any, where: str) -> dict[str, Any]:
    """``manifest`` (a parsed ``manifest.json``) once its header, file records and digest check."""
    if not isinstance(manifest, dict):
        raise StoreCorruptError(f"{where}: expected a JSON object, got {type(manifest).__name__}")
    check_manifest_header(manifest, where)
    check_manifest_files(manifest, where)
    body = {k: v for k, v in manifest.items() if k != "manifest_digest"}
    if manifest.get("manifest_digest") != json_digest(body):
        raise StoreCorruptError(f"{where}: manifest_digest does not match the manifest's content")
    return manifest
