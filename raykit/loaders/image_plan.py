"""The image loader's plan and its view-sampling stage: which images (views) each batch holds.

:class:`ImagePlan` is the partition (ranks, batches, epochs) and the crops, pure functions of the seed.
The sampling stage decides which views a rank visits in an epoch and in what order: a small object
with ``epoch_views(epoch)`` and a JSON-able ``state_dict()`` / ``load_state_dict(state)`` (part of the
loader's state), plugged into :class:`~raykit.loaders.ImageLoader` as ``views``. Today's one stage,
:class:`UniformViews`, is the plan's seeded permutation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from raykit.errors import ConfigError, ResumeError

__all__ = ["ImagePlan", "UniformViews", "ViewSampler"]

_ORDER_TAG, _CROP_TAG = 0x696D6167, 0x63726F70  # "imag", "crop"


@dataclass(frozen=True)
class ImagePlan:
    """Which images batch ``k`` of epoch ``e`` holds on one rank, and where their crops are: pure
    functions of the seed.

    Epoch ``e`` visits the split's ``I`` images (positions ``0..I-1`` in table order) in the order
    ``default_rng([seed, 0x696D6167, e]).permutation(I)`` (``arange(I)`` without shuffling). Ranks take
    the order strided: rank ``r`` of ``R`` gets positions ``r, r + R, r + 2R, ...`` of its first
    ``R * (I // R)`` entries (``drop_last``), or of the order extended by wrapping around to
    ``R * ceil(I / R)`` entries; so every rank sees the same number of images and, with ``drop_last``,
    no image is seen by two ranks. A rank's images are cut into batches of ``batch_size`` (the last
    short one dropped with ``drop_last``).

    A crop of ``(h, w)`` pixels of image ``i`` in epoch ``e`` has its top-left pixel drawn by
    ``default_rng([seed, 0x63726F70, e, i]).integers(...)``: the same for any rank, world size, worker
    count or batch size.
    """

    n_images: int
    batch_size: int
    seed: int
    shuffle: bool = True
    drop_last: bool = True
    world_size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"image loader: expected 0 <= rank < world_size, got {self.rank}, {self.world_size}"
            )
        if self.per_rank < 1 or (self.drop_last and self.per_rank < self.batch_size):
            raise ConfigError(
                f"image loader: {self.n_images} images give {self.per_rank} per rank for "
                f"{self.world_size} ranks, fewer than one batch of {self.batch_size}"
                + (" (drop_last)" if self.drop_last else "")
            )

    @property
    def per_rank(self) -> int:
        """Images each rank sees per epoch."""
        if self.drop_last:
            return self.n_images // self.world_size
        return -(-self.n_images // self.world_size)

    @property
    def n_batches(self) -> int:
        if self.drop_last:
            return self.per_rank // self.batch_size
        return -(-self.per_rank // self.batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """(I,) int64 positions of the split's images in the order epoch ``epoch`` visits them."""
        if not self.shuffle:
            return np.arange(self.n_images, dtype=np.int64)
        return np.random.default_rng([self.seed, _ORDER_TAG, epoch]).permutation(self.n_images)

    def rank_order(self, epoch: int) -> np.ndarray:
        """(per_rank,) int64 positions this rank visits in epoch ``epoch``."""
        order = self.epoch_order(epoch)
        total = self.per_rank * self.world_size
        if total > len(order):  # not drop_last: wrap around so every rank gets as many
            order = np.resize(order, total)
        return order[self.rank : total : self.world_size]

    def crop_origin(
        self, epoch: int, position: int, size: tuple[int, int], crop: tuple[int, int]
    ) -> tuple[int, int]:
        """``(x0, y0)`` of the ``crop`` ``(h, w)`` window of image ``position`` of ``size`` ``(H, W)``."""
        (height, width), (ch, cw) = size, crop
        rng = np.random.default_rng([self.seed, _CROP_TAG, epoch, position])
        y0, x0 = (int(v) for v in rng.integers(0, [height - ch + 1, width - cw + 1]))
        return x0, y0


class ViewSampler(Protocol):
    """The seam of the view-sampling stage: which views (positions of the split's images) this rank
    visits in an epoch, ``plan.per_rank`` of them in order (the same for the same epoch and state:
    the loader asks more than once), and the stage's own JSON-able state (kept in the loader's state
    under ``"views"`` when not empty). Set one with ``ImageLoader.views = sampler``."""

    def epoch_views(self, epoch: int) -> np.ndarray: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class UniformViews:
    """Every view once per epoch, in the plan's seeded permutation (:meth:`ImagePlan.rank_order`): a
    pure function of the seed, so its state is empty. The last epoch's order is kept (the loader asks
    for it at every batch that reads components ahead)."""

    def __init__(self, plan: ImagePlan) -> None:
        self.plan = plan
        self._last: tuple[int, np.ndarray] | None = None

    def epoch_views(self, epoch: int) -> np.ndarray:
        if self._last is None or self._last[0] != epoch:
            self._last = epoch, self.plan.rank_order(epoch)
        return self._last[1]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:
            raise ResumeError(f"image loader state: uniform views keep no state, got {dict(state)!r}")
