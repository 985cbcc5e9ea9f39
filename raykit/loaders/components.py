"""Per-image components (masks, depth maps): which a loader serves, how they are read and held.

A store may hold, per image, a ``mask`` (uint8 (H, W), 0 = pixel not used, 1..255 used) and a ``depth``
map (float32 (H, W), metres when the store says so, 0 = unknown): ``RayStore.components`` and
``RayStore.read_component``. The loaders serve those their ``components`` option names
(:func:`served_components`; by default every one the store has): ``RayLoader`` gathers each ray's
values (:mod:`raykit.loaders.component_gather`); ``ImageLoader`` reads an image's components at the
loader's level (:func:`read_components`: the store's ``downscale_mask``/``downscale_depth`` rules) and,
with ``undistort``, resampled by the nearest sample (:meth:`raykit.image_geometry.RemapTable.apply_nearest`:
no value made up at edges); :func:`read_split_components`: those of several images at once, the same
values.

Reading: the stored arrays of images lying together in a file are read with one range read
(``RayStore.read_split_components``), each checked against its CRC-32C and its ``.npy`` header; an
``ImageLoader`` miss reads the next images of the epoch's order.

Memory: components that take at most half of the loader's ``cache_bytes`` are held in memory, within it
(:func:`component_budget`; the pixels' cache gets the rest). ``RayLoader`` holds larger ones in an
unlinked scratch file in the temporary directory (``TMPDIR``), memory-mapped (:func:`scratch_array`):
the operating system's page cache keeps what memory allows, the pixels keep the whole budget, and
nothing is left behind when the process ends, however it ends. Without room for the file there, and in
``ImageLoader``, they are held per image within half the budget (in ``RayLoader`` an LRU: slow, a
warning says so). Components of a float16 depth store are held as float16 (exact), served as float32.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raykit.errors import ConfigError
from raykit.image_geometry import RemapTable
from raykit.imagedecode import downscale_nearest
from raykit.loaders.config import COMPONENTS
from raykit.store import RayStore

__all__ = [
    "ImageComponents",
    "component_budget",
    "component_bytes",
    "held_dtype",
    "read_components",
    "read_split_components",
    "record_dtype",
    "scratch_array",
    "scratch_file",
    "served_components",
]


def served_components(store: Any, requested: Sequence[str] | None) -> tuple[str, ...]:
    """The components a loader of ``store`` serves: ``requested`` (each of which the store must have),
    or with None every component of :data:`~raykit.loaders.config.COMPONENTS` the store has (none for a
    chunk source that is not a store).

    Raises:
        ConfigError: a requested component the store lacks (one line naming the store).
    """
    have = store.components if isinstance(store, RayStore) else {}
    if requested is None:
        return tuple(name for name in COMPONENTS if name in have)
    missing = [name for name in requested if name not in have]
    if missing:
        where = getattr(store, "url", None) or type(store).__name__
        held = ", ".join(sorted(have)) or "none"
        raise ConfigError(f"loader: {where}: no component {missing[0]!r} to serve (the store has: {held})")
    return tuple(requested)


def held_dtype(store: RayStore, name: str) -> np.dtype:
    """How component ``name`` is held in a loader's cache: uint8 masks, depth as stored (float16 or
    float32; read as float32, held as float16 only when stored so, which is exact)."""
    if name == "mask":
        return np.dtype(np.uint8)
    return np.dtype(np.float16 if store.components[name].dtype == "float16" else np.float32)


def record_dtype(store: RayStore, names: Sequence[str]) -> np.dtype:
    """The record of a pixel's components ``names`` as held (:func:`held_dtype`), its fields aligned:
    1, 2, 4 or 8 bytes for a mask and a depth (a uint8 mask and a float32 depth: 8)."""
    return np.dtype([(name, held_dtype(store, name)) for name in names], align=True)


def component_bytes(
    store: RayStore, names: Sequence[str], rows: Sequence[int] | np.ndarray, records: bool = False
) -> int:
    """Bytes the components ``names`` of table rows ``rows`` take at full resolution, as held: an array
    per component, or with ``records`` one array of :func:`record_dtype`."""
    pixels = int(np.asarray(store.table.n_pixels)[np.asarray(rows, dtype=np.int64)].sum())
    if records:
        return pixels * record_dtype(store, names).itemsize
    return pixels * sum(held_dtype(store, name).itemsize for name in names)


def component_budget(cache_bytes: int, need: int, scratch: bool = False) -> int:
    """The share of a loader's ``cache_bytes`` its components take: what they ``need``, at most half of
    it. With ``scratch`` (``RayLoader``), none when they need more than half and the temporary directory
    has room for them: they are held in a scratch file (:func:`scratch_array`) and the pixels keep the
    whole budget."""
    need, half = int(need), int(cache_bytes) // 2
    if need > half and scratch and scratch_room(need):
        return 0
    return min(need, half)


SCRATCH_SPARE = 1 << 30  # a scratch file is made only when this much more is free beside it


def scratch_room(nbytes: int) -> bool:
    """Whether the temporary directory has room for a scratch file of ``nbytes`` (and
    :data:`SCRATCH_SPARE` more)."""
    try:
        return shutil.disk_usage(tempfile.gettempdir()).free >= int(nbytes) + SCRATCH_SPARE
    except OSError:
        return False


def scratch_file(nbytes: int) -> Any:
    """An unlinked temporary file (gone when closed, or when the process ends, however) of ``nbytes``
    zeros, in the temporary directory, its blocks allocated: a full disk is an ``OSError`` here, not a
    SIGBUS on a later write through a map of it (and filling its pages costs 4x less than a sparse
    file's)."""
    file = tempfile.TemporaryFile(prefix="raykit-components-")  # noqa: SIM115 (returned open; unlinked)
    try:
        file.truncate(nbytes)
        os.posix_fallocate(file.fileno(), 0, nbytes)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):  # else: sparse, as truncated
            file.close()
            raise OSError(
                error.errno,
                f"loader: no room for a {nbytes}-byte scratch file in {tempfile.gettempdir()} "
                "(set TMPDIR to a disk with room)",
            ) from error
    return file


