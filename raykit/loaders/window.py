"""The windowed shuffle of an images-layout split: which rays batch ``k`` of epoch ``e`` holds.

Vocabulary. The split has ``I`` images (split-local index ``i``) of ``n_i`` rays each. A ray is named by
``(i, rank)``, its *rank* within image ``i``'s per-epoch ray order: rank ``r`` of image ``i`` in epoch
``e`` is pixel ``base[(r + s) mod n_i]`` (row-major pixel index), with ``base`` a seeded permutation of
``n_i`` shared by the epoch's images of that size and ``s`` a seeded rotation per image (one
permutation per size and epoch instead of one per image; two images of one size visit their pixels
in different windows of the same random order, which a NeRF, whose images are different views, cannot
tell from independent orders). The epoch's images (``image_order``) enter a window of
``window_images``; each batch's counts per window image are one multivariate hypergeometric draw from
one seeded generator per epoch and rank, drawn in batch order (a generator per batch cost more Python
than the draw itself). The steps, ``n_batches`` and resuming: ``docs/loading.md`` ("Images layout:
the windowed shuffle").
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from raykit.errors import ConfigError
from raykit.loaders.plan import check_plan_fields

__all__ = ["Draw", "Piece", "WindowBatch", "WindowPlan", "reference_epoch_rays"]

_TAG_IMAGES, _TAG_DRAW, _TAG_BASE, _TAG_ROTATE = 11, 12, 13, 14
Piece = tuple[int, int, int]  # (split-local image, first rank, stop rank)
Draw = tuple[np.ndarray, np.ndarray, np.ndarray]  # (images, first ranks, stop ranks): one draw's pieces


class WindowBatch(NamedTuple):
    """One batch: its ``draws`` over the window in order (one more per refill within the batch), the
    images ``entered`` before it (for an iteration's first batch, the whole window) and those it uses
    up (``done``), which leave after it."""

    draws: list[Draw]
    entered: list[int]
    done: list[int]

    def pieces(self) -> list[Piece]:
        """The batch's non-empty pieces ``(image, lo, hi)``, in order."""
        return [
            (i, lo, hi)
            for ids, los, his in self.draws
            for i, lo, hi in zip(ids.tolist(), los.tolist(), his.tolist(), strict=True)
            if hi > lo
        ]


@dataclass(frozen=True)
class WindowPlan:
    """Where every batch's rays come from, for one rank of one images-layout split.

    Attributes:
        image_rays: ``n_i`` of every image of the split, in split order.
        batch_size, seed, shuffle, drop_last, world_size, rank: as for ``RayLoader``.
        window_images: images decoded and drawn from at once.
    """

    image_rays: tuple[int, ...]
    batch_size: int
    window_images: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True
    world_size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        check_plan_fields("window plan", self, ("batch_size", "window_images", "world_size"))
        if self.images_per_rank < 1:
            raise ConfigError(
                f"window plan: expected at least one image per rank, got {len(self.image_rays)} images "
                f"over {self.world_size} ranks"
            )
        if self.n_batches < 1:
            raise ConfigError(
                f"window plan: expected at least batch_size={self.batch_size} rays per rank, got "
                f"{self.min_rank_rays} (the rank with the smallest images)"
            )

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def images_per_rank(self) -> int:
        return len(self.image_rays) // self.world_size

    @property
    def min_rank_rays(self) -> int:
        """Rays of the ``images_per_rank`` smallest images: no rank holds fewer in any epoch."""
        return int(sum(sorted(self.image_rays)[: self.images_per_rank]))

    @property
    def n_batches(self) -> int:
        """Batches per epoch; the same on every rank."""
        if self.drop_last:
            return self.min_rank_rays // self.batch_size
        return math.ceil(self.min_rank_rays / self.batch_size)

    # ---- orders ------------------------------------------------------------------------------
    def image_order(self, epoch: int) -> np.ndarray:
        """(images_per_rank,) int64: this rank's images of ``epoch`` in visiting order."""
        n = len(self.image_rays)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch, _TAG_IMAGES]).permutation(n)
        else:
            order = np.arange(n)
        return order[self.rank :: self.world_size][: self.images_per_rank].astype(np.int64)

    def base_permutation(self, epoch: int, n: int) -> np.ndarray:
        """(n,) int64: the ray order shared by ``epoch``'s images of ``n`` rays (identity unshuffled)."""
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng([self.seed, epoch, _TAG_BASE, n]).permutation(n)

    def rotation(self, epoch: int, image: int) -> int:
        """The rotation ``s`` of image ``image``'s ray order in ``epoch``."""
        if not self.shuffle:
            return 0
        rng = np.random.default_rng([self.seed, epoch, _TAG_ROTATE, image])
        return int(rng.integers(self.image_rays[image]))

    def pixels(
        self, epoch: int, image: int, lo: int, hi: int, base: np.ndarray | None = None, s: int | None = None
    ) -> np.ndarray:
        """(hi - lo,) int64 row-major pixel indices of ranks ``lo..hi`` of ``image`` in ``epoch``
        (``base`` and ``s``: its ``base_permutation`` and ``rotation`` when the caller holds them)."""
        n = self.image_rays[image]
        base = self.base_permutation(epoch, n) if base is None else base
        s = self.rotation(epoch, image) if s is None else s
        a, b = (lo + s) % n, hi - lo
        if a + b <= n:
            return base[a : a + b]
        return np.concatenate([base[a:], base[: a + b - n]])

    # ---- batches -----------------------------------------------------------------------------
    def iter_draws(self, epoch: int, start: int = 0) -> Iterator[WindowBatch]:
        """Batches ``start..n_batches - 1`` of ``epoch`` as :class:`WindowBatch` items (replaying
        batches ``0..start - 1`` costs their count draws, never any pixels)."""
        order = self.image_order(epoch)
        image_rays = np.asarray(self.image_rays, dtype=np.int64)
        rng = np.random.default_rng([self.seed, epoch, _TAG_DRAW, self.world_size, self.rank])
        ids = used = left = np.empty(0, dtype=np.int64)  # the window: images, ranks used, ranks left
        upcoming, window_rays, n_batches = 0, 0, self.n_batches
        for k in range(n_batches):
            need = math.inf if k == n_batches - 1 and not self.drop_last else self.batch_size
            entered: list[int] = ids.tolist() if k == start else []  # the resumed window enters first
            draws: list[Draw] = []
            done: list[int] = []
            while need > 0:
                room = self.window_images - len(ids)
                if room > 0 and upcoming < len(order):
                    new = order[upcoming : upcoming + room]
                    upcoming += len(new)
                    ids, used = np.concatenate([ids, new]), np.concatenate([used, np.zeros_like(new)])
                    left = np.concatenate([left, image_rays[new]])
                    window_rays += int(image_rays[new].sum())
                    if k >= start:
                        entered += new.tolist()
                if not len(ids):
                    break
                take = int(min(need, window_rays))
                counts = left if take == window_rays else rng.multivariate_hypergeometric(left, take)
                hi = used + counts
                draws.append((ids, used, hi))
                used, left, window_rays, need = hi, left - counts, window_rays - take, need - take
                if not left.all():  # used-up images leave the window
                    keep = left > 0
                    done += ids[~keep].tolist()
                    ids, used, left = ids[keep], used[keep], left[keep]
            if k >= start:
                yield WindowBatch(draws, entered, done)

    def iter_batches(self, epoch: int, start: int = 0) -> Iterator[list[Piece]]:
        """Each batch's non-empty pieces (:meth:`WindowBatch.pieces`) from batch ``start`` of ``epoch`` on."""
        for batch in self.iter_draws(epoch, start):
            yield batch.pieces()

    def batch_pieces(self, epoch: int, k: int) -> list[Piece]:
        """The pieces of batch ``k`` of ``epoch`` (replays batches ``0..k-1``' counts)."""
        if not 0 <= k < self.n_batches:
            raise ConfigError(f"window plan: expected batch index in [0, {self.n_batches}), got {k}")
        return next(self.iter_batches(epoch, k))


