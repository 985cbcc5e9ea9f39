"""The order of a shuffled (train) split, computed per image and per shard: no global permutation.

The train order is defined in docs/format.md ("Order within a split"): image ``i`` is staged in the
order ``pi_i`` (``base_permutation``, ``image_rotation``, ``image_order``) and the split's rays are the
images' ranks merged by the key ``((r + 1/2) / n_i, i)`` (``merge_counts``); ``merge_into`` builds one
shard of the merge (a blocked transpose when the images have one size, else a sort of the keys). The
definition, the writer's merge, the read-side ``SplitOrder`` (format 3 derives a split's pids from it)
and the slow twin ``reference_split_pids`` (the tests' oracle) must agree exactly.
"""

from __future__ import annotations

import functools
import heapq
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = [
    "TRAIN_ORDER",
    "SplitOrder",
    "base_indices",
    "base_permutation",
    "image_order",
    "image_rotation",
    "merge_counts",
    "merge_into",
    "rank_order",
    "reference_split_pids",
    "shared_order",
]

TRAIN_ORDER = "rotated-permutation+merge/2"  # names this definition in writer plans

_TAG_BASE = 0x62617365  # "base": keeps base_n's stream apart from the per-image rotations
# Float64 keys (2r + 1) / (2n) order exactly while n_i * n_j < 2**52 (distinct keys differ by at least
# 1 / (2 n_i n_j)); beyond that the merge falls back to exact fractions.
_EXACT_FLOAT_PIXELS = 1 << 26


def _split_tag(split: str) -> int:
    return zlib.crc32(split.encode())


@functools.lru_cache(maxsize=8)
def base_permutation(seed: int, split: str, n_pixels: int) -> np.ndarray:
    """(n_pixels,) uint32 ``base_n``: the seeded permutation shared by a split's images of that size
    (memoised, read-only)."""
    rng = np.random.default_rng([seed, _split_tag(split), _TAG_BASE, n_pixels])
    base = rng.permutation(n_pixels).astype(np.uint32)
    base.flags.writeable = False
    return base


@functools.lru_cache(maxsize=1 << 16)
def image_rotation(seed: int, split: str, index: int, n_pixels: int) -> int:
    """``s_i`` in ``[0, n_pixels)``: the rotation of ``base_n`` that orders image ``index``."""
    return int(np.random.default_rng([seed, _split_tag(split), index]).integers(n_pixels))


def image_order(seed: int, split: str, index: int, n_pixels: int) -> np.ndarray:
    """(n_pixels,) uint32 ``pi_i``: the order in which image ``index`` of a shuffled split is staged
    (its rank-``r`` pixel is row-major pixel ``pi_i[r]``)."""
    base = base_permutation(seed, split, n_pixels)
    s = image_rotation(seed, split, index, n_pixels)
    return np.concatenate([base[s:], base[:s]])


@functools.lru_cache(maxsize=2)
def base_indices(seed: int, split: str, n_pixels: int) -> np.ndarray:
    """``base_permutation`` as read-only ``intp`` (memoised: 8 bytes per pixel, e.g. 96 MB for 12 MP
    images, so only two sizes are kept; the writer drops them when its stage phase ends): ``np.take``
    converts other index types to ``intp`` on every call, which costs as much as the gather itself."""
    base = base_permutation(seed, split, n_pixels).astype(np.intp)
    base.flags.writeable = False
    return base


def rank_order(
    values: np.ndarray, seed: int, split: str, index: int, out: np.ndarray | None = None
) -> np.ndarray:
    """(n, ...) per-pixel ``values`` of image ``index`` of a shuffled split (row-major) in the image's
    rank order: rank ``r`` holds ``values[pi_i[r]] = values[base[(r + s_i) mod n]]``. Two gathers
    through :func:`base_indices`, no order array; into ``out`` when given."""
    n = len(values)
    base = base_indices(seed, split, n)
    s = image_rotation(seed, split, index, n)
    out = np.empty_like(values) if out is None else out
    # mode="clip" skips the bounds check: base is a permutation of range(n)
    np.take(values, base[s:], axis=0, out=out[: n - s], mode="clip")
    np.take(values, base[:s], axis=0, out=out[n - s :], mode="clip")
    return out


