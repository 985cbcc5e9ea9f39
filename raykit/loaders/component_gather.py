"""Per-image components served with a ``RayLoader``'s batches (what they are, how they are read and
held: :mod:`raykit.loaders.components`):

- :class:`ComponentGather` (either layout): each ray's values, gathered by its pixel id from the
  image's decoded component (decoded once per image and cached), into ``raw.extra[name]``: ``mask``
  (N,) uint8, ``depth`` (N,) float32; the batch carries them in ``RayBatch.extra``. On an images-layout
  split they are gathered per group. A flat gather decodes the rows a batch reaches with the wanted
  rows after them in file order (:data:`LOAD_AHEAD_BYTES`).
- :class:`StagedComponents` (a rays-layout split whose chunks derive their pids from the split's
  order, format 3): every image's components decoded once, each put in the image's rank order
  (``SplitOrder.stage``), so that a chunk's values are the merge of one contiguous run per image
  (``SplitOrder.merged``), as its colours were written: read sequentially, never a random gather per
  ray. They are attached to each chunk as it is read (:class:`ComponentChunkCache`) and mixed with its
  rays.
"""

from __future__ import annotations

import itertools
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from raykit.loaders.cache import ChunkCache
from raykit.loaders.components import (
    component_bytes,
    held_array,
    held_dtype,
    mapped,
    read_components,
    record_dtype,
    scratch_file,
    scratch_room,
    write_at,
)
from raykit.store import RawRays, RayStore

__all__ = ["DECODE_THREADS", "ComponentChunkCache", "ComponentGather", "StagedComponents", "WithComponents"]


DECODE_THREADS = 2  # threads decoding the components of many images at once (a flat gather's first use)
DECODE_SHARED_PIXELS = 1 << 22  # ... when they hold at least this many pixels
LOAD_AHEAD_BYTES = 16 << 20  # a flat gather decodes the rows it reaches and those after them up to this


def on_threads(work: Callable[[Any], None], parts: Sequence[Any], threads: int) -> None:
    """``work`` of each of ``parts``: on up to ``threads`` threads when there are several, else here."""
    threads = min(threads, len(parts))
    if threads > 1:
        with ThreadPoolExecutor(threads, "raykit-components") as pool:
            list(pool.map(work, parts))
    else:
        for part in parts:
            work(part)


