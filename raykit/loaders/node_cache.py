"""``NodeImageCache``: one decoded-image cache per machine, shared by every rank and loader that serves
the same images (``ImageLoader(cache="node")``), with one byte budget.

Where: a directory ``/dev/shm/raykit-node-<key>`` (``RAYKIT_NODE_CACHE_DIR`` overrides the parent),
``key`` a digest of the store's fingerprint, the split and what shapes the pixels (undistortion, the
pickled ``transform``), so loaders of different images never share one. Each image is one ``.npy``
file in it, mapped copy-on-write by every process that reads it: the pages are in memory once per
machine (tmpfs), whatever the number of ranks.

Rules, each safe against a process killed at any instruction (``SIGKILL`` included), because every
lock is an ``flock`` the kernel drops with its holder:

* **written once, atomically**: an image is written to ``tmp-<pid>-<name>`` and renamed; a file with
  its final name is always complete. A dead writer's temporary files are removed by the next process
  that opens the cache.
* **decoded once per machine**: a process that misses takes the image's lock (``locks/<name>``), looks
  again, and only then decodes; another rank asking for it meanwhile waits for the lock and reads the
  file. A decoder that dies releases the lock, and the waiter decodes.
* **one budget**: admission (sum of the images' bytes + this one <= ``capacity``) is decided under
  ``admit.lock``. Nothing is evicted (as :class:`~raykit.loaders.cache.ImageCache`); an image that does
  not fit is served without being kept.
* **no segment left behind**: every user holds a shared lock on ``users`` for as long as it has the
  cache open; whoever closes it last (``close``, garbage collection, interpreter exit) and can then take
  the lock exclusively removes the directory. A directory no process holds (every user killed) is
  removed by the next ``NodeImageCache`` opened on the machine, whatever its key.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import ConfigError
from raykit.loaders.cache import CacheStats
from raykit.store import RawRays

__all__ = [
    "NODE_CACHE_PREFIX",
    "NodeImageCache",
    "NodeRays",
    "check_cache_kind",
    "node_cache_root",
    "sweep_stale",
]

NODE_CACHE_PREFIX = "raykit-node-"


def node_cache_root() -> Path:
    """The parent of node caches: ``$RAYKIT_NODE_CACHE_DIR`` or ``/dev/shm`` (memory, not disk)."""
    return Path(os.environ.get("RAYKIT_NODE_CACHE_DIR", "/dev/shm"))


@contextlib.contextmanager
def _flocked(path: Path, mode: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # drops the lock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Remove every node cache under ``root`` that no live process holds; the directories removed."""
    root = node_cache_root() if root is None else root
    removed = []
    for folder in sorted(root.glob(NODE_CACHE_PREFIX + "*")) if root.is_dir() else []:
        users = folder / "users"
        try:
            fd = os.open(users, os.O_RDWR)
        except OSError:
            continue  # being created (users comes first) or already gone
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)
        removed.append(folder)
    return removed


