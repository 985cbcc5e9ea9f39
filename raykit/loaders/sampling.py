"""The loader's sampling stage: which resident rays a batch holds (``uniform`` or ``loss``; ``temporal``:
:mod:`raykit.loaders.temporal_draws`).

``uniform`` is the plans' own order (:mod:`raykit.loaders.plan`, :mod:`raykit.loaders.window`).
``loss`` keeps an *error map* per image of the split (instant-ngp's idea): each observed ray's loss is
added to the cell of a ``grid`` x ``grid`` accumulator of its image (cells in Z order, so that a coarser
level's cell is a run of finer ones); at each *rebuild* the map becomes a snapshot at a level whose
cells per side grow as ``3.5 n^(1/4)`` (``n`` the samples per image seen, bounded by ``grid``), each
cell's estimate the mean loss of its rays (smoothed towards the split's mean), after which the
accumulator decays. Rebuilds come every ``interval`` batches at first, the interval growing by
``growth`` up to ``max_interval``.

A batch draws from what is resident (the rays layout's mixed window, the images layout's window
images): a ``floor`` fraction uniformly, the rest in two levels (the images layout: an image by its
error mass, a cell by the image's cumulative masses, a pixel uniformly within the cell; the rays
layout: an occupied cell of the window by its mass, a ray uniformly among the window's rays in it).
No categorical distribution is larger than the window. Each ray carries the probability it was drawn
with (``prob``, that of the mixture) and ``weight = 1 / (resident rays * prob)`` (mean 1), in
``RawRays.extra`` and so ``RayBatch.extra``.

Reproducible: batch ``t`` (counted over epochs) uses the snapshot of the last rebuild ``R <= t``,
which holds the losses observed before batch ``R - lag`` was handed out (``lag`` exceeds what the
pipeline can hold ahead, so the producer never waits on a trainer that observes each batch before
taking the next); its random draws come from a generator seeded by ``(seed, rank, epoch, batch)``.
The same losses in the same order give the same batches for any ``num_workers``, and the state
(accumulator, snapshots, rebuild count) is part of the loader's. With several ranks the accumulator
is averaged across ranks at each rebuild (``torch.distributed``), so every rank draws from one map.
"""

from __future__ import annotations

import base64
import bisect
import math
import threading
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from raykit.errors import ConfigError, ResumeError
from raykit.ranges import Range, range_problems

__all__ = ["MAP_BYTES_MAX", "SAMPLINGS", "ErrorMap", "ImageGeometry", "LossSampler", "SamplingConfig",
           "map_bytes", "map_grid"]  # fmt: skip

SAMPLINGS = ("uniform", "loss", "temporal")
MAP_BYTES_MAX = 128 * 10**6  # the maps' bound whatever the split (2,010 1080p photos: grid 32, 33 MB)
_BYTES_PER_CELL = 16  # accumulator (sum, count: float32) + two snapshots' float32 estimates
_TAG_LOSS = 21
_PRIOR_RAYS = 1.0  # a cell's estimate is its mean loss smoothed by this many rays of the split's mean


@dataclass(frozen=True)
class SamplingConfig:
    """The sampling stage's options (``RayLoader(sampling=...)``: a name or this).

    Attributes:
        kind: ``"uniform"`` (the plan's order), ``"loss"`` (error-map importance sampling) or
            ``"temporal"`` (the store's ISG/IST weights, :mod:`raykit.loaders.temporal_draws`).
        grid: the finest cells per side of an image's map (a power of two; lowered until the maps
            fit :func:`map_grid`'s bound).
        interval: batches between the first rebuilds of the map.
        growth: each rebuild's interval is the last one's times this.
        max_interval: the longest interval.
        floor: the fraction of every batch drawn uniformly from what is resident.
        decay: the accumulator is multiplied by this after each rebuild (older losses fade).
        ist_step: ``temporal``: batches before it draw by ISG, from it by IST (K-Planes' DyNeRF: 50,000).
    """

    kind: str = "uniform"
    grid: int = 64
    interval: int = 64
    growth: float = 1.5
    max_interval: int = 1024
    floor: float = 0.5
    decay: float = 0.5
    ist_step: int = 50_000

    def __post_init__(self) -> None:
        if self.kind not in SAMPLINGS:
            raise ConfigError(f"loader: sampling: expected one of {', '.join(SAMPLINGS)}, got {self.kind!r}")
        problems = range_problems({
            "grid": (self.grid, Range(1, 256, integer=True)),
            "interval": (self.interval, Range(1, integer=True)),
            "growth": (self.growth, Range(1, 16)),
            "max_interval": (self.max_interval, Range(self.interval, integer=True)),
            "floor": (self.floor, Range(0, 1)),
            "decay": (self.decay, Range(0, 1)),
            "ist_step": (self.ist_step, Range(0, integer=True)),
        })  # fmt: skip
        if not problems and self.grid & (self.grid - 1):
            problems.append(f"grid: expected a power of two, got {self.grid}")
        if problems:
            raise ConfigError("loader: sampling: " + "; ".join(problems))


