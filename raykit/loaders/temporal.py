"""Sampling over (frame, pixel) by DyNeRF's temporal weights (ISG early, IST later): exact, in bounded memory.

The weights (``raykit.temporal_weights``: per frame, (h, w) float16 at level ``factor`` of the frame)
give each (frame, pixel) the probability ``w / total``, ``total`` the sum over every frame of the split.
A draw takes three levels, each by exact cumulated masses (the loss sampler's two-level draw,
:func:`raykit.loaders.sampling.draw_groups` and :func:`~raykit.loaders.sampling.draw_within`, applied
twice): a frame by its mass, a row of it by the frame's row masses, a pixel of the row by the row's
weights. The product is the frame's CDF over its pixels: no subset, no cap on the number of weights. It
holds the row masses of every frame (``F * h`` float64 per kind: 24 MB for 6,000 frames of 507 rows)
and reads only the drawn rows' weights, through a callable (a memory map, a store component chunked by
rows, an array). Sums of float16 weights are exact in float64 (below 2^29 in all), so each frame's mass
is the sum of its rows'. A draw holds the gathered rows of at most ``ROWS_BYTES`` at once. Its cost
is ``O(w)`` a ray (the row's cumulated weights); for many batches' rays at once,
:meth:`TemporalSampler.draw_by_frame` draws the same law with the rays sorted by frame, reading each
drawn frame's weights once and drawing its pixels by the frame's whole CDF (``O(h w)`` a frame,
``O(log(h w))`` a ray). With every frame's cumulated weights held (``flat_bytes``: 16 bytes a
weight), it is one search a ray in the law's whole CDF at ``O(1)`` expected cost
(:class:`GuidedSearch`), the rays grouped by frame by a radix sort of their frames: no Python per frame.

A drawn weight pixel ``(y, x)`` stands for a ``factor`` x ``factor`` block of the frame; the ray's pixel
is uniform within the block (``prob`` divided by ``factor²``); rows and columns past the last whole block
are not drawn. Batch ``step``'s draws come from a generator keyed by ``(seed, step)``: the same seed and
step give the same batch, and nothing else is state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from raykit.errors import ConfigError, SourceError
from raykit.loaders.sampling import SamplingConfig, draw_groups, draw_within
from raykit.ranges import Range, range_problems

__all__ = [
    "ROWS_BYTES",
    "TEMPORAL_KINDS",
    "TemporalDraw",
    "TemporalSampler",
    "TemporalSamplingConfig",
    "row_masses",
]

TEMPORAL_KINDS = ("isg", "ist")
ROWS_BYTES = 32 * 2**20  # the drawn rows' weights (float64) gathered at once
FLAT_CELL_BYTES = 16  # a weight's share of the held CDF: float64, and its guide's int64 (``GuidedSearch``)
_TAG_TEMPORAL = 58
_HALF = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float64)  # every float16, exactly


@dataclass(frozen=True)
class TemporalSamplingConfig:
    """The schedule of the temporal weights.

    Attributes:
        ist_step: batches before it draw by ISG, batches from it by IST (0: IST throughout; K-Planes'
            DyNeRF configurations switch at 50,000).
    """

    ist_step: int = SamplingConfig.ist_step

    def __post_init__(self) -> None:
        problems = range_problems({"ist_step": (self.ist_step, Range(0, integer=True))})
        if problems:
            raise ConfigError("loader: temporal sampling: " + "; ".join(problems))

    def kind_at(self, step: int) -> str:
        """The weights batch ``step`` draws by: ``"isg"`` or ``"ist"``."""
        return "isg" if step < self.ist_step else "ist"


class TemporalDraw(NamedTuple):
    """``n`` drawn rays: ``frame``, ``y``, ``x`` (n,) int64 (pixels of the full frame), ``prob`` (n,)
    float64, the probability of that (frame, pixel), and ``kind``, the weights drawn by; ``order``
    (``draw_by_frame``): each ray's place in the batch (a permutation; the rays come sorted by frame)."""

    frame: np.ndarray
    y: np.ndarray
    x: np.ndarray
    prob: np.ndarray
    kind: str
    order: np.ndarray | None = None


