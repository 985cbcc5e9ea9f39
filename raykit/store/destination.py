"""Where a store is written: checks on ``DST`` and the ``DST.partial`` work folder beside it
(docs/format.md, "Commit protocol"). ``DST`` must be absent, an empty folder, or (with ``overwrite``)
a store; ``DST.partial/plan.json`` records what the unfinished work is for: a rerun with the same plan
resumes it, another or an unreadable plan (with a warning) discards it.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError, RaykitWarning, StoreError
from raykit.fileio import atomic_write_json

__all__ = ["OVERWRITE_HINT", "check_destination", "prepare_partial"]

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