class ComponentGather:
    """``gather(raw) -> raw`` with each ray's component values in ``raw.extra``: ``mask`` (N,) uint8,
    ``depth`` (N,) float32, gathered by pixel id (``pid = pixel_offset[image] + y * W + x``).

    Each image's components are decoded once (on first use) into one flat array of records indexed by
    pid (:func:`record_dtype`: a ray's values are one read, of 1, 2, 4 or 8 bytes, not one per
    component; pages of other images are never touched), decoded in runs (the rows reached and the
    wanted rows after them, :meth:`_with_ahead`): in memory when the ``rows``' records fit ``budget``,
    else in a scratch file; without room for one, per image in an LRU within ``budget``, the rays
    grouped by image. Safe to call from several threads (the generation threads).

    Args:
        store: the store.
        names: the components to serve.
        rows: the table rows whose rays will be gathered (the split's): once all are decoded, no
            image is looked up again (flat arrays).
        budget: bytes the decoded components may take.
    """

    def __init__(self, store: RayStore, names: Sequence[str], rows: np.ndarray, budget: int) -> None:
        self.store, self.names = store, tuple(names)
        table = store.table
        self.offsets = np.asarray(table.pixel_offset, dtype=np.int64)
        self.n_pixels = np.asarray(table.n_pixels, dtype=np.int64)
        self.splits = np.asarray(table.splits)
        self.dtypes = {name: held_dtype(store, name) for name in self.names}
        self.wanted = np.unique(np.asarray(rows, dtype=np.int64))
        # The flat arrays span the pixel ids of ``rows`` (``base`` on); only the rows' pages are touched,
        # but a span far larger than the rows (a small split spread over a large store) is not mapped.
        self.base, span = 0, 0
        if len(self.wanted):
            self.base = int(self.offsets[self.wanted].min())
            span = int((self.offsets[self.wanted] + self.n_pixels[self.wanted]).max()) - self.base
        self.record = record_dtype(store, self.names)
        per_pixel = self.per_pixel = self.record.itemsize
        self.need, self.budget = component_bytes(store, self.names, self.wanted, True), int(budget)
        # Flat arrays: in memory within the budget, else in a scratch file; per image in an LRU when
        # there is no room for one (each image decoded again whenever it left the LRU: slow).
        self.in_memory = self.need <= self.budget and span * per_pixel <= 4 * self.budget
        flat = self.in_memory or scratch_room(span * per_pixel)
        if not flat and self.need:
            warnings.warn(
                f"loader: {getattr(store, 'url', store)}: components need {self.need} bytes, more than "
                f"half the cache budget, and {tempfile.gettempdir()} has no room for a scratch file: "
                "decoding them per image (slow; set TMPDIR to a disk with room)",
                RuntimeWarning,
                stacklevel=3,
            )
        self._flat: np.ndarray | None = None
        self._words: np.ndarray | None = None  # the records as one unsigned integer each, when they fit
        self.flat_kind = "memory" if self.in_memory else "scratch" if flat else None
        self.cache: ChunkCache[np.ndarray] = ChunkCache(0 if flat else self.budget)
        self.loaded = np.zeros(len(self.offsets), dtype=bool)
        self.is_wanted = np.zeros(len(self.offsets), dtype=bool)
        self.is_wanted[self.wanted] = True
        self.span, self.block_bits = span, max(8, span.bit_length() - 16)  # at most 2**16 blocks (_reached)
        self.complete = len(self.wanted) == 0
        self._lock = threading.Lock()

    @property
    def flat(self) -> np.ndarray | None:
        """(span,) records of :func:`record_dtype`, by pid from ``base`` (made on first use: a rays-layout
        loader whose chunks carry their components never needs them), or None (the LRU)."""
        if self._flat is None and self.flat_kind is not None:
            with self._lock:
                if self._flat is None:
                    flat = held_array(self.span, self.record, self.flat_kind == "memory")
                    size = self.record.itemsize  # ``take`` copies 1, 2, 4 or 8 bytes fastest as integers
                    self._words = flat.view(f"u{size}") if size in (1, 2, 4, 8) else flat
                    self._flat = flat
        return self._flat

    def rows_of(self, pid: np.ndarray) -> np.ndarray:
        """(N,) table rows of (N,) pixel ids."""
        return np.searchsorted(self.offsets, pid, side="right").astype(np.int64) - 1

    def __call__(self, raw: RawRays) -> RawRays:
        """``raw`` with its rays' components in ``extra`` (as it is when they are there already: rays
        of chunks a :class:`ComponentChunkCache` held)."""
        if all(name in raw.extra for name in self.names):
            if all(raw.extra[name].dtype != np.float16 for name in self.names):
                return raw
            served = {name: raw.extra[name].astype(np.float32) for name in self.names if name == "depth"}
            return RawRays(raw.rgba, raw.pid, {**raw.extra, **served})
        pid = raw.pid
        return RawRays(raw.rgba, pid, {**raw.extra, **self.values(pid)})

    def attach(self, chunk: RawRays) -> None:
        """Put the components of ``chunk``'s rays into its ``extra`` (in place)."""
        if not all(name in chunk.extra for name in self.names):
            chunk.extra.update(self.values(chunk.pid))

    def values(self, pid: np.ndarray) -> dict[str, np.ndarray]:
        """(N,) pixel ids -> each component's (N,) values: uint8 masks, float32 depth."""
        flat = self.flat
        if flat is not None:
            index = pid.astype(np.intp)  # converted once; ``take`` gathers about twice as fast as ``[]``
            if self.base:
                index -= self.base
            if not self.complete:
                self._load(self._reached(index))
            assert self._words is not None
            records = np.take(self._words, index).view(self.record)
            values = {name: np.ascontiguousarray(records[name]) for name in self.names}
        else:
            values = self._by_image(pid)
        return {name: v if v.dtype != np.float16 else v.astype(np.float32) for name, v in values.items()}

    def _reached(self, index: np.ndarray) -> np.ndarray:
        """The wanted rows holding pixel ids ``base + index``, and perhaps a neighbour: the rows meeting
        the blocks of ``2**block_bits`` pixel ids reached (a bincount of blocks: O(N), where finding
        each ray's row by ``searchsorted`` costs 40 ns a ray and sorting them more)."""
        blocks = np.flatnonzero(np.bincount(index >> self.block_bits))
        first = self.base + (blocks << self.block_bits)
        last = np.minimum(first + (1 << self.block_bits), self.base + self.span) - 1
        n = len(self.offsets)
        cover = np.bincount(self.rows_of(first), minlength=n + 1) - np.bincount(
            self.rows_of(last) + 1, minlength=n + 1
        )
        rows = np.flatnonzero(np.cumsum(cover[:n]) > 0)
        return rows[self.is_wanted[rows]]

    def _load(self, rows: np.ndarray) -> None:
        """Decode the ``rows`` not decoded yet into the flat arrays."""
        missing = rows[~self.loaded[rows]]
        if len(missing) == 0:
            return
        assert self.flat is not None
        with self._lock:  # one caller decodes the missing rows; others wait for it
            todo = np.sort(missing[~self.loaded[missing]])
            if len(todo) == 0:  # another caller decoded them meanwhile
                return
            todo = self._with_ahead(todo)
            # e.g. a shuffled chunk's first read reaches every image: in parts read on a few threads
            # when there is enough to share (starting threads costs more than a few small images)
            threads = DECODE_THREADS if int(self.n_pixels[todo].sum()) >= DECODE_SHARED_PIXELS else 1
            parts = [part for part in np.array_split(todo, min(threads, len(todo))) if len(part)]
            on_threads(self._fill_rows, parts, threads)
            self.loaded[todo] = True
            self.complete = bool(self.loaded[self.wanted].all())

    def _with_ahead(self, todo: np.ndarray) -> np.ndarray:
        """``todo`` (sorted rows to decode) and the wanted rows not decoded yet that follow them in pid
        (file) order, while all of them take at most :data:`LOAD_AHEAD_BYTES` as held: rows a window
        reaches one or two at a time are decoded in runs (the flat arrays have their room already)."""
        room = LOAD_AHEAD_BYTES - int(self.n_pixels[todo].sum()) * self.per_pixel
        pending = self.wanted[~self.loaded[self.wanted]]
        pending = pending[~np.isin(pending, todo)]
        if room <= 0 or len(pending) == 0:
            return todo
        start = int(np.searchsorted(pending, todo[0]))
        pending = np.concatenate([pending[start:], pending[:start]])
        fits = int(np.searchsorted(np.cumsum(self.n_pixels[pending] * self.per_pixel), room, side="right"))
        return np.sort(np.concatenate([todo, pending[:fits]]))

    def _fill_rows(self, rows: np.ndarray) -> None:
        """Rows ``rows``' components into the flat arrays: per split and component, the stored bytes of
        images lying together read at once (``RayStore.read_split_components``)."""
        assert self.flat is not None
        splits = self.splits[rows]
        for split in dict.fromkeys(splits.tolist()):
            split_rows = self.store.split_rows(split)
            local = np.searchsorted(split_rows, rows[splits == split]).tolist()
            for name in self.names:
                flat = self.flat[name]  # the field's strided view
                for i, array in self.store.read_split_components(name, split, local):
                    lo = int(self.offsets[split_rows[i]]) - self.base
                    flat[lo : lo + array.size] = array.reshape(-1)

    def _by_image(self, pid: np.ndarray) -> dict[str, np.ndarray]:
        """Gather per image through the LRU (the store's components do not fit the budget)."""
        rows = self.rows_of(pid)
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        cuts = [0, *(np.flatnonzero(np.diff(ordered)) + 1).tolist(), len(ordered)]
        out = {name: np.empty(len(pid), dtype) for name, dtype in self.dtypes.items()}
        for lo, hi in itertools.pairwise(cuts):
            if lo == hi:
                continue
            row = int(ordered[lo])
            take = order[lo:hi]
            local = pid[take].astype(np.int64) - self.offsets[row]
            for name in self.names:
                held = self.cache.get(("image", name, row))
                if held is None:
                    held = self._one(row, name)
                    self.cache.put(("image", name, row), held)
                out[name][take] = held[local]
        return out

    def _one(self, row: int, name: str) -> np.ndarray:
        array = read_components(self.store, self.store.table.names[row], (name,)).arrays[name]
        return array.reshape(-1)


