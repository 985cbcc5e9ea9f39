"""The ``loss`` sampling stage's draws from what is resident (the law: :mod:`raykit.loaders.sampling`).

Each batch draws ``round(floor * n)`` rays uniformly and the rest by the map in two levels, from
tables kept while the resident rays and the snapshot stay the same (built once per window and
snapshot, not per batch):

* the images layout (:class:`ImageCells`): the window images' cells in a row (each cell's pixel box
  and estimate) and their masses (estimate x area) cumulated; an image by its mass, a cell by the
  image's masses, a pixel uniformly in the cell's box; the uniform share is a pixel of the window;
* the rays layout: the mixed window's rays sorted by their finest cell (a stable radix sort, once
  per window) and its occupied cells' masses (estimate x rays) cumulated at the snapshot's level; a
  cell by its mass, a ray uniformly among the window's rays in it.

The draws run where a group is gathered (a generation thread): the snapshot of each batch is fixed
on the producer's thread in batch order, and each batch's random numbers come from its own generator
(:meth:`LossSampler.rng`), drawn first; then the group's batches of one window and snapshot are drawn
in one vectorised pass. So the batches are those of drawing one by one, on any thread.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from raykit.loaders.sampling import ErrorMap, Snapshot, draw_groups, draw_within

__all__ = ["LossSampler", "loss_lag"]

_TAG_LOSS = 21


class ImageCells:
    """The cells of window images ``images`` at snapshot ``snap``, image after image (see the module)."""

    def __init__(self, errors: ErrorMap, snap: Snapshot, images: np.ndarray) -> None:
        geometry, self.per, self.side = errors.geometry, snap.side * snap.side, snap.side
        self.geometry, self.images = geometry, images
        boxes = np.concatenate([geometry.boxes(int(i), snap.side) for i in images], axis=1)
        self.first_y, self.rows, self.first_x, self.cols = boxes
        self.width = np.repeat(geometry.width[images], self.per)
        self.sizes = geometry.n_pixels[images]
        self.ends = np.cumsum(self.sizes)
        self.est = snap.est[images].reshape(-1).astype(np.float64)
        self.cdf = np.cumsum(self.est * (self.rows * self.cols), dtype=np.float64)
        self.masses = self.cdf[self.per - 1 :: self.per]  # each image's, cumulated

    def draw(self, floor: float, requests: Requests) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``n`` rays for each ``(n, generator)`` of ``requests``, in a row: ``(split image, row-major
        pixel, prob, weight)`` (each request's random numbers drawn first, then one pass for all)."""
        resident, total = int(self.ends[-1]), float(self.masses[-1])
        uniform, r = _random_parts(requests, floor, lambda rng, n_uniform, n: (
            rng.integers(0, resident, n_uniform), rng.random(n), rng.random(n), rng.random((2, n))
        ))  # fmt: skip
        u = uniform[0]
        at = np.searchsorted(self.ends, u, side="right")
        image_u, pixel_u = self.images[at], u - (self.ends[at] - self.sizes[at])
        j = draw_groups(self.masses, r[0])  # level 1: an image by its error mass
        cell = j * self.per + draw_within(self.cdf, self.per, j, r[1])  # level 2: a cell
        rows, cols, offset = self.rows[cell], self.cols[cell], r[2]  # then a pixel in it
        y = self.first_y[cell] + np.minimum((offset[0] * rows).astype(np.int64), rows - 1)
        x = self.first_x[cell] + np.minimum((offset[1] * cols).astype(np.int64), cols - 1)
        y_u, x_u = np.divmod(pixel_u, self.geometry.width[image_u])
        cell_u = at * self.per + self.geometry.cells_yx(image_u, y_u, x_u, self.side)
        mask = uniform[1]
        est = _merge(mask, self.est[cell_u], self.est[cell])
        prob = floor / resident + (1 - floor) * est / total
        image = _merge(mask, image_u, self.images[j])
        pixel = _merge(mask, pixel_u, y * self.width[cell] + x)
        return image, pixel, prob.astype(np.float32), (1 / (resident * prob)).astype(np.float32)


Requests = list[tuple[int, np.random.Generator]]


def _random_parts(
    requests: Requests, floor: float, draw: Any
) -> tuple[tuple[np.ndarray, np.ndarray], list[Any]]:
    """Each request's random numbers, in its generator's order: ``draw(rng, n_uniform, n_rest)``
    returns the uniform share's first, then the rest's arrays. Returns ``((the uniform shares
    concatenated, the mask of their places in the output), [each other array concatenated])``."""
    parts, counts = [], []
    for n, rng in requests:
        n_uniform = round(floor * n)
        parts.append(draw(rng, n_uniform, n - n_uniform))
        counts.append((n_uniform, n))
    joined = [
        np.concatenate(part, axis=-1) if len(parts) > 1 else part[0] for part in zip(*parts, strict=True)
    ]
    mask = np.zeros(sum(n for _, n in counts), bool)
    at = 0
    for n_uniform, n in counts:
        mask[at : at + n_uniform] = True
        at += n
    return (joined[0], mask), joined[1:]


