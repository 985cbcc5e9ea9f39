"""The image loader's ``loss`` view-sampling stage (views drawn by their recent loss) and its
time-synchronous views (:class:`SynchronousViews`, ``ImageLoaderConfig(synchronous=True)``: each batch
whole instants, all cameras of one time).

:class:`LossViews` plugs into :class:`~raykit.loaders.ImageLoader`'s view-sampling seam
(:class:`~raykit.loaders.image_plan.ViewSampler`; ``ImageLoaderConfig(sampling="loss")``). The
trainer feeds back one loss per view of each batch (``ImageLoader.observe``); each view keeps an
exponential moving average of its losses (``ema = decay * ema + (1 - decay) * loss``, the first loss
as it is), a view never observed counting as the mean of those observed (so new views get drawn).
A draw picks view ``v`` with probability ``(1 - floor) * ema[v] / sum(ema) + floor / n_views``.

The seam plans one epoch at a time, so an epoch of this stage is ``plan.per_rank`` draws (with
replacement) planned when the epoch starts, from the averages at that moment: the map is refreshed
once per epoch. The draws come from a generator seeded by ``(seed, world size, rank, epoch)``
(cumulative sums and ``searchsorted``), so the same seed and the same observed losses give the same
views for any ``num_workers``; the averages, counts and the current epoch's plan are the stage's
JSON-able state (resumed exactly). With several ranks (``torch.distributed``) the averages of the
views each rank observed are merged when an epoch is planned, so every rank draws from one map with
its own seeded stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from raykit.errors import ConfigError, ResumeError
from raykit.loaders.image_plan import ImagePlan
from raykit.loaders.sampling import SamplingConfig, _reduce_mean

__all__ = ["LossViews", "SynchronousViews", "instants_of", "view_losses"]

_TAG_VIEWS = 0x76696577  # "view"


def view_losses(losses: Any, n: int) -> np.ndarray:
    """``losses`` (a tensor or array of shape ``(n,)``, finite, non-negative) as float64.

    Raises:
        ConfigError: another shape, or a negative or non-finite loss (one line).
    """
    if hasattr(losses, "detach"):
        losses = losses.detach().to("cpu").double().numpy()
    try:
        values = np.asarray(losses, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"image loader: observe: expected ({n},) numbers, got {type(losses).__name__}"
        ) from exc
    if values.shape != (n,):
        raise ConfigError(
            f"image loader: observe: expected losses of shape ({n},) (one per view of the batch), "
            f"got {values.shape}"
        )
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ConfigError(f"image loader: observe: expected finite losses >= 0, got {values.tolist()}")
    return values


class LossViews:
    """The ``loss`` view-sampling stage of one rank over ``plan`` (see the module); ``config``'s
    ``floor`` (the uniform share of every draw) and ``decay`` (of the moving averages)."""

    def __init__(self, plan: ImagePlan, config: SamplingConfig) -> None:
        self.plan, self.floor, self.decay = plan, float(config.floor), float(config.decay)
        self.ema = np.zeros(plan.n_images, np.float64)
        self.counts = np.zeros(plan.n_images, np.int64)
        self._planned: tuple[int, np.ndarray, np.ndarray] | None = None  # epoch, views, probabilities

    def probabilities(self) -> np.ndarray:
        """(n_views,) float64: the probability of each view in one draw, from the averages now."""
        n, seen = len(self.ema), self.counts > 0
        filled = np.where(seen, self.ema, self.ema[seen].mean()) if seen.any() else np.ones(n)
        total = filled.sum()
        share = filled / total if total > 0 else np.full(n, 1 / n)
        return (1 - self.floor) * share + self.floor / n

    def _merge_ranks(self) -> None:
        have = (self.counts > 0).astype(np.float64)
        weighted = self.ema * have
        if _reduce_mean(weighted, have) > 1:
            seen = have > 0
            self.ema = np.where(seen, weighted / np.where(seen, have, 1), 0.0)
            self.counts = np.where(seen, np.maximum(self.counts, 1), self.counts)

    def _plan(self, epoch: int) -> tuple[int, np.ndarray, np.ndarray]:
        self._merge_ranks()
        prob = self.probabilities()
        plan = self.plan
        rng = np.random.default_rng([plan.seed, _TAG_VIEWS, plan.world_size, plan.rank, epoch])
        cdf = np.cumsum(prob)
        views = np.searchsorted(cdf, rng.random(plan.per_rank) * cdf[-1], side="right")
        views = np.minimum(views, len(prob) - 1).astype(np.int64)
        return epoch, views, prob[views]

    def epoch_views(self, epoch: int) -> np.ndarray:
        """``plan.per_rank`` views drawn from the averages when ``epoch`` is first asked for (kept)."""
        if self._planned is None or self._planned[0] != epoch:
            self._planned = self._plan(epoch)
        return self._planned[1]

    def epoch_probs(self, epoch: int) -> np.ndarray:
        """(per_rank,) float64: the probability each of ``epoch_views(epoch)`` was drawn with."""
        self.epoch_views(epoch)
        assert self._planned is not None
        return self._planned[2]

    def observe(self, positions: np.ndarray, losses: np.ndarray) -> None:
        """Fold ``losses[k]`` into the average of view ``positions[k]``, in order."""
        for position, loss in zip(positions.tolist(), losses.tolist(), strict=True):
            if self.counts[position]:
                self.ema[position] = self.decay * self.ema[position] + (1 - self.decay) * loss
            else:
                self.ema[position] = loss
            self.counts[position] += 1

    def state_dict(self) -> dict[str, Any]:
        planned = None
        if self._planned is not None:
            epoch, views, prob = self._planned
            planned = {"epoch": epoch, "views": views.tolist(), "prob": prob.tolist()}
        return {"kind": "loss", "ema": self.ema.tolist(), "counts": self.counts.tolist(), "planned": planned}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        n = self.plan.n_images
        try:
            if state.get("kind") != "loss":
                raise ValueError(f"kind {state.get('kind')!r}")
            ema = np.asarray(state["ema"], np.float64)
            counts = np.asarray(state["counts"], np.int64)
            planned, kept = state["planned"], None
            if planned is not None:
                views = np.asarray(planned["views"], np.int64)
                prob = np.asarray(planned["prob"], np.float64)
                if views.shape != (self.plan.per_rank,) or prob.shape != views.shape:
                    raise ValueError("a plan of another size")
                if len(views) and (views.min() < 0 or views.max() >= n):
                    raise ValueError("views out of range")
                kept = (int(planned["epoch"]), views, prob)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ResumeError(f"image loader state: views: not a loss view-sampling state ({exc})") from exc
        if ema.shape != (n,) or counts.shape != (n,):
            raise ResumeError(f"image loader state: views: expected {n} views, got {ema.shape[0]}")
        self.ema, self.counts, self._planned = ema, counts, kept


_TAG_INSTANTS = 0x696E7374  # "inst"


def instants_of(times: np.ndarray | None, cameras: np.ndarray | None, where: str) -> np.ndarray:
    """(n_instants, K) positions of the views of each instant (rows by time, each row by camera) of
    a split whose views have ``times`` (and rig ``cameras``, when the store has them).

    Raises:
        ConfigError: no times, or instants of different numbers of views, or a camera twice in one.
    """
    if times is None:
        raise ConfigError(f"image loader: synchronous: {where} has no times (a static capture)")
    values, inverse, counts = np.unique(times, return_inverse=True, return_counts=True)
    if counts.min() != counts.max():
        few, many = int(np.argmin(counts)), int(np.argmax(counts))
        raise ConfigError(
            f"image loader: synchronous: {where}: instants of different sizes (time {values[few]:g}: "
            f"{counts[few]} views, time {values[many]:g}: {counts[many]}); expected every camera at every "
            "time"
        )
    key = np.zeros(len(times), np.int64) if cameras is None else np.asarray(cameras, np.int64)
    order = np.lexsort((key, inverse))
    grouped = order.reshape(len(values), int(counts[0]))
    if cameras is not None and np.any(np.diff(key[grouped], axis=1) == 0):
        raise ConfigError(f"image loader: synchronous: {where}: a camera twice at one time")
    return grouped


class SynchronousViews:
    """Time-synchronous views for splatting trainers: every batch holds whole instants (all the
    cameras of one time, by camera), so a batch of ``K`` views (K cameras an instant) is one instant.

    Epoch ``e`` visits the instants in the order ``default_rng([seed, 0x696E7374, e]).permutation(T)``
    (``arange(T)`` without shuffling); rank ``r`` of ``R`` takes instants ``r, r + R, ...`` of its
    first ``R * (T // R)``, so ranks are disjoint and each sees ``T // R`` instants an epoch (the
    plan's ``per_rank`` is ``K`` times that). A pure function of the seed: resuming is the loader's
    position; the state records the instants' shape, checked on resume.
    """

    def __init__(self, plan: ImagePlan, instants: np.ndarray) -> None:
        self.plan, self.instants = plan, instants
        self._last: tuple[int, np.ndarray] | None = None

    def epoch_views(self, epoch: int) -> np.ndarray:
        if self._last is None or self._last[0] != epoch:
            plan, n = self.plan, len(self.instants)
            order = np.arange(n)
            if plan.shuffle:
                order = np.random.default_rng([plan.seed, _TAG_INSTANTS, epoch]).permutation(n)
            mine = order[plan.rank : plan.world_size * (n // plan.world_size) : plan.world_size]
            self._last = epoch, self.instants[mine].reshape(-1).astype(np.int64)
        return self._last[1]

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "synchronous", "instants": list(self.instants.shape)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if dict(state) != self.state_dict():
            raise ResumeError(
                "image loader state: views: expected the synchronous views of "
                f"{self.state_dict()['instants']} (instants, cameras), got {dict(state)!r}"
            )
