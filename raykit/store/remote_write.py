"""Writing a store to object storage (``s3://bucket/scene`` or any writable fsspec URL; docs/format.md,
"Object storage"): written locally by the ordinary writers in a work folder derived from the URL (so a
rerun resumes it), then uploaded file by file with ``manifest.json`` last (until it is there, readers
see no store); ``overwrite`` deletes the old manifest first. The local copy is removed after the upload.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError, StoreError
from raykit.store.destination import OVERWRITE_HINT
from raykit.store.location import filesystem, read_errors

__all__ = ["upload_store", "work_folder", "write_remote"]


def work_folder(url: str) -> Path:
    """The local folder a store for ``url`` is written in before its upload (stable across reruns)."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"raykit-upload-{digest}"


def upload_store(local: Path, url: str, *, overwrite: bool = False) -> list[str]:
    """Upload the committed store at ``local`` to ``url``, ``manifest.json`` last; the uploaded
    relative paths in upload order.

    Raises:
        ConfigError: a store exists at ``url`` and ``overwrite`` is False.
        StoreError: the object store refused a write (naming the object).
    """
    if not (local / "manifest.json").is_file():
        raise ConfigError(f"{local}: not a committed store (no manifest.json); nothing to upload")
    fs, root = filesystem(url)
    root = root.rstrip("/")
    if fs.exists(f"{root}/manifest.json"):
        if not overwrite:
            raise ConfigError(f"{url}: a store already exists there ({OVERWRITE_HINT})")
        fs.rm(f"{root}/manifest.json")  # the old store disappears first
        fs.rm(root, recursive=True)
    files = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    order = [rel for rel in files if rel != "manifest.json"] + ["manifest.json"]
    for rel in order:
        try:
            fs.put_file(str(local / rel), f"{root}/{rel}")
        except read_errors() as exc:
            raise StoreError(f"{url}/{rel}: upload failed ({type(exc).__name__}: {exc})") from None
    return order


def write_remote(url: str, write: Callable[[Path], Any], *, overwrite: bool = False) -> Any:
    """Run ``write(local_dst)`` (a store writer), upload its store to ``url`` and open it there."""
    from raykit.store.reader import open_store

    fs, root = filesystem(url)
    if fs.exists(f"{root.rstrip('/')}/manifest.json") and not overwrite:
        raise ConfigError(f"{url}: a store already exists there ({OVERWRITE_HINT})")
    folder = work_folder(url)
    local = folder / "store"
    if local.exists() and (local / "manifest.json").exists():
        shutil.rmtree(local)  # an earlier upload's finished copy: write again (inputs may differ)
    write(local)
    upload_store(local, url, overwrite=overwrite)
    shutil.rmtree(folder, ignore_errors=True)
    return open_store(url)