def _merge(mask: np.ndarray, uniform: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """The uniform share's values where ``mask``, the rest's elsewhere, each in order."""
    out = np.empty(len(mask), np.result_type(uniform, rest))
    out[mask], out[~mask] = uniform, rest
    return out


class LossSampler:
    """The ``loss`` sampling stage of one rank: draws from resident rays by the map (see the module)."""

    def __init__(self, errors: ErrorMap, seed: int, rank: int, world_size: int, n_batches: int) -> None:
        self.errors, self.seed, self.rank, self.world_size = errors, seed, rank, world_size
        self.n_batches = n_batches
        self._key = np.random.SeedSequence([seed, _TAG_LOSS, world_size, rank]).generate_state(2, np.uint64)
        self.floor = errors.config.floor
        self._cells: list[tuple[Snapshot, bytes, ImageCells]] = []
        self._lock = threading.Lock()
        self.stopped: Any = None  # set by the producer: a callable telling it to give up waiting

    def rng(self, epoch: int, k: int) -> np.random.Generator:
        """Batch ``k`` of ``epoch``'s generator: Philox keyed by (seed, rank), its counter's high words
        ``(epoch, k)`` (a batch's draws advance the low word only; half the cost of a seeded PCG64)."""
        return np.random.Generator(np.random.Philox(key=self._key, counter=[0, 0, epoch, k]))

    def snapshot(self, epoch: int, k: int) -> Snapshot:
        return self.errors.snapshot(epoch * self.n_batches + k, self.stopped)

    # ---- the images layout: window images --------------------------------------------------
    def draw_images(self, snap: Snapshot, images: np.ndarray, requests: Requests
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """``n`` rays of the split images ``images`` for each ``(n, generator)`` of ``requests``, in a row:
        ``(image, row-major pixel, prob, weight)``."""
        key = images.tobytes()
        found = [cells for s, k, cells in self._cells if s is snap and k == key]
        if not found:  # the last few kept: a window changes in waves, generation threads overlap
            found = [ImageCells(self.errors, snap, images)]
            self._cells = [*self._cells[-3:], (snap, key, found[0])]
        return found[0].draw(self.floor, requests)

    # ---- the rays layout: a mixed window ---------------------------------------------------
    def draw_window(self, snap: Snapshot, window: Any, requests: Requests
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """``n`` rays of ``window`` (its ``pid`` in reading order) for each ``(n, generator)`` of
        ``requests``, in a row: ``(index, prob, weight)``."""
        order, cells, starts, counts, cdf, shift = self._window_cells(snap, window)
        size, total = len(order), float(cdf[-1])
        uniform, r = _random_parts(requests, self.floor, lambda rng, n_uniform, n: (
            rng.integers(0, size, n_uniform), rng.random(n), rng.random(n)
        ))  # fmt: skip
        drawn = np.minimum(np.searchsorted(cdf, r[0] * total, side="right"), len(cdf) - 1)
        in_cell = counts[drawn]
        within = np.minimum((r[1] * in_cell).astype(np.int64), in_cell - 1)
        index = _merge(uniform[1], uniform[0], order[starts[drawn] + within])
        est = snap.est.reshape(-1)[cells[index] >> shift].astype(np.float64)
        prob = self.floor / size + (1 - self.floor) * est / total
        return index, prob.astype(np.float32), (1 / (size * prob)).astype(np.float32)

    def _window_cells(self, snap: Snapshot, window: Any) -> tuple[Any, ...]:
        """The window's rays sorted by cell, and its occupied cells at ``snap``'s level, cached on the
        window (for the last two snapshots: two generation threads may draw across a rebuild):
        ``(order, cells, starts, counts, cumulated masses, shift)``."""
        drawing = getattr(window, "_drawing", ())
        for cached in drawing:
            if cached[0] is snap:
                return cached[1]
        with self._lock:  # computed once, whichever thread comes first
            order, ordered, cells = self._window_keys(window)
            shift = 2 * (self.errors.bits - (snap.side.bit_length() - 1))
            level = ordered >> shift  # image * side² + cell: sorted, since Z order nests
            starts = np.flatnonzero(np.diff(level, prepend=-1))
            counts = np.diff(starts, append=len(order))
            cdf = np.cumsum(snap.est.reshape(-1)[level[starts]] * counts, dtype=np.float64)
            tables = (order, cells, starts, counts, cdf, shift)
            window._drawing = (*getattr(window, "_drawing", ())[-1:], (snap, tables))
        return tables

    def _window_keys(self, window: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The window's rays' finest cells ``image * grid² + cell`` (int32), and the rays sorted by
        them (a stable radix sort of 16-bit digits), cached on the window: (order, sorted, cells)."""
        keyed = getattr(window, "_keys", None)
        if keyed is None:
            errors = self.errors
            image, pixel = errors.geometry.image_pixel_of_pid(window.pid)
            cells = image * (errors.grid * errors.grid) + errors.geometry.cells(image, pixel, errors.grid)
            cells = cells.astype(np.int32)
            order = np.argsort(cells.astype(np.uint16), kind="stable")  # the low digit
            if len(errors.geometry) * errors.grid * errors.grid > 1 << 16:  # then the high one
                order = order[np.argsort((cells[order] >> 16).astype(np.uint16), kind="stable")]
            keyed = window._keys = (order, cells[order], cells)
        return keyed


def loss_lag(gen_threads: int, prefetch_items: int, per_group: int) -> int:
    """Batches a rebuild is captured ahead of taking effect: more than the pipeline holds ahead of its
    consumer (groups in generation, queued, being put and being consumed, and the group being drawn),
    with at least 2 generation threads counted, so that it does not depend on the machine."""
    return (max(2, gen_threads) + prefetch_items + 3) * per_group + 1
