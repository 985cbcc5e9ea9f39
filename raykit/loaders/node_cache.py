"""``NodeImageCache``: one decoded-image cache per machine and user, shared by every rank and loader
of that user that serves the same images (``ImageLoader(cache="node")``), with one byte budget.

Where: a folder ``/dev/shm/raykit-node-<uid>-<key>`` (``RAYKIT_NODE_CACHE_DIR`` overrides the parent),
``uid`` the user's, ``key`` a digest of everything that shapes the pixels (:func:`image_node_cache`:
the store's content fingerprint, the split, undistortion, the transform's code, its dtype and
channels; the level is in each entry's name), so loaders of different images never share one. Each
image is one ``.npy`` file in it, mapped copy-on-write by every process that reads it: the pages are
in memory once per machine (tmpfs), whatever the number of ranks.

Private (:mod:`raykit.loaders.node_folder`): the folder is this user's, ``0700``, never a symlink;
its files are regular files of this user's, opened without following links or waiting on FIFOs. An
entry is served only if its header gives the shape and dtype the loader expects for that image
(``entry``); a file of another shape or dtype, or not an ``.npy``, is removed and the image decoded
again (``refused`` counts them).

Rules, each safe against a process killed at any instruction (``SIGKILL`` included), because every
lock is an ``flock`` the kernel drops with its holder:

* **written once, atomically**: an image is written to ``tmp-<pid>-<thread>-<name>`` (``O_EXCL``,
  ``0600``) and renamed; a file with its final name is always complete. A dead writer's temporary
  files are removed by the next process that opens the cache.
* **decoded once per machine**: a process that misses takes the image's lock (``lock-<name>``), looks
  again, and only then decodes; another rank asking for it meanwhile waits for the lock and reads the
  file. A decoder that dies releases the lock, and the waiter decodes.
* **one budget**: admission (the entries' file bytes + this one's <= ``capacity``) is decided under
  ``admit.lock``, for every process of the machine together. Nothing is evicted (as
  :class:`~raykit.loaders.cache.ImageCache`); an image that does not fit is served without being kept.
* **no folder left behind**: every user holds a shared lock on ``users`` for as long as it has the
  cache open; whoever closes it last (``close``, garbage collection, interpreter exit) and can then take
  the lock exclusively removes the folder. A folder of this user's that no process holds (every user
  killed) is removed by the next ``NodeImageCache`` the user opens, whatever its key; other users'
  folders are never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import re
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import ConfigError
from raykit.imagedecode import level_size
from raykit.loaders.cache import CacheStats
from raykit.loaders.node_folder import (
    NODE_CACHE_PREFIX,
    NodeCacheError,
    flocked,
    node_cache_root,
    open_file,
    own_prefix,
    pid_alive,
    private_folder,
    remove_if_unheld,
    same_entry,
    same_path,
    sweep_stale,
)
from raykit.loaders.node_key import transform_key
from raykit.store import RawRays

__all__ = [
    "NODE_CACHE_PREFIX",
    "NodeCacheError",
    "NodeImageCache",
    "NodeRays",
    "check_cache_kind",
    "image_node_cache",
    "node_cache_root",
    "sweep_stale",
]

Entry = Callable[[Any], tuple[tuple[int, ...], np.dtype[Any]]]
_ENTRY = re.compile(r"\d+(_\d+)*\.npy")


class NodeImageCache:
    """The shared cache (see the module docstring), with the interface of
    :class:`~raykit.loaders.cache.ImageCache` for one loader: keys are hashable, here ``(level,
    position)`` tuples of ints. Counters (``stats``) are this process's (``bytes`` / ``items``: the
    whole machine's); ``decoded`` counts the images this process loaded because no process had them,
    ``refused`` the entries it removed because they were not of their image's shape and dtype.

    Args:
        key: what the cached pixels are (hashed into the folder's name).
        capacity: the machine's byte budget for this cache (entries' file bytes, headers included).
        entry: ``entry(key) -> (shape, dtype)`` of the array image ``key`` is; nothing else is served.

    Raises:
        NodeCacheError: the folder or a file in it is not this user's private one.
    """

    def __init__(self, key: str, capacity: int, entry: Entry) -> None:
        self.capacity, self.key, self.entry = int(capacity), key, entry
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        self.root = node_cache_root() / f"{own_prefix()}{digest}"
        self._lock = threading.Lock()
        self.hits = self.misses = self.decoded = self.refused = 0
        self._finalizer: Any = None
        self._enter()

    def _enter(self) -> None:
        """Join the cache (again, after ``close``)."""
        if self._finalizer is not None and self._finalizer.alive:
            return
        try:
            sweep_stale(self.root.parent)
            folder, users = self._join()
        except NodeCacheError:
            raise
        except OSError as exc:
            raise ConfigError(f"node cache: {self.root}: cannot use it ({exc.strerror or exc})") from None
        self._folder = folder
        self._remove_dead_temporaries()
        self._maps: dict[str, np.ndarray] = {}
        self._finalizer = weakref.finalize(self, NodeImageCache._leave, self.root, folder, users, self._maps)

    def _join(self) -> tuple[int, int]:
        """Hold a shared lock on ``users`` of a folder that is (still) this cache's."""
        while True:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            try:
                folder = private_folder(self.root, create=True)
            except FileNotFoundError:  # removed by its last user between our mkdir and open
                continue
            try:
                users = open_file(folder, "users", self.root, os.O_RDWR | os.O_CREAT)
            except FileNotFoundError:  # removed by its last user between our open and this one
                os.close(folder)
                continue
            except BaseException:
                os.close(folder)
                raise
            fcntl.flock(users, fcntl.LOCK_SH)
            if same_path(self.root, folder) and same_entry(folder, "users", users):
                return folder, users
            os.close(users)  # the last user removed it between our open and our lock
            os.close(folder)

    @staticmethod
    def _leave(root: Path, folder: int, users: int, maps: dict[str, np.ndarray]) -> None:
        maps.clear()
        os.close(users)
        remove_if_unheld(root, folder)
        os.close(folder)

    def close(self) -> None:
        """Leave the cache (the last user removes it); any later use joins it again. Idempotent."""
        self._finalizer()

    def _remove_dead_temporaries(self) -> None:
        for name in os.listdir(self._folder):
            pid = name.split("-")[1] if name.startswith("tmp-") else ""
            if pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=self._folder)

    @staticmethod
    def _name(key: Hashable) -> str:
        parts = key if isinstance(key, tuple) else (key,)
        return "_".join(str(int(part)) for part in parts)

    def _map(self, key: Hashable, name: str) -> np.ndarray | None:
        """Entry ``name`` mapped copy-on-write if it is the array ``key`` must be; a file of another
        shape or dtype is removed (None)."""
        try:
            fd = open_file(self._folder, f"{name}.npy", self.root)
        except FileNotFoundError:
            return None
        shape, dtype = self.entry(key)
        with open(fd, "rb", closefd=True) as handle:
            try:
                version = np.lib.format.read_magic(handle)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else None
                read = np.lib.format.read_array_header_2_0 if version == (2, 0) else read
                got = read(handle) if read is not None else None
            except ValueError:  # not an .npy file
                got = None
            size = handle.tell() + int(np.prod(shape)) * dtype.itemsize
            if got != (tuple(shape), False, dtype) or os.fstat(fd).st_size != size:
                self._evict(fd, name)
                return None
            return np.memmap(handle, dtype, "c", handle.tell(), tuple(shape))

    def _evict(self, fd: int, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            if same_entry(self._folder, f"{name}.npy", fd):
                os.unlink(f"{name}.npy", dir_fd=self._folder)
        with self._lock:
            self.refused += 1

    def _open(self, key: Hashable) -> np.ndarray | None:
        name = self._name(key)
        known = self._maps.get(name)
        if known is not None:
            return known
        array = self._map(key, name)
        if array is not None:
            with self._lock:
                self._maps[name] = array
        return array

    def get(self, key: Hashable) -> Any:
        self._enter()
        array = self._open(key)
        with self._lock:
            if array is None:
                self.misses += 1
            else:
                self.hits += 1
        return array

    def __contains__(self, key: Hashable) -> bool:
        self._enter()
        return self._open(key) is not None

    def put(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` (an array of ``entry(key)``'s shape and dtype) for every process if it fits
        the budget and is not there yet."""
        self._enter()
        name, array = self._name(key), np.ascontiguousarray(value)
        shape, dtype = self.entry(key)
        if array.shape != tuple(shape) or array.dtype != dtype:
            raise ConfigError(
                f"node cache: image {key} is {array.shape} {array.dtype}, expected {tuple(shape)} {dtype}"
                " (a transform keeps H and W, and its channels and dtype are those of a 1x1 image)"
            )
        header = _npy_header(array)
        with flocked(self._folder, "admit.lock", self.root, fcntl.LOCK_EX):
            if self._exists(f"{name}.npy") or self._used() + len(header) + array.nbytes > self.capacity:
                return
            temporary = f"tmp-{os.getpid()}-{threading.get_ident()}-{name}.npy"
            with contextlib.suppress(FileNotFoundError):  # a dead thread's of this pid and ident
                os.unlink(temporary, dir_fd=self._folder)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            fd = open_file(self._folder, temporary, self.root, flags)
            try:
                with open(fd, "wb", closefd=True) as handle:
                    handle.write(header)
                    handle.write(array.data)
                os.rename(temporary, f"{name}.npy", src_dir_fd=self._folder, dst_dir_fd=self._folder)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=self._folder)
                raise

    def _exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self._folder, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def get_or_load(self, key: Hashable, load: Callable[[], Any]) -> Any:
        """The image, decoded by ``load()`` in this process only when no process has it (module
        docstring: decoded once per machine)."""
        self._enter()
        found = self._open(key)
        if found is None:
            with flocked(self._folder, f"lock-{self._name(key)}", self.root, fcntl.LOCK_EX):
                found = self._open(key)
                if found is None:
                    value = load()
                    self.put(key, value)
                    with self._lock:
                        self.misses += 1
                        self.decoded += 1
                    kept = self._open(key)
                    return value if kept is None else kept
        with self._lock:
            self.hits += 1
        return found

    def _entries(self) -> Iterator[os.DirEntry[str]]:
        with os.scandir(self._folder) as entries:
            yield from (e for e in entries if _ENTRY.fullmatch(e.name) and e.is_file(follow_symlinks=False))

    def _used(self) -> int:
        self._enter()
        return sum(entry.stat(follow_symlinks=False).st_size for entry in self._entries())

    def held(self, which: Callable[[Hashable], bool]) -> list[Hashable]:
        self._enter()
        keys = [tuple(int(p) for p in entry.name[: -len(".npy")].split("_")) for entry in self._entries()]
        return [key for key in keys if which(key)]

    def retain(self, keep: Callable[[Hashable], bool]) -> None:
        """Unmap (this process) the images ``keep`` rejects; their files stay for the other ranks,
        which may still be on that level (a shared budget is not freed by one rank)."""
        with self._lock:
            for name in list(self._maps):
                if not keep(tuple(int(p) for p in name.split("_"))):
                    del self._maps[name]

    def __len__(self) -> int:
        return len(self.held(lambda key: True))

    def stats(self) -> CacheStats:
        with self._lock:
            hits, misses = self.hits, self.misses
        return CacheStats(hits, misses, 0, self._used(), len(self), self.capacity)


def _npy_header(array: np.ndarray) -> bytes:
    """The ``.npy`` header ``np.save`` writes before ``array``'s bytes."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, np.lib.format.header_data_from_array_1_0(array))
    return buffer.getvalue()


def image_node_cache(
    store: Any,
    split: str,
    undistort: bool,
    transform: Any,
    shapes: Sequence[tuple[int, int, int]],
    capacity: int,
) -> NodeImageCache:
    """The node cache of an ``ImageLoader`` of ``split`` (``shapes``: each image's full (H, W, C)),
    keyed by everything that shapes its pixels; entry ``(level, position)`` must be (H // level,
    W // level, C') of the dtype the transform gives a 1x1 image (C' its channels).

    Raises:
        ConfigError: a transform that cannot be keyed (:func:`~raykit.loaders.node_key.transform_key`)
            or that does not keep H and W.
    """
    probe = np.zeros((1, 1, store.rgba_channels), np.uint8)
    if transform is not None:
        probe = np.asarray(transform(probe))
        if probe.ndim < 2 or probe.shape[:2] != (1, 1):
            raise ConfigError(f"image loader: cache 'node': the transform made a 1x1 image {probe.shape}")
    tail, dtype = probe.shape[2:], probe.dtype

    def entry(key: tuple[int, int]) -> tuple[tuple[int, ...], np.dtype[Any]]:
        level, position = key
        height, width, _ = shapes[position]
        return (*level_size(height, width, level), *tail), dtype

    parts = [store.fingerprint, split, str(undistort), transform_key(transform), dtype.str, str(tail)]
    return NodeImageCache("|".join(parts), capacity, entry)


def check_cache_kind(cache: Any, strategy: str, split: str) -> None:
    """``ConfigError`` unless ``cache`` is ``"process"``, or ``"node"`` on a split read as images."""
    if cache not in ("process", "node"):
        raise ConfigError(f"loader: cache: expected 'process' or 'node', got {cache!r}")
    if cache == "node" and strategy != "window":
        raise ConfigError(
            f"loader: cache 'node' shares decoded images; split {split!r} stores rays (use cache='process')"
        )


class NodeRays:
    """A :class:`NodeImageCache` holding the images-layout ``RayLoader``'s decoded images
    (``RawRays`` whose ``rgba`` is the image, row-major, and ``pid`` empty)."""

    def __init__(self, shared: NodeImageCache) -> None:
        self.shared = shared

    @property
    def capacity(self) -> int:
        return self.shared.capacity

    @staticmethod
    def _rays(rgba: Any) -> RawRays | None:
        return None if rgba is None else RawRays(rgba, np.zeros(0, np.uint32))

    def get(self, key: Hashable) -> RawRays | None:
        return self._rays(self.shared.get(key))

    def put(self, key: Hashable, value: RawRays) -> None:
        self.shared.put(key, value.rgba)

    def get_or_load(self, key: Hashable, load: Callable[[], RawRays]) -> RawRays:
        return RawRays(self.shared.get_or_load(key, lambda: load().rgba), np.zeros(0, np.uint32))

    def __contains__(self, key: Hashable) -> bool:
        return key in self.shared

    def __len__(self) -> int:
        return len(self.shared)

    def stats(self) -> CacheStats:
        return self.shared.stats()

    def leave(self) -> None:
        self.shared.close()
