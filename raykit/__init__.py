"""raykit: NeRF-style training data that is fast, safe and reproducible."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from raykit.errors import (
    CameraError,
    ConfigError,
    RaykitError,
    ResumeError,
    SourceError,
    StoreCorruptError,
    StoreError,
    StoreNotFoundError,
    StoreVersionError,
)
from raykit.version import __version__

if TYPE_CHECKING:
    from raykit.store import RayStore

__all__ = [
    "CameraError",
    "ConfigError",
    "RaykitError",
    "ResumeError",
    "SourceError",
    "StoreCorruptError",
    "StoreError",
    "StoreNotFoundError",
    "StoreVersionError",
    "__version__",
    "open_store",
]


def open_store(path_or_url: str | Path, *, verify: bool = False) -> RayStore:
    """Open a committed ray store from a local path or any fsspec URL (see ``raykit.store.open_store``)."""
    from raykit.store import open_store as _open_store

    return _open_store(path_or_url, verify=verify)