def map_bytes(n_images: int, grid: int) -> int:
    """Bytes of the maps of ``n_images`` images at ``grid`` cells per side (accumulator + snapshots)."""
    return n_images * grid * grid * _BYTES_PER_CELL


def map_grid(n_images: int, grid: int, budget: int = MAP_BYTES_MAX) -> int:
    """``grid`` halved until the maps of ``n_images`` fit ``budget`` bytes (at least 1)."""
    while grid > 1 and map_bytes(n_images, grid) > budget:
        grid //= 2
    return grid


def _spread_bits(v: np.ndarray) -> np.ndarray:
    """The bits of ``v`` (< 256) moved to the even bit positions (Morton)."""
    v = v.astype(np.int64)
    v = (v | (v << 4)) & 0x0F0F
    v = (v | (v << 2)) & 0x3333
    return (v | (v << 1)) & 0x5555


_SPREAD = _spread_bits(np.arange(256))  # a table: one lookup per coordinate instead of six passes


def _morton(cy: np.ndarray, cx: np.ndarray) -> np.ndarray:
    return (_SPREAD[cy] << 1) | _SPREAD[cx]


class ImageGeometry:
    """The split's images as the maps see them: sizes, first pids, and the table row -> split image."""

    def __init__(self, widths: np.ndarray, heights: np.ndarray, offsets: np.ndarray, rows: np.ndarray,
                 n_table_rows: int) -> None:  # fmt: skip
        self.width, self.height = widths.astype(np.int64), heights.astype(np.int64)
        self.offset, self.rows = offsets.astype(np.int64), rows.astype(np.int64)
        self.n_pixels = self.width * self.height
        self.local = np.full(n_table_rows, -1, np.int64)
        self.local[self.rows] = np.arange(len(rows))
        self._order = np.argsort(self.offset, kind="stable")
        self._areas: dict[tuple[int, int, int], np.ndarray] = {}

    @classmethod
    def of_store(cls, store: Any, split: str) -> ImageGeometry:
        table, rows = store.table, store.split_rows(split)
        return cls(np.asarray(table.width)[rows], np.asarray(table.height)[rows],
                   np.asarray(table.pixel_offset)[rows], rows, len(table.width))  # fmt: skip

    def __len__(self) -> int:
        return len(self.rows)

    def image_pixel_of_pid(self, pid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Split image and row-major pixel of global pixel ids ``pid``."""
        pid = pid.astype(np.int64)
        at = np.searchsorted(self.offset[self._order], pid, side="right") - 1
        image = self._order[np.clip(at, 0, len(self._order) - 1)]
        return image, pid - self.offset[image]

    def cells(self, image: np.ndarray, pixel: np.ndarray, side: int) -> np.ndarray:
        """Z-order cell (at ``side`` cells per side) of row-major ``pixel`` of split images ``image``."""
        w, h = self.width[image], self.height[image]
        y, x = np.divmod(pixel, w)
        return _morton(y * side // h, x * side // w)

    def area(self, image: int, side: int) -> np.ndarray:
        """(side², ) pixels of each Z-order cell of split image ``image`` at ``side`` cells per side."""
        h, w = int(self.height[image]), int(self.width[image])
        key = (h, w, side)
        if key not in self._areas:
            rows = np.bincount(np.arange(h) * side // h, minlength=side)
            cols = np.bincount(np.arange(w) * side // w, minlength=side)
            cy, cx = np.divmod(np.arange(side * side), side)
            area = np.zeros(side * side, np.float64)
            area[_morton(cy, cx)] = (rows[:, None] * cols[None, :]).reshape(-1)
            self._areas[key] = area
        return self._areas[key]

    def pixels_in_cells(self, image: np.ndarray, cells: np.ndarray, side: int, rng: np.random.Generator
                        ) -> np.ndarray:  # fmt: skip
        """A uniform row-major pixel within each Z-order cell ``cells`` of split images ``image``."""
        h, w = self.height[image], self.width[image]
        cy, cx = _unmorton(cells, side)
        y0, y1 = (cy * h + side - 1) // side, ((cy + 1) * h + side - 1) // side
        x0, x1 = (cx * w + side - 1) // side, ((cx + 1) * w + side - 1) // side
        u = rng.random((2, len(cells)))
        y = np.minimum(y0 + (u[0] * (y1 - y0)).astype(np.int64), y1 - 1)
        x = np.minimum(x0 + (u[1] * (x1 - x0)).astype(np.int64), x1 - 1)
        return y * w + x


_UNMORTON: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _unmorton(code: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    """``(cy, cx)`` of Z-order cells ``code`` at ``side`` cells per side (a table per side)."""
    if side not in _UNMORTON:
        cy, cx = np.divmod(np.arange(side * side), side)
        tables = (np.empty(side * side, np.int64), np.empty(side * side, np.int64))
        z = _morton(cy, cx)
        tables[0][z], tables[1][z] = cy, cx
        _UNMORTON[side] = tables
    cy_of, cx_of = _UNMORTON[side]
    return cy_of[code], cx_of[code]


@dataclass(frozen=True)
class Snapshot:
    """A rebuilt map: ``est`` (I, side²) each cell's estimate, ``mass`` (I,) each image's error mass."""

    side: int
    est: np.ndarray
    mass: np.ndarray


def _encode(array: np.ndarray) -> dict[str, Any]:
    data = base64.b64encode(zlib.compress(np.ascontiguousarray(array).tobytes(), 1)).decode()
    return {"dtype": str(array.dtype), "shape": list(array.shape), "data": data}


def _decode(record: Mapping[str, Any]) -> np.ndarray:
    raw = zlib.decompress(base64.b64decode(record["data"]))
    return np.frombuffer(raw, dtype=record["dtype"]).reshape(record["shape"]).copy()


class ErrorMap:
    """The error maps of one split: the accumulator, the rebuild schedule and the snapshots."""

    def __init__(self, geometry: ImageGeometry, grid: int, config: SamplingConfig, lag: int) -> None:
        self.geometry, self.grid, self.config, self.lag = geometry, grid, config, lag
        self.bits = grid.bit_length() - 1
        self.sums = np.zeros((len(geometry), grid * grid), np.float32)
        self.counts = np.zeros_like(self.sums)
        self.rebuilds = 0  # rebuilds captured so far (the schedule's position)
        self._points = [0]  # rebuild_at(i), extended on demand
        self._points_lock = threading.Lock()
        self.snapshots: dict[int, Snapshot] = {0: self._flat()}
        self._ready = threading.Condition()

    @property
    def nbytes(self) -> int:
        return map_bytes(len(self.geometry), self.grid)

    def rebuild_at(self, i: int) -> int:
        """The batch (counted over epochs) at which rebuild ``i`` (from 1) takes effect (0: the start)."""
        points, cfg = self._points, self.config
        with self._points_lock:  # extended by the producer and the consumer
            while len(points) <= i:
                step = cfg.interval * cfg.growth ** (len(points) - 1)
                points.append(points[-1] + int(min(cfg.max_interval, math.ceil(step))))
            return points[i]

    def _flat(self) -> Snapshot:
        est = np.ones((len(self.geometry), 1), np.float32)
        return Snapshot(1, est, self.geometry.n_pixels.astype(np.float64))

    # ---- the consumer's side ----------------------------------------------------------------
    def observe(self, image: np.ndarray, pixel: np.ndarray, losses: np.ndarray) -> None:
        """Add ``losses`` of the rays at row-major ``pixel`` of split images ``image`` (``-1``: skip)."""
        keep = (image >= 0) & np.isfinite(losses)
        image, pixel, losses = image[keep], pixel[keep], losses[keep].astype(np.float32)
        flat = image * self.grid * self.grid + self.geometry.cells(image, pixel, self.grid)
        np.add.at(self.sums.reshape(-1), flat, losses)
        np.add.at(self.counts.reshape(-1), flat, np.float32(1))

    def settle(self, t: int) -> None:
        """Batch ``t`` is handed out (every batch before it settled): capture the rebuilds due."""
        while self.rebuild_at(self.rebuilds + 1) - self.lag <= t:
            self.rebuilds += 1
            snapshot = self._capture()
            with self._ready:
                self.snapshots[self.rebuild_at(self.rebuilds)] = snapshot
                self._ready.notify_all()
        current = self._due(t)
        with self._ready:  # snapshots no batch from ``t`` on uses
            self.snapshots = {r: s for r, s in self.snapshots.items() if r >= current}

    def _due(self, t: int) -> int:
        """The rebuild point batch ``t`` draws with."""
        while self.rebuild_at(len(self._points) - 1) <= t:
            self.rebuild_at(len(self._points))
        return self._points[bisect.bisect_right(self._points, t) - 1]

    def _capture(self) -> Snapshot:
        ranks = _reduce_mean(self.sums, self.counts)
        geometry, total = self.geometry, float(self.counts.sum())
        n = total * ranks / max(1, len(geometry))  # samples per image since the start (decayed)
        side = 1 << min(self.bits, max(0, math.floor(math.log2(max(1.0, 3.5 * n**0.25)))))
        pool = (self.grid // side) ** 2
        sums = self.sums.reshape(len(geometry), side * side, pool).sum(-1, dtype=np.float64)
        counts = self.counts.reshape(len(geometry), side * side, pool).sum(-1, dtype=np.float64)
        prior = float(self.sums.sum(dtype=np.float64)) / total if total > 0 else 1.0
        est = (sums + _PRIOR_RAYS * prior) / (counts + _PRIOR_RAYS)
        est = np.maximum(est, 1e-12 * max(prior, 1e-30)).astype(np.float32)
        mass = np.array([float(est[i] @ geometry.area(i, side)) for i in range(len(geometry))])
        self.sums *= np.float32(self.config.decay)
        self.counts *= np.float32(self.config.decay)
        return Snapshot(side, est, mass)

    # ---- the producer's side ----------------------------------------------------------------
    def snapshot(self, t: int, stopped: Any = None) -> Snapshot:
        """The snapshot batch ``t`` draws with, waiting until it is captured (``stopped()``: give up)."""
        due = self._due(t)
        with self._ready:
            while due not in self.snapshots:
                if stopped is not None and stopped():
                    raise _Stopped
                self._ready.wait(0.05)
            return self.snapshots[due]

    # ---- state ------------------------------------------------------------------------------
    def newest(self) -> Snapshot:
        """The newest snapshot captured (what the coming batches draw with, once it takes effect)."""
        with self._ready:
            return self.snapshots[max(self.snapshots)]

    def state_dict(self) -> dict[str, Any]:
        with self._ready:
            snaps = {str(r): {"side": s.side, "est": _encode(s.est), "mass": _encode(s.mass)}
                     for r, s in self.snapshots.items()}  # fmt: skip
        return {"grid": self.grid, "rebuilds": self.rebuilds, "sums": _encode(self.sums),
                "counts": _encode(self.counts), "snapshots": snaps}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        try:
            if int(state["grid"]) != self.grid:
                raise ResumeError(f"loader state: sampling: expected grid {self.grid}, got {state['grid']}")
            sums, counts = _decode(state["sums"]), _decode(state["counts"])
            snaps = {int(r): Snapshot(int(s["side"]), _decode(s["est"]), _decode(s["mass"]))
                     for r, s in state["snapshots"].items()}  # fmt: skip
            rebuilds = int(state["rebuilds"])
        except (KeyError, TypeError, ValueError, zlib.error) as exc:
            if isinstance(exc, ResumeError):
                raise
            raise ResumeError(f"loader state: sampling: not a loss sampler's state ({exc})") from exc
        if sums.shape != self.sums.shape or counts.shape != self.counts.shape:
            raise ResumeError(f"loader state: sampling: expected maps of shape {self.sums.shape}")
        with self._ready:
            self.sums, self.counts, self.rebuilds = sums, counts, rebuilds
            self.snapshots = snaps or {0: self._flat()}


class _Stopped(Exception):
    """The producer was stopped while waiting for a snapshot."""


def _reduce_mean(*arrays: np.ndarray) -> int:
    """Average ``arrays`` in place across ranks when ``torch.distributed`` is initialised; the ranks."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return 1
    import torch

    for array in arrays:
        tensor = torch.from_numpy(array)
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()
    return int(dist.get_world_size())


def draw_groups(ends: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Level 1 of the two-level draw: a group by its mass (``ends``: the groups' cumulated masses, float64;
    ``u``: uniform in [0, 1)); a group of zero mass is never drawn."""
    return np.minimum(np.searchsorted(ends, u * ends[-1], side="right"), len(ends) - 1)


def draw_within(cdf: np.ndarray, per: int, j: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Level 2: an item (``0 <= item < per``) of each group ``j`` by the group's masses, where ``cdf``
    cumulates the masses of groups of ``per`` items, group after group (``u``: uniform in [0, 1))."""
    ends = cdf[per - 1 :: per]
    first = np.where(j > 0, ends[np.maximum(j - 1, 0)], 0.0)
    item = np.searchsorted(cdf, first + u * (ends[j] - first), side="right")
    return np.clip(item - j * per, 0, per - 1)


class LossSampler:
    """The ``loss`` sampling stage of one rank: draws from resident rays by the map (see the module)."""

    def __init__(self, errors: ErrorMap, seed: int, rank: int, world_size: int, n_batches: int) -> None:
        self.errors, self.seed, self.rank, self.world_size = errors, seed, rank, world_size
        self.n_batches = n_batches
        self._key = np.random.SeedSequence([seed, _TAG_LOSS, world_size, rank]).generate_state(2, np.uint64)
        self.floor = errors.config.floor
        self._cdf_key: tuple[Snapshot, bytes] | None = None
        self._cdf = np.zeros(0)
        self.stopped: Any = None  # set by the producer: a callable telling it to give up waiting

    def rng(self, epoch: int, k: int) -> np.random.Generator:
        """Batch ``k`` of ``epoch``'s generator: Philox keyed by (seed, rank), its counter's high words
        ``(epoch, k)`` (a batch's draws advance the low word only; half the cost of a seeded PCG64)."""
        return np.random.Generator(np.random.Philox(key=self._key, counter=[0, 0, epoch, k]))

    def snapshot(self, epoch: int, k: int) -> Snapshot:
        return self.errors.snapshot(epoch * self.n_batches + k, self.stopped)

    # ---- the images layout: window images --------------------------------------------------
    def draw_images(self, snap: Snapshot, images: np.ndarray, n: int, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """``n`` rays of the split images ``images``: ``(image, row-major pixel, prob, weight)``."""
        geometry, cells_per = self.errors.geometry, snap.side * snap.side
        sizes = geometry.n_pixels[images]
        resident = int(sizes.sum())
        n_uniform = round(self.floor * n)
        u = rng.integers(0, resident, n_uniform)
        ends = np.cumsum(sizes)
        at = np.searchsorted(ends, u, side="right")
        cdf = self._window_cdf(snap, images)  # the images' cells' masses, cumulated image after image
        ends_mass = cdf[cells_per - 1 :: cells_per]  # each image's cumulated error mass
        total = float(ends_mass[-1])
        j = draw_groups(ends_mass, rng.random(n - n_uniform))  # level 1: an image by its error mass
        # level 2: a cell by that image's cumulated masses, then a pixel uniformly in the cell
        cell = draw_within(cdf, cells_per, j, rng.random(len(j)))
        image_u, pixel_u = images[at], u - (ends[at] - sizes[at])
        picked = geometry.pixels_in_cells(images[j], cell, snap.side, rng)
        image_all, pixel_all = np.concatenate([image_u, images[j]]), np.concatenate([pixel_u, picked])
        est_u = snap.est[image_u, geometry.cells(image_u, pixel_u, snap.side)]
        est = np.concatenate([est_u, snap.est[images[j], cell]]).astype(np.float64)
        prob = self.floor / resident + (1 - self.floor) * est / total
        return image_all, pixel_all, prob.astype(np.float32), (1 / (resident * prob)).astype(np.float32)

    def _window_cdf(self, snap: Snapshot, images: np.ndarray) -> np.ndarray:
        """The cumulated masses (estimate x area) of the cells of ``images``, image after image
        (the last one's kept: a window changes every few batches)."""
        key = (snap, images.tobytes())
        if self._cdf_key is None or self._cdf_key[0] is not snap or self._cdf_key[1] != key[1]:
            geometry = self.errors.geometry
            areas = np.stack([geometry.area(int(i), snap.side) for i in images])
            self._cdf = np.cumsum(snap.est[images] * areas, dtype=np.float64).reshape(-1)
            self._cdf_key = key
        return self._cdf

    # ---- the rays layout: a mixed window ---------------------------------------------------
    def draw_window(self, snap: Snapshot, window: Any, n: int, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """``n`` rays of ``window`` (its ``pid`` in reading order): ``(index, prob, weight)``."""
        order, keys = self._window_keys(window)
        size = len(order)
        shift = 2 * (self.errors.bits - (snap.side.bit_length() - 1))
        cached = getattr(window, "_drawing", None)
        if cached is None or cached[0] is not snap:
            level = keys >> shift  # image * side² + cell: sorted, since Z order nests
            starts = np.flatnonzero(np.diff(level, prepend=-1))
            counts = np.diff(starts, append=size)
            cdf = np.cumsum(snap.est.reshape(-1)[level[starts]] * counts, dtype=np.float64)
            cached = (snap, starts, counts, cdf)
            window._drawing = cached
        _, starts, counts, cdf = cached
        total = float(cdf[-1])
        n_uniform = round(self.floor * n)
        uniform = rng.integers(0, size, n_uniform)
        cells = np.minimum(
            np.searchsorted(cdf, rng.random(n - n_uniform) * total, side="right"), len(cdf) - 1
        )
        within = np.minimum((rng.random(len(cells)) * counts[cells]).astype(np.int64), counts[cells] - 1)
        index = np.concatenate([uniform, order[starts[cells] + within]])
        est = snap.est.reshape(-1)[self._window_level_of(window, index, shift)].astype(np.float64)
        prob = self.floor / size + (1 - self.floor) * est / total
        return index, prob.astype(np.float32), (1 / (size * prob)).astype(np.float32)

    def _window_keys(self, window: Any) -> tuple[np.ndarray, np.ndarray]:
        """The window's rays sorted by ``image * grid² + cell`` (cached on the window): (order, keys)."""
        keyed = getattr(window, "_keys", None)
        if keyed is None:
            errors = self.errors
            image, pixel = errors.geometry.image_pixel_of_pid(window.pid)
            keys = image * errors.grid * errors.grid + errors.geometry.cells(image, pixel, errors.grid)
            order = np.argsort(keys, kind="stable")
            keyed = window._keys = (order, keys[order], keys)
        return keyed[0], keyed[1]

    def _window_level_of(self, window: Any, index: np.ndarray, shift: int) -> np.ndarray:
        return window._keys[2][index] >> shift


def loss_lag(gen_threads: int, prefetch_items: int, per_group: int) -> int:
    """Batches a rebuild is captured ahead of taking effect: more than the pipeline holds ahead of its
    consumer (groups in generation, queued, being put and being consumed, and the group being drawn),
    with at least 2 generation threads counted, so that it does not depend on the machine."""
    return (max(2, gen_threads) + prefetch_items + 3) * per_group + 1


def check_sampling(value: Any) -> SamplingConfig:
    """``sampling`` as a :class:`SamplingConfig` (``ConfigError`` naming the option otherwise)."""
    if isinstance(value, SamplingConfig):
        return value
    if isinstance(value, str):
        return SamplingConfig(kind=value)
    if isinstance(value, Mapping):
        try:
            return SamplingConfig(**value)
        except TypeError as exc:
            raise ConfigError(f"loader: sampling: {exc}") from exc
    raise ConfigError(f"loader: sampling: expected a name ({', '.join(SAMPLINGS)}) or a SamplingConfig, "
                      f"got {value!r}")  # fmt: skip


def sampling_record(config: SamplingConfig) -> dict[str, Any]:
    """The sampling options as recorded (loader state, run records)."""
    return {k: v for k, v in asdict(config).items() if k != "ist_step" or config.kind == "temporal"}
