"""The train order as docs/format.md specifies it, in plain Python (no numpy): SeedSequence, PCG64,
Fisher-Yates and Lemire draws exactly as the format doc writes them, against ``raykit.store.order``.

This is the check that another reader can reproduce a format-3 store's pids from the spec alone.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from raykit.store.order import SplitOrder, base_permutation, image_rotation, reference_split_pids

M32 = 0xFFFFFFFF

M64 = (1 << 64) - 1
M128 = (1 << 128) - 1
INIT_A, MULT_A, INIT_B, MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
MIX_L, MIX_R, XSHIFT = 0xCA01F9DD, 0x4973F715, 16


def _words(entropy):
    out = []
    for v in entropy:
        if v == 0:
            out.append(0)
        while v:
            out.append(v & M32)
            v >>= 32
    return out


def seed_state(entropy, n_words):
    pool = [0] * 4
    hc = [INIT_A]

    def hashmix(value):
        value ^= hc[0]
        hc[0] = (hc[0] * MULT_A) & M32
        value = (value * hc[0]) & M32
        value ^= value >> XSHIFT
        return value

    def mix(x, y):
        r = ((MIX_L * x) & M32) - ((MIX_R * y) & M32)
        r &= M32
        r ^= r >> XSHIFT
        return r

    ent = _words(entropy)
    for i in range(4):
        pool[i] = hashmix(ent[i] if i < len(ent) else 0)
    for i_src in range(4):
        for i_dst in range(4):
            if i_src != i_dst:
                pool[i_dst] = mix(pool[i_dst], hashmix(pool[i_src]))
    for i_src in range(4, len(ent)):
        for i_dst in range(4):
            pool[i_dst] = mix(pool[i_dst], hashmix(ent[i_src]))
    out = []
    hb = INIT_B
    for i in range(n_words):
        v = pool[i % 4]
        v ^= hb
        hb = (hb * MULT_B) & M32
        v = (v * hb) & M32
        v ^= v >> XSHIFT
        out.append(v)
    return out


MULT = 0x2360ED051FC65DA44385DF649FCCF645


class PCG64:
    def __init__(self, entropy):
        w = seed_state(entropy, 8)
        s = [w[2 * i] | (w[2 * i + 1] << 32) for i in range(4)]
        initstate = (s[0] << 64) | s[1]
        initseq = (s[2] << 64) | s[3]
        self.inc = ((initseq << 1) | 1) & M128
        self.state = 0
        self._step()
        self.state = (self.state + initstate) & M128
        self._step()
        self.buf = None

    def _step(self):
        self.state = (self.state * MULT + self.inc) & M128

    def next64(self):
        self._step()
        hi, lo = self.state >> 64, self.state & M64
        rot = self.state >> 122
        x = hi ^ lo
        return ((x >> rot) | (x << ((64 - rot) & 63))) & M64

    def next32(self):
        if self.buf is not None:
            v, self.buf = self.buf, None
            return v
        v = self.next64()
        self.buf = v >> 32
        return v & M32


def interval(g, mx):
    if mx == 0:
        return 0
    mask = mx
    for sh in (1, 2, 4, 8, 16, 32):
        mask |= mask >> sh
    if mx <= M32:
        while True:
            v = g.next32() & mask
            if v <= mx:
                return v
    while True:
        v = g.next64() & mask
        if v <= mx:
            return v


def permutation(entropy, n):
    g = PCG64(entropy)
    x = list(range(n))
    for i in range(n - 1, 0, -1):
        j = interval(g, i)
        x[i], x[j] = x[j], x[i]
    return x


def integers(entropy, n):
    """default_rng(entropy).integers(n): Lemire's bounded method on rng = n - 1."""
    g = PCG64(entropy)
    rng = n - 1
    if rng == 0:
        return 0
    if rng <= M32:
        r1 = rng + 1
        m = g.next32() * r1
        left = m & M32
        if left < r1:
            threshold = ((M32 + 1) - r1) % r1
            while left < threshold:
                m = g.next32() * r1
                left = m & M32
        return m >> 32
    r1 = rng + 1
    m = g.next64() * r1
    left = m & M64
    if left < r1:
        threshold = ((M64 + 1) - r1) % r1
        while left < threshold:
            m = g.next64() * r1
            left = m & M64
    return m >> 64


