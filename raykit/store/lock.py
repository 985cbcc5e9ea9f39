"""One writer per store: a lock file beside the destination, naming its owner.

``<dst>.lock`` is created with ``O_CREAT | O_EXCL`` (atomic on local file systems) and holds
``{"pid", "host", "started", "command"}``. A second writer finds it and fails with
:class:`~raykit.errors.StoreLockedError` naming the owner. A lock whose owner is a process of this
host that no longer exists is stale (its writer was killed): it is reported as such, with the command
that clears it, and never removed silently, since the killed writer's ``<dst>.partial`` is resumed by
the next run. The lock is removed when the writer ends, normally or by an exception (Ctrl-C included).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from raykit.errors import StoreLockedError

__all__ = ["holding_store_lock", "lock_path", "read_lock", "store_lock"]

F = TypeVar("F", bound=Callable[..., Any])


def lock_path(dst: str | os.PathLike[str]) -> Path:
    """``<dst>.lock``: beside the store, so it is not part of the store's files."""
    dst = Path(dst)
    return dst.with_name(dst.name + ".lock")


def read_lock(path: Path) -> dict[str, Any]:
    """The owner record of lock file ``path`` (empty when unreadable, e.g. half written)."""
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _refuse(dst: Path, path: Path) -> StoreLockedError:
    owner = read_lock(path)
    pid, host = owner.get("pid"), owner.get("host", "?")
    who = f"pid {pid} on host {host}" + (f", since {owner['started']}" if "started" in owner else "")
    if host == socket.gethostname() and isinstance(pid, int) and not _alive(pid):
        return StoreLockedError(
            f"{dst}: stale lock {path} left by {who}, which no longer runs (killed?); if no other "
            f"conversion writes {dst}, remove the lock (rm {path}) and rerun: the interrupted "
            "conversion resumes"
        )
    return StoreLockedError(
        f"{dst}: another process is writing this store ({who}, lock {path}); wait for it to finish, "
        f"or, if it is gone, remove {path}"
    )


@contextlib.contextmanager
def store_lock(dst: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``<dst>.lock`` for the duration of the block.

    Raises:
        StoreLockedError: another writer holds it (or a killed one left it), named in the message.
    """
    dst = Path(dst)
    path = lock_path(dst)
    path.parent.mkdir(parents=True, exist_ok=True)
    owner = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv)[:500],
    }
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise _refuse(dst, path) from None
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(owner, handle)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            if read_lock(path).get("pid") == owner["pid"]:
                path.unlink()


def holding_store_lock(argument: str) -> Callable[[F], F]:
    """Decorate a writer so that it runs holding the lock of the store named by parameter ``argument``."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            dst = signature.bind(*args, **kwargs).arguments[argument]
            with store_lock(dst):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