class NodeImageCache:
    """The shared cache (see the module docstring), with the interface of
    :class:`~raykit.loaders.cache.ImageCache` for one loader: keys are hashable, here ``(level,
    position)`` tuples of ints. Counters (``stats``) are this process's (``bytes`` / ``items``: the
    whole machine's); ``decoded`` counts the images this process loaded because no process had them.

    Args:
        key: what the cached pixels are (hashed into the directory name).
        capacity: the machine's byte budget for this cache.
    """

    def __init__(self, key: str, capacity: int) -> None:
        self.capacity = int(capacity)
        self.key = key
        self.root = node_cache_root() / (NODE_CACHE_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:24])
        self._lock = threading.Lock()
        self.hits = self.misses = self.decoded = 0
        self._finalizer: Any = None
        self._enter()

    def _enter(self) -> None:
        """Join the cache (again, after ``close``)."""
        if self._finalizer is not None and self._finalizer.alive:
            return
        try:
            sweep_stale(self.root.parent)
            users = self._join()
            (self.root / "locks").mkdir(exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"node cache: {self.root}: cannot use it ({exc.strerror or exc})") from None
        self._remove_dead_temporaries()
        self._maps: dict[str, np.ndarray] = {}
        self._finalizer = weakref.finalize(self, NodeImageCache._leave, self.root, users, self._maps)

    def _join(self) -> int:
        """Hold a shared lock on ``users`` of a directory that is (still) this cache's."""
        while True:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / "users", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:  # a last user may have removed the directory between our open and our lock
                same = os.stat(self.root / "users").st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    @staticmethod
    def _leave(root: Path, users: int, maps: dict[str, np.ndarray]) -> None:
        maps.clear()
        os.close(users)
        sweep_stale_one(root)

    def close(self) -> None:
        """Leave the cache (the last user removes it); any later use joins it again. Idempotent."""
        self._finalizer()

    def _remove_dead_temporaries(self) -> None:
        for path in self.root.glob("tmp-*"):
            pid = path.name.split("-")[1]
            if pid.isdigit() and not _pid_alive(int(pid)):
                path.unlink(missing_ok=True)

    @staticmethod
    def _name(key: Hashable) -> str:
        parts = key if isinstance(key, tuple) else (key,)
        return "_".join(str(int(part)) for part in parts)

    def _open(self, name: str) -> np.ndarray | None:
        known = self._maps.get(name)
        if known is not None:
            return known
        try:
            array = np.load(self.root / f"{name}.npy", mmap_mode="c")
        except FileNotFoundError:
            return None
        with self._lock:
            self._maps[name] = array
        return array

    def get(self, key: Hashable) -> Any:
        self._enter()
        array = self._open(self._name(key))
        with self._lock:
            if array is None:
                self.misses += 1
            else:
                self.hits += 1
        return array

    def __contains__(self, key: Hashable) -> bool:
        self._enter()
        name = self._name(key)
        return name in self._maps or (self.root / f"{name}.npy").exists()

    def put(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` (an array) for every process if it fits the budget and is not there yet."""
        self._enter()
        name = self._name(key)
        final = self.root / f"{name}.npy"
        array = np.ascontiguousarray(value)
        with _flocked(self.root / "admit.lock", fcntl.LOCK_EX):
            if final.exists() or self._used() + array.nbytes > self.capacity:
                return
            temporary = self.root / f"tmp-{os.getpid()}-{threading.get_ident()}-{name}.npy"
            with open(temporary, "wb") as handle:
                np.save(handle, array)
            os.rename(temporary, final)

    def get_or_load(self, key: Hashable, load: Callable[[], Any]) -> Any:
        """The image, decoded by ``load()`` in this process only when no process has it (module
        docstring: decoded once per machine)."""
        self._enter()
        name = self._name(key)
        found = self._open(name)
        if found is None:
            with _flocked(self.root / "locks" / name, fcntl.LOCK_EX):
                found = self._open(name)
                if found is None:
                    value = load()
                    self.put(key, value)
                    with self._lock:
                        self.misses += 1
                        self.decoded += 1
                    return self._open(name) if (self.root / f"{name}.npy").exists() else value
        with self._lock:
            self.hits += 1
        return found

    def _used(self) -> int:
        self._enter()
        return sum(entry.stat().st_size for entry in os.scandir(self.root) if entry.name.endswith(".npy")
                   and not entry.name.startswith("tmp-"))  # fmt: skip

    def held(self, which: Callable[[Hashable], bool]) -> list[Hashable]:
        self._enter()
        keys = [
            tuple(int(p) for p in entry.name[: -len(".npy")].split("_"))
            for entry in os.scandir(self.root)
            if entry.name.endswith(".npy") and not entry.name.startswith("tmp-")
        ]
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


def sweep_stale_one(root: Path) -> None:
    """Remove ``root`` if no process holds it (the last user leaving)."""
    try:
        fd = os.open(root / "users", os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return
    shutil.rmtree(root, ignore_errors=True)
    os.close(fd)


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
