"""The order of a shuffled (train) split, computed per image and per shard: no global permutation.

The train order (docs/format.md, "Order within a split"):

1. image ``i`` of a shuffled split is staged in the order of its own seeded permutation
   ``pi_i = default_rng([seed, crc32(split), i]).permutation(W * H)``;
2. the shard covering rays ``[start, stop)`` (``n`` rays) takes from every image of the split the
   contiguous run of its permuted pixels that a fixed proportional merge assigns to that range
   (``merge_counts``), concatenates them in image order, and interleaves them: ray ``t`` of the
   shard is element ``(a * t) mod n`` of the concatenation, ``a`` the integer nearest ``n / phi``
   coprime to ``n`` (``interleave_step``; a golden-ratio lattice, so by the three-gap theorem every
   run of consecutive rays takes evenly spaced elements: each image's share, random pixels).

So a shard reads one contiguous byte range per image (no global argsort, no random reads), every
shard and every chunk holds each image's share of rays (within a few rays), and which pixels of an
image land in which chunk is uniformly random. ``_split_pids_reference`` builds the order the slow
way (the tests' oracle).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import zlib
from fractions import Fraction

import numpy as np

__all__ = ["TRAIN_ORDER", "image_order", "interleave_step", "merge_counts", "shard_order"]

TRAIN_ORDER = "image-permutation+merge+golden-interleave/1"  # names this definition in writer plans

_PHI = (1 + 5**0.5) / 2


def _split_tag(split: str) -> int:
    return zlib.crc32(split.encode())


def image_order(seed: int, split: str, index: int, n_pixels: int) -> np.ndarray:
    """(n_pixels,) uint32 ``pi_i``: the order in which image ``index`` of a shuffled split is staged."""
    rng = np.random.default_rng([seed, _split_tag(split), index])
    return rng.permutation(n_pixels).astype(np.uint32)


def interleave_step(n: int) -> int:
    """The integer nearest ``n / phi`` (golden ratio) that is coprime to ``n``; the smaller on a tie."""
    base = round(n / _PHI)
    for d in range(n + 1):
        for a in (base - d, base + d):
            if 0 <= a < max(n, 2) and math.gcd(a, n) == 1:
                return a
    raise AssertionError("unreachable: 1 is coprime to every n")


@functools.lru_cache(maxsize=4)
def shard_order(n_rays: int) -> np.ndarray:
    """(n_rays,) int64: ray ``t`` of a shuffled shard is element ``(a * t) mod n_rays`` of its
    image-ordered concatenation (``a = interleave_step(n_rays)``). Memoised (every shard but the last
    has the same size) and read-only."""
    step, block = interleave_step(n_rays), 1024
    n = max(n_rays, 1)
    # (q * block + j) * step mod n = (outer[q] + inner[j]) mod n, both terms < n: one add and one fold.
    outer = np.arange(-(-n_rays // block), dtype=np.int64) * (block * step % n) % n
    inner = np.arange(block, dtype=np.int64) * step % n
    index = np.add.outer(outer, inner).reshape(-1)[:n_rays]
    np.subtract(index, n, out=index, where=index >= n)
    index.flags.writeable = False
    return index


def _key(rank: int, size: int) -> Fraction:
    return Fraction(2 * rank + 1, 2 * size)


def merge_counts(sizes: tuple[int, ...], k: int) -> list[int]:
    """How many of each image's permuted pixels lie in the first ``k`` rays of a shuffled split.

    The split's rays are the images' permuted pixels merged by the key ``((r + 1/2) / n_i, i)``
    (rank ``r`` of image ``i`` of ``n_i`` pixels), so every prefix holds each image's share ``k n_i / n``
    within ``1.5 + 1.5 I n_i / n`` rays for ``I`` images (within one ray when all images have the
    same size), and counts are monotone in ``k`` and sum to ``k``. Exact: the keys ``<= k / n`` form a
    prefix of the merge; it is trimmed or extended by the few keys at its end (rational arithmetic).
    """
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


def _split_pids_reference(
    seed: int, split: str, images: list[int], sizes: tuple[int, ...], offsets: list[int], bounds: list[int]
) -> np.ndarray:
    """(n_rays,) pids of a shuffled split in store order, built from the definition (slow twin).

    Args:
        images: table indices of the split's images; sizes: their pixel counts; offsets: their first pids.
        bounds: the shard boundaries ``[0, ..., n_rays]``.
    """
    keys = sorted((_key(r, n), j) for j, n in enumerate(sizes) for r in range(n))
    orders = [image_order(seed, split, i, n) for i, n in zip(images, sizes, strict=True)]
    taken = [0] * len(sizes)
    merged = []
    for _, j in keys:
        merged.append((j, offsets[j] + int(orders[j][taken[j]])))
        taken[j] += 1
    out = []
    for lo, hi in itertools.pairwise(bounds):
        shard = sorted(merged[lo:hi], key=lambda item: item[0])  # stable: image order, rank order
        step = interleave_step(hi - lo)
        out += [shard[(step * t) % (hi - lo)][1] for t in range(hi - lo)]
    return np.asarray(out, dtype=np.uint32)