def reference_epoch_rays(plan: WindowPlan, epoch: int) -> list[list[tuple[int, int]]]:
    """Simple twin of ``iter_batches`` + ``pixels``: every batch of ``epoch`` as ``(image, pixel)``
    pairs, keeping each window image's remaining pixels as a list (same generators, own bookkeeping)."""
    queue = plan.image_order(epoch).tolist()
    window: list[tuple[int, list[int]]] = []
    out = []
    rng = np.random.default_rng([plan.seed, epoch, _TAG_DRAW, plan.world_size, plan.rank])
    for k in range(plan.n_batches):
        need = math.inf if (k == plan.n_batches - 1 and not plan.drop_last) else plan.batch_size
        batch: list[tuple[int, int]] = []
        while need > 0:
            while len(window) < plan.window_images and queue:
                i = queue.pop(0)
                n, s = plan.image_rays[i], plan.rotation(epoch, i)
                base = plan.base_permutation(epoch, n)
                window.append((i, [int(base[(r + s) % n]) for r in range(n)]))
            if not window:
                break
            left = np.array([len(p) for _, p in window], dtype=np.int64)
            take = int(min(need, left.sum()))
            counts = left if take == left.sum() else rng.multivariate_hypergeometric(left, take)
            for (i, remaining), c in zip(window, counts.tolist(), strict=True):
                batch += [(i, px) for px in remaining[:c]]
                del remaining[:c]
            window = [(i, p) for i, p in window if p]
            need -= take
        out.append(batch)
    return out