class GuidedSearch:
    """``np.searchsorted(cdf, t, side="right")`` of many unsorted targets ``0 <= t <= cdf[-1]`` (``cdf``
    non-decreasing, ``cdf[-1] > 0``) at O(1) expected cost each.

    A guide table (Chen and Asau's cut points): ``[0, cdf[-1]]`` cut into ``buckets`` equal spans,
    ``starts[k]`` the number of entries in spans before ``k``. A target's span ``k`` (the same monotone
    function of a value as an entry's) bounds its answer to ``[starts[k], starts[k + 1]]`` (entries
    of earlier spans are below it, of later ones above), bisected there: the same answers as
    ``searchsorted``, in about one step a target with ``len(cdf)`` buckets.
    """

    def __init__(self, cdf: np.ndarray, buckets: int) -> None:
        self.cdf, self.scale = cdf, max(1, int(buckets)) / cdf[-1]
        self.starts = np.zeros(int(buckets) + 3, np.int64)  # spans 0 .. buckets (cdf[-1]'s, rounded)
        np.cumsum(np.bincount(self._bucket(cdf), minlength=int(buckets) + 2), out=self.starts[1:])

    def _bucket(self, values: np.ndarray) -> np.ndarray:
        return (values * self.scale).astype(np.int64)

    def __call__(self, target: np.ndarray) -> np.ndarray:
        k = self._bucket(target)
        found, stop = self.starts.take(k), self.starts[1:].take(k)
        (todo,) = np.nonzero(stop > found)  # the answer is in [found, stop]: bisect where it is open
        lo, hi, value = found.take(todo), stop.take(todo), target.take(todo)
        while len(todo):
            mid = (lo + hi) >> 1
            right = self.cdf.take(mid) <= value
            lo, hi = np.where(right, mid + 1, lo), np.where(right, hi, mid)
            found[todo] = lo
            (still,) = np.nonzero(lo < hi)
            if len(still) < len(todo):
                todo, lo, hi, value = todo.take(still), lo.take(still), hi.take(still), value.take(still)
        return found


def row_masses(weights: np.ndarray) -> np.ndarray:
    """(F, h, w) float16 -> (F, h) float64: each frame's row sums (exact; frames may come one at a time,
    as (1, h, w), and be stacked)."""
    return np.asarray(weights).sum(axis=-1, dtype=np.float64)  # cast in buffers, not as a whole