def _key(rank: int, size: int) -> Fraction:
    return Fraction(2 * rank + 1, 2 * size)


def merge_counts(sizes: tuple[int, ...], k: int) -> list[int]:
    """How many of each image's permuted pixels lie in the first ``k`` rays of a shuffled split (the
    merge of docs/format.md: monotone in ``k``, summing to ``k``). Exact: the keys ``<= k / n`` form a
    prefix of the merge, trimmed or extended by the few keys at its end (rational arithmetic).
    """
    if sizes and min(sizes) == max(sizes):  # a round robin: ray p is rank p // I of image p mod I
        whole, part = divmod(k, len(sizes))
        return [min(sizes[0], whole + (i < part)) for i in range(len(sizes))]
    total = sum(sizes)
    counts = [min(n, (2 * k * n + total) // (2 * total)) for n in sizes]
    excess = sum(counts) - k
    if excess > 0:  # drop the largest keys taken
        last = [(-_key(c - 1, n), -i) for i, (c, n) in enumerate(zip(counts, sizes, strict=True)) if c]
        heapq.heapify(last)
        for _ in range(excess):
            _, neg = heapq.heappop(last)
            counts[-neg] -= 1
            if counts[-neg]:
                heapq.heappush(last, (-_key(counts[-neg] - 1, sizes[-neg]), neg))
    elif excess < 0:  # take the smallest keys left
        heap = [(_key(c, n), i) for i, (c, n) in enumerate(zip(counts, sizes, strict=True)) if c < n]
        heapq.heapify(heap)
        for _ in range(-excess):
            _, i = heapq.heappop(heap)
            counts[i] += 1
            if counts[i] < sizes[i]:
                heapq.heappush(heap, (_key(counts[i], sizes[i]), i))
    return counts


_TRANSPOSE_BLOCK = 2048  # ranks per block of the round robin's transposed copy (fits in L2 per image set)


def _fresh(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


def merge_into(
    fill: Callable[[int, np.ndarray], None],
    dtype: np.dtype[Any] | type,
    sizes: Sequence[int],
    lo: Sequence[int],
    hi: Sequence[int],
    start: int,
    stop: int,
    alloc: Callable[[str, tuple[int, ...]], np.ndarray] | None = None,
) -> np.ndarray:
    """The merge of one shard, with each image's run written in place by ``fill``: (stop - start,) values.

    ``fill(i, out)`` writes image ``i``'s values for ranks ``lo[i] .. hi[i]`` (``merge_counts`` at
    ``start`` and ``stop``; ``sizes``: every image's ``n_i``) into the contiguous ``out``, so a caller
    gathers them straight into the merge's buffer. ``alloc(name, shape)`` returns an uninitialised
    C-contiguous array of ``dtype`` for the buffer ``name`` (``"rows"``, the result ``"merged"``);
    default ``np.empty``. A writer passes reusable per-thread buffers (fresh ones cost page faults).
    """
    n = stop - start
    if n == 0:
        return np.zeros(0, dtype=dtype)
    if alloc is None:
        alloc = functools.partial(_fresh, dtype=dtype)
    images = len(sizes)
    if len(set(sizes)) == 1:
        # Equal sizes: ray p of the split is rank p // I of image p % I (a round robin), so the shard
        # is a slice of the transpose of an (images, ranks) matrix whose rows are the images' runs.
        r0, r1 = start // images, -(-stop // images)
        rows = alloc("rows", (images, r1 - r0))
        for i, (a, b) in enumerate(zip(lo, hi, strict=True)):
            fill(i, rows[i, a - r0 : b - r0])
        grid = alloc("merged", (r1 - r0, images))
        for k in range(0, r1 - r0, _TRANSPOSE_BLOCK):  # blocked: the copy stays in cache
            grid[k : k + _TRANSPOSE_BLOCK] = rows[:, k : k + _TRANSPOSE_BLOCK].T
        offset = start - r0 * images
        return grid.reshape(-1)[offset : offset + n]
    counts = [b - a for a, b in zip(lo, hi, strict=True)]
    values = alloc("rows", (n,))
    at = 0
    for i, c in enumerate(counts):
        fill(i, values[at : at + c])
        at += c
    ranks = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)])
    image = np.repeat(np.arange(images), counts)
    size = np.asarray(sizes, dtype=np.int64)[image]
    if max(sizes) < _EXACT_FLOAT_PIXELS:
        order = np.lexsort((image, (2 * ranks + 1) / (2 * size)))
    else:
        keys = [(_key(int(r), int(s)), int(i)) for r, s, i in zip(ranks, size, image, strict=True)]
        order = np.asarray(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
    return values[order]


def reference_split_pids(
    seed: int, split: str, images: list[int], sizes: tuple[int, ...], offsets: list[int]
) -> np.ndarray:
    """(n_rays,) pids of a shuffled split in store order, built from the definition (slow twin).

    Args:
        images: table indices of the split's images; sizes: their pixel counts; offsets: their first pids.
    """
    keys = sorted((_key(r, n), j) for j, n in enumerate(sizes) for r in range(n))
    orders = [
        [int(base_permutation(seed, split, n)[(r + image_rotation(seed, split, i, n)) % n]) for r in range(n)]
        for i, n in zip(images, sizes, strict=True)
    ]
    taken = [0] * len(sizes)
    out = []
    for _, j in keys:
        out.append(offsets[j] + orders[j][taken[j]])
        taken[j] += 1
    return np.asarray(out, dtype=np.uint32)


@dataclass(frozen=True)
class SplitOrder:
    """The pids of one split in store order, derived instead of read (format 3).

    A shuffled split follows the train order; an unshuffled (evaluation) split's ray ``p`` is pid
    ``pid_start + p``. Small and picklable (a chunk carries it to worker processes); the base
    permutations it needs are built on first use and kept per instance: 12 bytes per pixel of every
    distinct image size of the split (``base_n``, and twice over for the equal-size fast path).
    ``images`` are the table indices of the split's images, ascending; ``sizes`` their ``W * H``,
    ``offsets`` their first pids; ``seed`` is the store layout's.
    """

    seed: int
    split: str
    shuffled: bool
    images: tuple[int, ...]
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    _bases: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles as its definition; unpickling returns this process's shared instance of it
        (``shared_order``), so chunks sent by worker processes share one set of bases."""
        return shared_order, (self.seed, self.split, self.shuffled, self.images, self.sizes, self.offsets)

    @property
    def n_rays(self) -> int:
        return sum(self.sizes)

    def _memo(self, key: Any, make: Callable[[], Any]) -> Any:
        if key not in self._bases:
            self._bases[key] = make()
        return self._bases[key]

    def _base(self, n: int) -> np.ndarray:
        return self._memo(n, lambda: base_permutation(self.seed, self.split, n))

    def _doubled(self, n: int) -> np.ndarray:
        """``base_n`` twice over: indexed by ``rank + s_i < 2 n`` with no modulo (a third faster)."""
        return self._memo(("doubled", n), lambda: np.concatenate([self._base(n), self._base(n)]))

    def _rotations(self) -> np.ndarray:
        pairs = zip(self.images, self.sizes, strict=True)
        rotations = (image_rotation(self.seed, self.split, i, n) for i, n in pairs)
        return self._memo("rotations", lambda: np.fromiter(rotations, dtype=np.int64))

    def _check(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.n_rays:
            raise IndexError(f"split {self.split!r}: rays [{start}, {stop}) outside [0, {self.n_rays}]")

    def pids(self, start: int, stop: int) -> np.ndarray:
        """(stop - start,) uint32 pids of rays ``[start, stop)`` of the split, in store order."""
        self._check(start, stop)
        if not self.shuffled:
            return np.arange(start, stop, dtype=np.int64).astype(np.uint32) + np.uint32(self.offsets[0])
        if start == stop:
            return np.zeros(0, dtype=np.uint32)
        images = len(self.sizes)
        if len(set(self.sizes)) == 1:
            # Round robin: ray p is rank p // I of image p % I, pixel base[(rank + s_i) mod n].
            n = self.sizes[0]
            r0, r1 = start // images, -(-stop // images)
            # Image i's ranks r0..r1 are the contiguous run doubled[r0 + s_i : r1 + s_i]: copy the runs as
            # rows (sequential reads), then transpose them into merge order, adding each image's offset.
            runs = sliding_window_view(self._doubled(n), r1 - r0)[r0 + self._rotations()]  # (images, ranks)
            grid = np.empty((r1 - r0, images), dtype=np.uint32)
            np.add(runs.T, np.asarray(self.offsets, dtype=np.uint32)[None, :], out=grid)
            offset = start - r0 * images
            return grid.reshape(-1)[offset : offset + stop - start]
        lo, hi = merge_counts(self.sizes, start), merge_counts(self.sizes, stop)
        rotations = self._rotations()

        def fill(j: int, out: np.ndarray) -> None:
            n = self.sizes[j]
            a = (lo[j] + int(rotations[j])) % n
            run = self._base(n)[a : a + hi[j] - lo[j]]
            if len(run) < len(out):
                run = np.concatenate([run, self._base(n)[: len(out) - len(run)]])
            np.add(run, np.uint32(self.offsets[j]), out=out)

        return merge_into(fill, np.uint32, self.sizes, lo, hi, start, stop)

    def stage(self, j: int, values: np.ndarray) -> np.ndarray:
        """(n_j,) per-pixel ``values`` of the split's image ``j`` (row-major, ``values[y * W + x]``) in
        the image's rank order: rank ``r`` holds ``values[pi_j[r]]`` (unshuffled: as given). The
        images' staged values, concatenated in split order, are what :meth:`merged` reads."""
        if not self.shuffled:
            return values
        return rank_order(values, self.seed, self.split, self.images[j])

    def merged(self, staged: np.ndarray, start: int, stop: int) -> np.ndarray:
        """(stop - start,) values of rays ``[start, stop)`` of the split, in store order, from
        ``staged`` (n_rays,): the images' :meth:`stage` d values concatenated in split order.

        Ray ``p`` gets the value of its own pixel (``pids(start, stop)``): a chunk's per-pixel values
        are the merge of one contiguous run of each image's staged values, as its colours were
        written, so a caller reads them sequentially (a memory-mapped ``staged`` too)."""
        self._check(start, stop)
        if not self.shuffled:
            return staged[start:stop]
        images = len(self.sizes)
        if len(set(self.sizes)) == 1:  # a round robin: the transpose of (images, ranks) rows, as ``pids``
            r0, r1 = start // images, -(-stop // images)
            grid = np.empty((r1 - r0, images), dtype=staged.dtype)
            grid[...] = staged.reshape(images, self.sizes[0])[:, r0:r1].T
            offset = start - r0 * images
            return grid.reshape(-1)[offset : offset + stop - start]
        at = self._memo("staged", lambda: np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64))
        lo, hi = merge_counts(self.sizes, start), merge_counts(self.sizes, stop)

        def fill(j: int, out: np.ndarray) -> None:
            out[...] = staged[at[j] + lo[j] : at[j] + hi[j]]

        return merge_into(fill, staged.dtype, self.sizes, lo, hi, start, stop)


@functools.lru_cache(maxsize=16)
def shared_order(
    seed: int,
    split: str,
    shuffled: bool,
    images: tuple[int, ...],
    sizes: tuple[int, ...],
    offsets: tuple[int, ...],
) -> SplitOrder:
    """The ``SplitOrder`` of this definition, one per process (the 16 most recently used kept), so
    that every chunk of a split, whichever store object or worker process read it, shares its bases."""
    return SplitOrder(seed, split, shuffled, images, sizes, offsets)