def spec_pids(seed: int, split: str, images: list[int], sizes: list[int], offsets: list[int]) -> list[int]:
    """Every pid of a shuffled split in store order, from the spec alone (steps 1-3 of the doc)."""
    tag = zlib.crc32(split.encode())
    orders = []
    for i, n in zip(images, sizes, strict=True):
        base = permutation([seed, tag, 0x62617365, n], n)
        s = integers([seed, tag, i], n)
        orders.append([base[(r + s) % n] for r in range(n)])
    # merge by the key ((r + 1/2) / n_j, j): compare (2r + 1) * n_k with (2q + 1) * n_j exactly
    keys = sorted(((2 * r + 1, 2 * n, j) for j, n in enumerate(sizes) for r in range(n)),
                  key=lambda k: (_Fraction(k[0], k[1]), k[2]))  # fmt: skip
    taken = [0] * len(sizes)
    out = []
    for _, _, j in keys:
        out.append(offsets[j] + orders[j][taken[j]])
        taken[j] += 1
    return out


class _Fraction:
    def __init__(self, a: int, b: int) -> None:
        self.a, self.b = a, b

    def __lt__(self, other: _Fraction) -> bool:
        return self.a * other.b < other.a * self.b

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Fraction) and self.a * other.b == other.a * self.b


@pytest.mark.parametrize("n", [1, 2, 3, 37, 1000])
def test_base_permutation_is_the_spec(n: int) -> None:
    tag = zlib.crc32(b"train")
    assert base_permutation(11, "train", n).tolist() == permutation([11, tag, 0x62617365, n], n)


@pytest.mark.parametrize(("n", "index"), [(1, 0), (37, 4), (10**6, 2), (5 * 2**32 + 3, 9)])
def test_image_rotation_is_the_spec(n: int, index: int) -> None:
    tag = zlib.crc32(b"train")
    for seed in (0, 1, 2**40 + 7):
        assert image_rotation(seed, "train", index, n) == integers([seed, tag, index], n)


@pytest.mark.parametrize("sizes", [[12, 12, 12], [12, 7, 30, 7], [1, 5]])
def test_split_pids_are_the_spec(sizes: list[int]) -> None:
    images = list(range(3, 3 + len(sizes)))
    offsets = list(itertools.accumulate((40, *sizes[:-1])))
    expected = spec_pids(9, "train", images, sizes, offsets)
    np.testing.assert_array_equal(reference_split_pids(9, "train", images, tuple(sizes), offsets), expected)
    order = SplitOrder(9, "train", True, tuple(images), tuple(sizes), tuple(offsets))
    np.testing.assert_array_equal(order.pids(0, sum(sizes)), expected)


@pytest.mark.parametrize("shuffled", [True, False])
@pytest.mark.parametrize("sizes", [[12, 12, 12], [12, 7, 30, 7], [1, 5]])
def test_staged_values_merge_into_each_rays_own_pixel(sizes: list[int], shuffled: bool) -> None:
    """``SplitOrder.merged`` of the images' ``stage``d per-pixel values gives every ray of any range its
    own pixel's value: the values indexed by the spec's pids."""
    images = list(range(3, 3 + len(sizes)))
    offsets = list(itertools.accumulate((40, *sizes[:-1])))
    order = SplitOrder(9, "train", shuffled, tuple(images), tuple(sizes), tuple(offsets))
    by_pid = np.random.default_rng(1).integers(0, 1 << 30, sum(sizes)).astype(np.float32)  # pid 40 on
    at = [0, *itertools.accumulate(sizes)]
    staged = np.concatenate([order.stage(j, by_pid[at[j] : at[j + 1]]) for j in range(len(sizes))])
    n = sum(sizes)
    pids = np.asarray(spec_pids(9, "train", images, sizes, offsets) if shuffled else range(40, 40 + n))
    for start, stop in [(0, n), (0, 1), (n - 1, n), (2, n - 3), (n // 3, 2 * n // 3), (5, 5)]:
        stop = max(start, min(stop, n))
        np.testing.assert_array_equal(order.merged(staged, start, stop), by_pid[pids[start:stop] - 40])
