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
No categorical distribution is larger than the window (how the draws are made:
:mod:`raykit.loaders.loss_draws`). Each ray carries the probability it was drawn
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

__all__ = ["MAP_BYTES_MAX", "SAMPLINGS", "ErrorMap", "ImageGeometry", "SamplingConfig", "Snapshot",
           "map_bytes", "map_grid"]  # fmt: skip

SAMPLINGS = ("uniform", "loss", "temporal")
MAP_BYTES_MAX = 128 * 10**6  # the maps' bound whatever the split (2,010 1080p photos: grid 32, 33 MB)
_BYTES_PER_CELL = 16  # accumulator (sum, count: float32) + two snapshots' float32 estimates
_FLUSH_RAYS = 1 << 16  # observed rays held before they are added to the sums
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
        self._boxes: dict[tuple[int, int, int], np.ndarray] = {}
        sizes = self.height * (1 << 32) + self.width
        self._by_size = {int(v): np.flatnonzero(sizes == v) for v in np.unique(sizes)}
        self._size_of = np.zeros(len(rows), np.int64)
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}

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
        y, x = np.divmod(pixel, self.width[image])
        return self.cells_yx(image, y, x, side)

    def cells_yx(self, image: np.ndarray, y: np.ndarray, x: np.ndarray, side: int) -> np.ndarray:
        """Z-order cell (at ``side`` cells per side) of pixel ``(y, x)`` of split images ``image``: two
        lookups in tables per image size (no division per pixel)."""
        if side not in self._tables:
            sizes = list(self._by_size)
            ys = np.zeros((len(sizes), int(self.height.max())), np.int64)
            xs = np.zeros((len(sizes), int(self.width.max())), np.int64)
            for g, key in enumerate(sizes):
                h, w = key >> 32, key & 0xFFFFFFFF
                ys[g, :h] = _SPREAD[np.arange(h) * side // h] << 1
                xs[g, :w] = _SPREAD[np.arange(w) * side // w]
                self._size_of[self._by_size[key]] = g
            self._tables[side] = (ys, xs)
        ys, xs = self._tables[side]
        if len(ys) == 1:  # one image size: no per-image lookup
            return ys[0][y] | xs[0][x]
        size = self._size_of[image]
        return ys[size, y] | xs[size, x]

    def boxes(self, image: int, side: int) -> np.ndarray:
        """(4, side²) int64: each Z-order cell's first row, rows, first column and columns in split image
        ``image`` at ``side`` cells per side (the pixels ``p`` with ``p * side // size`` the cell's)."""
        h, w = int(self.height[image]), int(self.width[image])
        key = (h, w, side)
        if key not in self._boxes:
            first_y, first_x = (
                (np.arange(side + 1) * h + side - 1) // side,
                (np.arange(side + 1) * w + side - 1) // side,
            )
            cy, cx = np.divmod(np.arange(side * side), side)
            boxes = np.empty((4, side * side), np.int64)
            boxes[:, _morton(cy, cx)] = (first_y[cy], np.diff(first_y)[cy], first_x[cx], np.diff(first_x)[cx])
            self._boxes[key] = boxes
        return self._boxes[key]

    def area(self, image: int, side: int) -> np.ndarray:
        """(side², ) pixels of each Z-order cell of split image ``image`` at ``side`` cells per side."""
        boxes = self.boxes(image, side)
        return (boxes[1] * boxes[3]).astype(np.float64)

    def masses(self, est: np.ndarray, side: int) -> np.ndarray:
        """(I,) float64 each image's error mass by the (I, side²) cell estimates ``est``: one product
        per image size."""
        mass = np.empty(len(self), np.float64)
        for members in self._by_size.values():
            mass[members] = est[members].astype(np.float64) @ self.area(int(members[0]), side)
        return mass


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
        self._pending: list[tuple[np.ndarray, ...]] = []  # observed, not yet added
        self._pending_rays = 0
        self._quiet = 0  # settle(t) has nothing to do for t below this

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
    def observe(self, image: np.ndarray, y: np.ndarray, x: np.ndarray, losses: np.ndarray) -> None:
        """Add ``losses`` of the rays at pixels ``(y, x)`` of split images ``image`` (``-1``: skip).
        Copied, and added in order ``_FLUSH_RAYS`` at a time and before each rebuild: one pass for many
        batches, the sums those of adding them batch by batch."""
        values = np.array(losses, np.float32)
        self._pending.append(
            (np.array(image, np.int64), np.array(y, np.int64), np.array(x, np.int64), values)
        )
        self._pending_rays += len(values)
        if self._pending_rays >= _FLUSH_RAYS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        image, y, x, losses = (np.concatenate(part) for part in zip(*self._pending, strict=True))
        self._pending, self._pending_rays = [], 0
        keep = (image >= 0) & np.isfinite(losses)
        if not keep.all():
            image, y, x, losses = image[keep], y[keep], x[keep], losses[keep]
        flat = image * self.grid * self.grid + self.geometry.cells_yx(image, y, x, self.grid)
        np.add.at(self.sums.reshape(-1), flat, losses)
        np.add.at(self.counts.reshape(-1), flat, np.float32(1))

    def settle(self, t: int) -> None:
        """Batch ``t`` is handed out (every batch before it settled): capture the rebuilds due."""
        if t < self._quiet:  # no rebuild to capture, no snapshot to drop
            return
        while self.rebuild_at(self.rebuilds + 1) - self.lag <= t:
            self.rebuilds += 1
            snapshot = self._capture()
            with self._ready:
                self.snapshots[self.rebuild_at(self.rebuilds)] = snapshot
                self._ready.notify_all()
        current = self._due(t)
        with self._ready:  # snapshots no batch from ``t`` on uses
            self.snapshots = {r: s for r, s in self.snapshots.items() if r >= current}
        following = self._points[bisect.bisect_right(self._points, t)]  # the next rebuild to take effect
        self._quiet = min(self.rebuild_at(self.rebuilds + 1) - self.lag, following)

    def _due(self, t: int) -> int:
        """The rebuild point batch ``t`` draws with."""
        while self.rebuild_at(len(self._points) - 1) <= t:
            self.rebuild_at(len(self._points))
        return self._points[bisect.bisect_right(self._points, t) - 1]

    def _capture(self) -> Snapshot:
        self._flush()
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
        mass = geometry.masses(est, side)
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
        self._flush()
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
            self._pending, self._pending_rays, self._quiet = [], 0, 0
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