def mapped(file: Any, n: int, dtype: np.dtype | type) -> np.ndarray:
    """(n,) ``dtype`` over ``file`` memory-mapped: a plain ndarray whose ``base`` is the ``np.memmap``
    (slicing an ``np.memmap`` runs its Python ``__array_finalize__`` per slice). The map keeps its own
    descriptor: ``file`` may close."""
    return np.asarray(np.memmap(file, dtype=dtype, mode="r+", shape=(n,)))


def scratch_array(n: int, dtype: np.dtype | type) -> np.ndarray:
    """(n,) zeros of ``dtype`` in a :func:`scratch_file`, memory-mapped: pages the operating system may
    drop and read back, not the process's memory; the file goes when the array does."""
    dtype = np.dtype(dtype)
    if n == 0:
        return np.zeros(0, dtype)
    with scratch_file(n * dtype.itemsize) as file:
        return mapped(file, n, dtype)


def write_at(file: Any, values: np.ndarray, offset: int) -> None:
    """Write contiguous ``values`` into ``file`` at byte ``offset`` (no page faults, unlike a store
    through a map: one write fault per page)."""
    view = memoryview(np.ascontiguousarray(values).view(np.uint8).reshape(-1).data)
    while len(view):
        done = os.pwrite(file.fileno(), view, offset)
        view, offset = view[done:], offset + done


def held_array(n: int, dtype: np.dtype | type, in_memory: bool) -> np.ndarray:
    """(n,) zeros of ``dtype``: in memory, or with ``in_memory`` False in a :func:`scratch_array`."""
    return np.zeros(n, dtype) if in_memory else scratch_array(n, dtype)


@dataclass
class ImageComponents:
    """One image's components as an ``ImageLoader`` caches them: name -> (H, W) array."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def read_components(
    store: RayStore,
    image_name: str,
    names: Sequence[str],
    downscale: int = 1,
    remap: RemapTable | None = None,
) -> ImageComponents:
    """Components ``names`` of image ``image_name`` at level ``downscale`` (the size of
    ``read_image(image_name, downscale=...)``), resampled by ``remap``'s nearest samples when given,
    held as :func:`held_dtype` says."""
    arrays = {}
    for name in names:
        array = store.read_component(name, image_name, downscale=downscale)
        arrays[name] = _as_held(store, name, array, remap)
    return ImageComponents(arrays)


def read_split_components(
    store: RayStore,
    split: str,
    local: Sequence[int],
    names: Sequence[str],
    downscale: int = 1,
    remap: Callable[[int], RemapTable | None] | None = None,
) -> dict[int, ImageComponents]:
    """:func:`read_components` of images ``local`` (indices within ``split``) at once: each component's
    stored bytes of images lying together read in one go (``RayStore.read_split_components``), the
    same values. ``remap(i)``: image ``i``'s undistortion table (or None)."""
    out = {int(i): ImageComponents() for i in local}
    for name in names:
        for i, array in store.read_split_components(name, split, out):
            table = None if remap is None else remap(i)
            out[i].arrays[name] = _as_held(store, name, downscale_nearest(array, downscale), table)
    return out


def _as_held(store: RayStore, name: str, array: np.ndarray, remap: RemapTable | None) -> np.ndarray:
    """A component at its level, resampled by ``remap`` when given, as :func:`held_dtype` holds it."""
    if remap is not None:
        array = remap.apply_nearest(array)
    return np.ascontiguousarray(array, dtype=held_dtype(store, name))
