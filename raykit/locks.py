"""One writer per folder: ``<dst>.lock``, a file beside the destination (a store, a ``raykit run`` or
``raykit sweep`` folder) naming its owner (``{"pid", "host", "started", "command"}``), ``flock``ed while
its writer runs (docs/reliability.md).

The kernel drops the lock when the process ends in any way, so a second writer while the owner runs
fails with :class:`~raykit.errors.StoreLockedError` naming the owner, and a lock file left by a killed
writer is stale: reported (:class:`StaleLockWarning`, naming that owner) and taken over, so a rerun
resumes its work. The file is removed when the writer ends normally or by an exception. On file
systems without ``flock`` for other hosts, a writer on another host is not seen.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import json
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from raykit.errors import StaleLockWarning, StoreError, StoreLockedError

__all__ = ["holding_store_lock", "lock_owner", "lock_path", "read_lock", "store_lock"]


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


def lock_owner(path: Path) -> dict[str, Any] | None:
    """The owner record of lock file ``path`` while a running process holds it (its ``flock``), else
    None. Looked up without taking the lock (a reader must not make a starting writer fail): in
    ``/proc/locks`` on Linux, else by the recorded pid being alive on this host."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    owner = read_lock(path)
    try:
        with open("/proc/locks") as handle:
            table = handle.read()
    except OSError:
        alive = owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int)
        if alive:
            try:
                os.kill(owner["pid"], 0)
            except ProcessLookupError:
                alive = False
            except PermissionError:
                pass
        return owner if alive else None
    for line in table.splitlines():
        fields = line.split()
        if "FLOCK" not in fields or len(fields) < 6:
            continue
        device = next((f for f in fields if f.count(":") == 2), "")
        try:
            major, minor, inode = device.split(":")
            same = (int(major, 16), int(minor, 16), int(inode)) == (
                os.major(info.st_dev),
                os.minor(info.st_dev),
                info.st_ino,
            )
        except ValueError:
            continue
        if same:
            return owner or {"pid": "?"}
    return None


def _who(owner: dict[str, Any]) -> str:
    who = f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}"
    return who + (f", since {owner['started']}" if "started" in owner else "")


def _acquire(path: Path, dst: Path, what: str) -> int:
    """An open descriptor of ``path`` holding its ``flock``; raises ``StoreLockedError`` if taken."""
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(
                f"{dst}: another process is writing this {what} ({_who(read_lock(path))}, "
                f"lock {path}); wait for it to finish"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file its previous owner unlinked between our open and our flock
            return fd
        os.close(fd)


@contextlib.contextmanager
def store_lock(
    dst: str | os.PathLike[str], *, path: Path | None = None, what: str = "store"
) -> Iterator[Path]:
    """Hold ``<dst>.lock`` (or lock file ``path``) for the duration of the block; ``what`` names the
    thing written in messages (``raykit run`` holds ``OUT/run.lock`` this way, ``what="run folder"``).

    Raises:
        StoreLockedError: another running writer holds it, named in the message.
    """
    dst = Path(dst)
    path = lock_path(dst) if path is None else path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _acquire(path, dst, what)
    except StoreLockedError:
        raise
    except OSError as exc:
        raise StoreError(
            f"{path}: cannot create the {what}'s lock file ({exc.strerror or exc}); choose a "
            "destination in a writable folder"
        ) from None
    try:
        stale = read_lock(path)
        if stale:
            warnings.warn(
                f"{dst}: stale lock {path} left by {_who(stale)}, which no longer runs (killed?); "
                "taking it over and resuming that writer's work",
                StaleLockWarning,
                stacklevel=4,
            )
        owner = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(sys.argv)[:500],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode(), 0)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # while still holding it: a waiting opener re-checks the inode
        os.close(fd)


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