class TemporalSampler:
    """Exact draws of (frame, pixel) by the temporal weights (see the module).

    Args:
        rows: per kind (``"isg"``, ``"ist"``), the (F, h) float64 row masses of every frame
            (:func:`row_masses`), frames in the order the callable numbers them.
        weights: ``weights(kind, frame, row)`` -> (n, w) float16: row ``row[i]`` of frame ``frame[i]``'s
            weights of that kind, for (n,) int64 ``frame`` and ``row`` (``draw_by_frame`` asks for one
            frame's rows ``0 .. h-1`` at a time).
        width: ``w``, the weights' columns.
        factor: the weights' level (a weight pixel is a ``factor`` x ``factor`` block of its frame).
        config: the schedule; ``seed``: the draws' seed; ``stream``: more ints keying them (a rank's
            ``(world_size, rank)``: disjoint streams).
        flat_bytes: :meth:`draw_by_frame` holds every frame's cumulated weights (``F * h * w``
            float64 a kind, read here) when they fit this, and draws a ray by one search in them.
    """

    def __init__(self, rows: Mapping[str, np.ndarray],
                 weights: Callable[[str, np.ndarray, np.ndarray], np.ndarray],
                 width: int, factor: int = 1, config: TemporalSamplingConfig | None = None,
                 seed: int = 0, stream: tuple[int, ...] = (), flat_bytes: int = 0) -> None:  # fmt: skip
        self.config = TemporalSamplingConfig() if config is None else config
        self.weights, self.width, self.factor = weights, int(width), int(factor)
        self._key = np.random.SeedSequence([seed, _TAG_TEMPORAL, *stream]).generate_state(2, np.uint64)
        self._cdf: dict[str, np.ndarray] = {}
        shapes = {np.shape(rows[kind]) for kind in TEMPORAL_KINDS if kind in rows}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise SourceError(f"temporal weights: expected row masses (F, h) of one shape, got {shapes}")
        self.frames, self.height = next(iter(shapes))
        for kind in TEMPORAL_KINDS:
            if kind in rows:
                cdf = np.cumsum(np.asarray(rows[kind], np.float64).reshape(-1))
                if not cdf[-1] > 0:
                    raise SourceError(f"temporal weights: the {kind.upper()} weights are all zero")
                self._cdf[kind] = cdf
        self._flat: dict[str, tuple[GuidedSearch, GuidedSearch, int]] = {}
        if self.frames * self.height * self.width * FLAT_CELL_BYTES <= flat_bytes:
            self._flat = {kind: self._held(kind) for kind in self._cdf}

    def _held(self, kind: str) -> tuple[GuidedSearch, GuidedSearch, int]:
        """The whole law's CDF (every frame's weights end to end, cumulated after a 0) searched by frame
        (a frame's end) and by cell; and 1 + the last cell of positive weight."""
        hw, every = self.height * self.width, np.arange(self.height)
        flat = np.zeros(self.frames * hw + 1)
        for f in range(self.frames):
            flat[1 + f * hw : 1 + (f + 1) * hw] = self._rows(kind, np.full(self.height, f), every).reshape(-1)
        np.cumsum(flat, out=flat)
        frames = GuidedSearch(np.ascontiguousarray(flat[hw::hw]), 16 * self.frames)
        return frames, GuidedSearch(flat, len(flat)), int(np.searchsorted(flat, flat[-1]))

    def rng(self, step: int) -> np.random.Generator:
        """Batch ``step``'s generator: Philox keyed by the seed, ``step`` in its counter."""
        return np.random.Generator(np.random.Philox(key=self._key, counter=[0, 0, 0, step]))

    def shuffle_rng(self, step: int) -> np.random.Generator:
        """A second generator of batch ``step`` (apart from :meth:`rng`'s): to shuffle sorted draws."""
        return np.random.Generator(np.random.Philox(key=self._key, counter=[0, 0, 1, step]))

    def draw(self, step: int, n: int) -> TemporalDraw:
        """``n`` rays of batch ``step``, by the weights the schedule names for it (a row read per ray)."""
        kind, rng, cdf = self._start(step, n)
        h, w = self.height, self.width
        frame = draw_groups(cdf[h - 1 :: h], rng.random(n))  # a frame by its mass
        y = draw_within(cdf, h, frame, rng.random(n))  # a row by the frame's row masses
        u, x, prob = rng.random(n), np.empty(n, np.int64), np.empty(n, np.float64)
        chunk = max(1, ROWS_BYTES // (8 * w))
        for a in range(0, n, chunk):  # a pixel by the row's weights, rows gathered a chunk at a time
            gathered = self._rows(kind, frame[a : a + chunk], y[a : a + chunk])
            x[a : a + chunk] = draw_within(np.cumsum(gathered), w, np.arange(len(gathered)), u[a : a + chunk])
            prob[a : a + chunk] = gathered[np.arange(len(gathered)), x[a : a + chunk]]
        return self._finish(kind, frame, y, x, prob / cdf[-1], rng)

    def draw_by_frame(self, step: int, n: int) -> TemporalDraw:
        """``n`` rays of batch ``step`` by the same law as :meth:`draw`, sorted by frame, ``order``
        their places in the batch: each drawn frame's weights read once, a pixel drawn by the frame's
        whole CDF. For many batches' rays at once (each frame's colours then read once too). With the
        whole CDF held (``flat_bytes``), a ray is one guided search in it, the rays drawn in the
        batch's order and then grouped by frame (``order``: a stable radix sort of their frames);
        else they are drawn sorted and ``order`` is a permutation from :meth:`shuffle_rng`."""
        return self.begin_by_frame(step, n)()

    def begin_by_frame(self, step: int, n: int) -> Callable[[], TemporalDraw]:
        """:meth:`draw_by_frame` in two parts, for two threads: the rays' frames now (with the whole
        CDF held: the uniforms, their frames, ``order``), the rest (the pixels) when the returned
        callable is called; the same draw."""
        kind, rng, cdf = self._start(step, n)
        if kind not in self._flat:
            return lambda: self._by_frame(kind, rng, cdf, step, n)
        by_frame, by_cell, _ = self._flat[kind]
        target = rng.random(n) * by_cell.cdf[-1]
        frame = by_frame(target)  # = its cell's frame (the frames' ends are entries of the CDF)
        order = np.argsort(frame.astype(np.uint16) if self.frames < 2**16 else frame, kind="stable")
        return lambda: self._by_cell(kind, rng, target.take(order), order)

    def _by_cell(self, kind: str, rng: np.random.Generator, target: np.ndarray, order: np.ndarray
                 ) -> TemporalDraw:  # fmt: skip
        """The rays of ``target`` (grouped by frame): a guided search each in the held CDF."""
        _, by_cell, last = self._flat[kind]
        flat, hw = by_cell.cdf, self.height * self.width
        cell = np.minimum(by_cell(target), last)  # 1 + the cell: zero weights never drawn
        weight = flat.take(cell) - flat.take(cell - 1)  # exact: sums of float16
        frame = (cell - 1) // hw
        y, x = np.divmod(cell - 1 - frame * hw, self.width)
        return self._finish(kind, frame, y, x, weight / flat[-1], rng, order)

    def _by_frame(self, kind: str, rng: np.random.Generator, cdf: np.ndarray, step: int, n: int
                  ) -> TemporalDraw:  # fmt: skip
        """The rays sorted by frame, each drawn frame's weights read once and cumulated."""
        h, w = self.height, self.width
        frame = np.sort(draw_groups(cdf[h - 1 :: h], rng.random(n)))  # a frame by its mass
        u, pixel, prob = rng.random(n), np.empty(n, np.int64), np.empty(n, np.float64)
        frames, starts, counts = np.unique(frame, return_index=True, return_counts=True)
        for f, a, k in zip(frames.tolist(), starts.tolist(), counts.tolist(), strict=True):
            weights = self._rows(kind, np.full(h, f), np.arange(h)).reshape(-1)
            pixel[a : a + k] = draw_within(np.cumsum(weights), h * w, np.zeros(k, np.int64), u[a : a + k])
            prob[a : a + k] = weights[pixel[a : a + k]]
        y, x = np.divmod(pixel, w)
        order = self.shuffle_rng(step).permutation(n)
        return self._finish(kind, frame, y, x, prob / cdf[-1], rng, order)

    def _start(self, step: int, n: int) -> tuple[str, np.random.Generator, np.ndarray]:
        kind = self.config.kind_at(step)
        if kind not in self._cdf:
            raise ConfigError(f"loader: temporal sampling: batch {step} draws by {kind.upper()}, not given")
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"loader: temporal sampling: expected a positive number of rays, got {n!r}")
        return kind, self.rng(step), self._cdf[kind]

    def _rows(self, kind: str, frame: np.ndarray, row: np.ndarray) -> np.ndarray:
        """(n, w) float64: the weights of rows ``row`` of frames ``frame``."""
        gathered = _float64(self.weights(kind, frame, row))
        if gathered.shape != (len(frame), self.width):
            raise SourceError(f"temporal weights: expected {kind.upper()} rows of shape "
                              f"{(len(frame), self.width)}, got {gathered.shape}")  # fmt: skip
        return gathered

    def _finish(self, kind: str, frame: np.ndarray, y: np.ndarray, x: np.ndarray, prob: np.ndarray,
                rng: np.random.Generator, order: np.ndarray | None = None) -> TemporalDraw:  # fmt: skip
        """The draw in the frame's pixels: a pixel uniform within each drawn weight pixel's block."""
        if self.factor > 1:  # one draw of the block's factor² pixels
            small = np.uint8 if self.factor**2 <= 256 else np.int64
            dy, dx = np.divmod(rng.integers(0, self.factor**2, len(y), dtype=small), small(self.factor))
            y, x = y * self.factor + dy, x * self.factor + dx
        return TemporalDraw(frame, y, x, prob / self.factor**2, kind, order)


def _float64(values: np.ndarray) -> np.ndarray:
    """``values`` as float64; float16 by a table of all 65,536 (4x numpy's own conversion here)."""
    values = np.asarray(values)
    return _HALF[values.view(np.uint16)] if values.dtype == np.float16 else values.astype(np.float64)