class StagedComponents:
    """A shuffled rays-layout split's components in each image's rank order, so that a chunk's values are
    read as its colours were written: one contiguous run of each image (``SplitOrder.merged``).

    A chunk whose pids derive from its split's order (format 3: ``chunk.order``, ``chunk.start``) reaches
    every image of the split, so a per-ray gather is one random read per ray and component. Staged,
    it is one sequential read per image and a blocked transpose, like the chunk's own pids: from memory,
    or from a memory-mapped scratch file at the same speed while the page cache holds it.

    Every image is decoded once, when the first chunk arrives (several at once, on
    :data:`DECODE_THREADS` threads), and put in rank order (``SplitOrder.stage``).

    Args:
        gather: the loader's :class:`ComponentGather` (its store, components, budget and where its flat
            arrays would go: in memory when they fit the budget, else a scratch file).
    """

    def __init__(self, gather: ComponentGather) -> None:
        self.store, self.names, self.dtypes = gather.store, gather.names, gather.dtypes
        self.in_memory, self.usable = gather.in_memory, gather.flat_kind is not None
        self.staged: dict[str, dict[str, np.ndarray]] = {}  # split -> component -> (n_rays,)
        self._lock = threading.Lock()

    def attach(self, chunk: RawRays) -> bool:
        """Put the components of ``chunk``'s rays into its ``extra`` (in place, as held: float16 depth
        stays float16); False when the chunk has no order to follow (pids stored, before format 3)."""
        if all(name in chunk.extra for name in self.names):
            return True
        order, start = getattr(chunk, "order", None), getattr(chunk, "start", None)
        if order is None or start is None or not self.usable:
            return False
        staged = self.staged.get(order.split) or self._stage(order)
        chunk.extra.update({name: order.merged(a, start, start + len(chunk)) for name, a in staged.items()})
        return True

    def _stage(self, order: Any) -> dict[str, np.ndarray]:
        """Decode every image's components of ``order``'s split into rank order (once per split)."""
        with self._lock:
            if order.split in self.staged:
                return self.staged[order.split]
            split = order.split
            if tuple(int(r) for r in self.store.split_rows(split)) != tuple(order.images):
                raise ValueError(f"split {split!r}: the chunks' order is not the store's")  # never: one store
            sizes = np.asarray(order.sizes, dtype=np.int64)
            at = np.concatenate([[0], np.cumsum(sizes)])
            total = int(at[-1])
            files: dict[str, Any] = {}
            staged: dict[str, np.ndarray] = {}
            if self.in_memory:
                staged = {name: np.empty(total, d) for name, d in self.dtypes.items()}
            else:  # written at offsets, then mapped
                files = {name: scratch_file(total * d.itemsize) for name, d in self.dtypes.items()}
            per_pixel = sum(d.itemsize for d in self.dtypes.values())
            # images in runs of about LOAD_AHEAD_BYTES each (one range read a run), on a few threads
            run = (np.cumsum(sizes * per_pixel) - 1) // LOAD_AHEAD_BYTES  # each image's run
            parts = [np.flatnonzero(run == r).tolist() for r in np.unique(run)]

            def fill(part: list[int]) -> None:
                for name, dtype in self.dtypes.items():
                    for i, values in self.store.read_split_components(name, split, part):
                        ranked = order.stage(i, values.reshape(-1)).astype(dtype, copy=False)
                        if files:
                            write_at(files[name], ranked, int(at[i]) * dtype.itemsize)
                        else:
                            staged[name][at[i] : at[i + 1]] = ranked

            try:
                on_threads(fill, parts, DECODE_THREADS)
                for name, file in files.items():
                    staged[name] = mapped(file, total, self.dtypes[name])
            finally:
                for file in files.values():
                    file.close()
            self.staged[split] = staged
            return staged


