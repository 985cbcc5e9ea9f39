"""The private folder of a node cache (:mod:`raykit.loaders.node_cache`) on a machine shared with
other users (docs/reliability.md, "Shared machines").

A folder is used only if it is a real folder (not a symlink), owned by this user and closed to every
other (mode ``0700``); it is created so. Every file in it is opened relative to the folder's
descriptor with ``O_NOFOLLOW | O_NONBLOCK`` and used only if it is a regular file of this user's: a
symlink, FIFO, device or socket is a :class:`NodeCacheError` naming it (never
followed, never waited on). Files are created ``0600``. Stale folders are removed only when they carry
this user's uid in their name and pass the same checks: another user's folder is never touched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from raykit.errors import RaykitError

__all__ = [
    "NODE_CACHE_PREFIX",
    "NodeCacheError",
    "flocked",
    "node_cache_root",
    "open_file",
    "own_prefix",
    "pid_alive",
    "private_folder",
    "remove_if_unheld",
    "same_entry",
    "same_path",
    "sweep_stale",
]

NODE_CACHE_PREFIX = "raykit-node-"
_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


class NodeCacheError(RaykitError, OSError):
    """A node cache folder or file that is not this user's private one (another owner, open to other
    users, a symlink, a FIFO or device); the message names it. Nothing in it was used."""


def node_cache_root() -> Path:
    """The parent of node caches: ``$RAYKIT_NODE_CACHE_DIR`` or ``/dev/shm`` (memory, not disk)."""
    return Path(os.environ.get("RAYKIT_NODE_CACHE_DIR", "/dev/shm"))


def own_prefix() -> str:
    """``raykit-node-<uid>-``: the start of the name of this user's node caches."""
    return f"{NODE_CACHE_PREFIX}{os.getuid()}-"


def _kind(mode: int) -> str:
    kinds = {stat.S_IFDIR: "a folder", stat.S_IFREG: "a regular file", stat.S_IFIFO: "a FIFO"}
    return kinds.get(stat.S_IFMT(mode), "a device or socket")


def _refuse_if_foreign(fd: int, where: Path, want: int) -> None:
    """``NodeCacheError`` (``fd`` closed) unless ``fd`` is of type ``want`` and this user's (a folder:
    closed to others)."""
    info = os.fstat(fd)
    problem = None
    if stat.S_IFMT(info.st_mode) != want:
        problem = f"{_kind(info.st_mode)}, expected {_kind(want)}"
    elif info.st_uid != os.getuid():
        problem = f"owned by uid {info.st_uid}, not by this user (uid {os.getuid()})"
    elif want == stat.S_IFDIR and info.st_mode & 0o077:  # its files are out of others' reach
        problem = f"mode {stat.S_IMODE(info.st_mode):04o} lets other users in (expected 0700)"
    if problem is not None:
        os.close(fd)
        raise NodeCacheError(f"node cache: {where}: {problem}; not used")


def _opened(open_: Callable[[], int], where: Path) -> int:
    try:
        return open_()
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NodeCacheError(f"node cache: {where}: a symbolic link or not a folder; not used") from None
        raise


def private_folder(path: Path, create: bool = False) -> int:
    """A descriptor of folder ``path`` (made ``0700`` when ``create`` and absent), checked to be a real
    folder of this user's that no other user may enter.

    Raises:
        NodeCacheError: a symlink, not a folder, another owner or an open mode, naming ``path``.
        FileNotFoundError: absent (and not ``create``).
    """
    made = False
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
            made = True
    flags = os.O_RDONLY | os.O_DIRECTORY | _FLAGS
    fd = _opened(lambda: os.open(path, flags), path)
    if made:  # the umask may have taken the owner's bits away; nobody else can have added any
        os.fchmod(fd, 0o700)
    _refuse_if_foreign(fd, path, stat.S_IFDIR)
    return fd


def open_file(folder: int, name: str, where: Path, flags: int = os.O_RDONLY) -> int:
    """``name`` in ``folder`` (a descriptor of ``where``) opened without following a symlink nor
    waiting on a FIFO, checked to be a regular file of this user's (``O_CREAT`` in ``flags``: made
    ``0600`` when absent).

    Raises:
        NodeCacheError: a symlink, FIFO, device, another owner or an open mode, naming the file.
        FileNotFoundError: absent (without ``O_CREAT``).
    """
    fd = _opened(lambda: os.open(name, flags | _FLAGS, 0o600, dir_fd=folder), where / name)
    _refuse_if_foreign(fd, where / name, stat.S_IFREG)
    return fd


@contextlib.contextmanager
def flocked(folder: int, name: str, where: Path, mode: int) -> Iterator[int]:
    """Hold ``flock(mode)`` on file ``name`` of ``folder`` (created when absent; :func:`open_file`)."""
    fd = open_file(folder, name, where, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # drops the lock


def _same(now: os.stat_result, held: os.stat_result) -> bool:
    return (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev)


def same_path(path: Path, fd: int) -> bool:
    """Whether ``path`` is still the folder or file open as ``fd``."""
    try:
        return _same(os.stat(path, follow_symlinks=False), os.fstat(fd))
    except (FileNotFoundError, NotADirectoryError):
        return False


def same_entry(folder: int, name: str, fd: int) -> bool:
    """Whether ``name`` in ``folder`` is still the file open as ``fd``."""
    try:
        return _same(os.stat(name, dir_fd=folder, follow_symlinks=False), os.fstat(fd))
    except FileNotFoundError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_if_unheld(path: Path, folder: int) -> bool:
    """Empty and remove the cache ``path`` (open as ``folder``) if no process holds its ``users``."""
    try:
        users = open_file(folder, "users", path, os.O_RDWR)
    except OSError:
        return False  # being created (users comes first), already gone, or not a cache's
    try:
        fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(users)
        return False
    for name in os.listdir(folder):  # names relative to the folder checked above: nothing is followed
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=folder)
    with contextlib.suppress(OSError):
        if same_path(path, folder):
            os.rmdir(path)
    os.close(users)
    return True


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Remove this user's node caches under ``root`` that no live process holds; the folders removed.
    Another user's folder (by name or by owner), a symlink or an open folder is never touched."""
    root = node_cache_root() if root is None else root
    removed = []
    for path in sorted(root.glob(own_prefix() + "*")) if root.is_dir() else []:
        try:
            folder = private_folder(path)
        except OSError:
            continue
        try:
            if remove_if_unheld(path, folder):
                removed.append(path)
        finally:
            os.close(folder)
    return removed
