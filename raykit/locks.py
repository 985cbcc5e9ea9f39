"""One writer per folder: ``<dst>.lock``, a file beside the destination (a store, a ``raykit run`` or
``raykit sweep`` folder) naming its owner (``{"pid", "host", "started", "command"}``), ``flock``ed while
its writer runs (docs/reliability.md).

The kernel drops the lock when the process ends in any way, so a second writer while the owner runs
fails with :class:`~raykit.errors.StoreLockedError` naming the owner, and a lock file left by a killed
writer is stale: reported (:class:`StaleLockWarning`, naming that owner) and taken over, so a rerun
resumes its work. The file is removed when the writer ends normally or by an exception. On file
systems without ``flock`` for other hosts, a writer on another host is not seen.

A lock file may lie in a folder others can write (a received run folder, a shared sticky folder): it
is created ``O_EXCL | O_NOFOLLOW``, or opened ``O_NOFOLLOW`` and used only if it is a regular file of
this user with one name, so a planted symlink, hard link, FIFO or device is refused (one line naming
it, ``StoreError``) and never truncated, written nor read through.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import json
import os
import socket
import stat
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from raykit.errors import StaleLockWarning, StoreError, StoreLockedError
from raykit.fileio import loads_json, open_regular

__all__ = ["holding_store_lock", "lock_owner", "lock_path", "read_lock", "store_lock"]


F = TypeVar("F", bound=Callable[..., Any])
LOCK_LIMIT = 64 << 10  # bytes read of a lock file's owner record (about 600 are written)


def lock_path(dst: str | os.PathLike[str]) -> Path:
    """``<dst>.lock``: beside the store, so it is not part of the store's files."""
    dst = Path(dst)
    return dst.with_name(dst.name + ".lock")


def read_lock(path: Path) -> dict[str, Any]:
    """The owner record of lock file ``path`` (empty when unreadable, e.g. half written, or when it is
    not a regular file: a symlink, a FIFO or a device is never followed nor read)."""
    try:
        with open_regular(path, follow=False) as handle:
            return _owner_record(handle.read(LOCK_LIMIT), path)
    except (OSError, ValueError):
        return {}


def lock_owner(path: Path) -> dict[str, Any] | None:
    """The owner record of lock file ``path`` while a running process holds it (its ``flock``), else
    None. Looked up without taking the lock (a reader must not make a starting writer fail): in
    ``/proc/locks`` on Linux, else by the recorded pid being alive on this host."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
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


def _open_lock(path: Path, what: str) -> int:
    """A read-write descriptor of lock file ``path``: created here (``O_EXCL``), or an existing one that
    is a regular file of this user with one name; never through a symlink (``O_NOFOLLOW``), never a
    FIFO or device (``O_NONBLOCK``, then ``fstat``).
    """
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if os.path.islink(path):
            raise StoreError(
                f"{path}: the {what}'s lock file is a symlink; not followed nor written (remove it if "
                "you did not put it there)"
            ) from None
        raise StoreError(f"{path}: cannot open the {what}'s lock file ({exc.strerror or exc})") from None
    info = os.fstat(fd)
    problem = (
        f"{_kind(info.st_mode)}, not a regular file"
        if not stat.S_ISREG(info.st_mode)
        else f"owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
        if info.st_uid != os.geteuid()
        else f"a file of {info.st_nlink} names (a hard link)"
        if info.st_nlink != 1
        else None
    )
    if problem is not None:
        os.close(fd)
        raise StoreError(f"{path}: the {what}'s lock file is {problem}; not written (remove it if stale)")
    return fd


def _acquire(path: Path, dst: Path, what: str) -> int:
    """An open descriptor of ``path`` holding its ``flock``; raises ``StoreLockedError`` if taken."""
    while True:
        fd = _open_lock(path, what)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(
                f"{dst}: another process is writing this {what} ({_who(read_lock(path))}, "
                f"lock {path}); wait for it to finish"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.lstat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file its previous owner unlinked between our open and our flock
            return fd
        os.close(fd)


def _kind(mode: int) -> str:
    return "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a device or socket"


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
    except StoreError:
        raise
    except OSError as exc:
        raise StoreError(
            f"{path}: cannot create the {what}'s lock file ({exc.strerror or exc}); choose a "
            "destination in a writable folder"
        ) from None
    try:
        stale = _owner_record(os.pread(fd, LOCK_LIMIT, 0), path)
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


def _owner_record(data: bytes, path: Path) -> dict[str, Any]:
    """The owner record in a lock file's bytes ``data`` (empty when not a JSON object)."""
    try:
        owner = loads_json(data, str(path), limit=LOCK_LIMIT)
    except ValueError:
        return {}
    return owner if isinstance(owner, dict) else {}


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