class ComponentChunkCache(ChunkCache[RawRays]):
    """A rays-layout loader's LRU of decoded chunks whose chunks carry their rays' components, attached
    once per chunk as it is read, then mixed with the rays: from the staged components
    (:class:`StagedComponents`) when the chunk derives its pids from the split's order, else gathered by
    pid (:meth:`ComponentGather.attach`). Chunks hold 2-5 more bytes per ray (1 for a mask, 2 or 4 for
    a depth)."""

    def __init__(self, capacity: int, gather: ComponentGather) -> None:
        super().__init__(capacity)
        self.gather, self.staged = gather, StagedComponents(gather)

    def put(self, key: Any, value: RawRays) -> None:
        if not self.staged.attach(value):
            self.gather.attach(value)
        super().put(key, value)


class WithComponents:
    """``make_batch`` after :class:`ComponentGather`: the batch maker of a loader serving components
    (``warm_up`` and the wrapped maker's other attributes passed on)."""

    def __init__(self, gather: ComponentGather, make_batch: Any) -> None:
        self.gather, self.make_batch = gather, make_batch

    def warm_up(self) -> None:
        warm_up = getattr(self.make_batch, "warm_up", None)
        if warm_up is not None:
            warm_up()

    def __call__(self, raw: RawRays) -> Any:
        return self.make_batch(self.gather(raw))

    def __getattr__(self, name: str) -> Any:
        """The wrapped maker's attributes (e.g. a ``DeviceBatcher``'s ``device``, which profiling reads)."""
        if name in ("gather", "make_batch"):
            raise AttributeError(name)
        return getattr(self.make_batch, name)
