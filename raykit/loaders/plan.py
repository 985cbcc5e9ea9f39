"""The sampling plan: which rays batch ``k`` of epoch ``e`` holds, as a pure function.

Vocabulary. A split holds ``n_rays`` rays in ``n_chunks`` chunks of ``chunk_rays`` rays (the last chunk
may be shorter); the ray with *ray id* ``i`` is ray ``i % chunk_rays`` of chunk ``i // chunk_rays``.
The epoch's chunks laid end to end in ``chunk_order`` are a virtual sequence of ``n_rays``
*positions*, cut into ``world_size`` *shares* (``share``), each cut into *windows* of ``mix_chunks``
chunks permuted in runs of ``mix_run`` rays (``window_permutation``); batch ``k`` is positions
``[k * batch_size, (k + 1) * batch_size)`` of the permuted share. Why, ``drop_last`` and ranks:
``docs/loading.md`` ("How a batch is made", "Epochs, drop_last and ranks").
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from raykit.errors import ConfigError

__all__ = ["SamplingPlan", "check_plan_fields", "reference_epoch_ray_ids", "runs_to_positions"]

# Stream tags that keep the seeded generators of different purposes independent.
_TAG_CHUNKS = 0
_TAG_WINDOW = 1


@dataclass(frozen=True)
class SamplingPlan:
    """Where every batch's rays come from, for one rank of one split.

    Attributes:
        n_rays, chunk_rays: the split's rays, and rays per chunk (the last chunk may be shorter).
        shuffle: permute chunks and mix rays; ``False`` reads the split in stored order.
        batch_size, seed, drop_last, mix_chunks, mix_run, world_size, rank: as for ``RayLoader``.
    """

    n_rays: int
    chunk_rays: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True
    mix_chunks: int = 8
    world_size: int = 1
    rank: int = 0
    mix_run: int = 1

    def __post_init__(self) -> None:
        positive = ("n_rays", "chunk_rays", "batch_size", "mix_chunks", "world_size", "mix_run")
        check_plan_fields("sampling plan", self, positive)
        shortest = self.n_rays // self.world_size
        if self.drop_last and shortest < self.batch_size:
            raise ConfigError(
                f"sampling plan: expected at least batch_size={self.batch_size} rays per rank with "
                f"drop_last, got {shortest} ({self.n_rays} rays over {self.world_size} ranks)"
            )
        if shortest < 1:
            raise ConfigError(f"sampling plan: expected at least one ray per rank, got {self.n_rays} rays")

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def n_chunks(self) -> int:
        return math.ceil(self.n_rays / self.chunk_rays)

    @property
    def window_rays(self) -> int:
        return self.mix_chunks * self.chunk_rays

    @property
    def share(self) -> tuple[int, int]:
        """``(start, stop)`` of this rank's share, in positions of the epoch's virtual sequence."""
        base, extra = divmod(self.n_rays, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (self.rank < extra)

    @property
    def share_rays(self) -> int:
        start, stop = self.share
        return stop - start

    @property
    def n_batches(self) -> int:
        """Batches per epoch; the same on every rank."""
        shortest = self.n_rays // self.world_size
        if self.drop_last:
            return shortest // self.batch_size
        return math.ceil(shortest / self.batch_size)

    @property
    def epoch_rays(self) -> int:
        """Rays this rank yields per epoch."""
        if self.drop_last:
            return self.n_batches * self.batch_size
        return self.share_rays

    @property
    def n_windows(self) -> int:
        return math.ceil(self.epoch_rays / self.window_rays) if self.epoch_rays else 0

    # ---- batches and windows -----------------------------------------------------------------
    def batch_span(self, k: int) -> tuple[int, int]:
        """``(start, stop)`` of batch ``k`` in positions of the permuted share."""
        if not 0 <= k < self.n_batches:
            raise ConfigError(f"sampling plan: expected batch index in [0, {self.n_batches}), got {k}")
        start = k * self.batch_size
        if k == self.n_batches - 1 and not self.drop_last:
            return start, self.share_rays
        return start, start + self.batch_size

    def window_span(self, j: int) -> tuple[int, int]:
        """``(start, stop)`` of window ``j`` in positions of the share (before and after mixing)."""
        start = j * self.window_rays
        return start, min(start + self.window_rays, self.share_rays)

    def chunk_order(self, epoch: int) -> np.ndarray:
        """(n_chunks,) int64: the chunks of ``epoch`` in reading order (shared by all ranks)."""
        if not self.shuffle:
            return np.arange(self.n_chunks, dtype=np.int64)
        rng = np.random.default_rng([self.seed, epoch, _TAG_CHUNKS])
        return rng.permutation(self.n_chunks).astype(np.int64)

    def epoch_segments(
        self, epoch: int, first: int = 0, stop: int | None = None
    ) -> list[list[tuple[int, int, int]]]:
        """The pieces of chunks that windows ``first..stop`` (default: to the last) cover, in order: for
        each window, ``(chunk, lo, hi)`` ray offsets."""
        order = self.chunk_order(epoch)
        last = self.n_rays - (self.n_chunks - 1) * self.chunk_rays  # the last chunk may be shorter
        sizes = np.where(order == self.n_chunks - 1, last, self.chunk_rays).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        out = []
        for j in range(first, self.n_windows if stop is None else stop):
            w_start, w_stop = self.window_span(j)
            lo_pos, hi_pos = self.share[0] + w_start, self.share[0] + w_stop
            slot = bisect.bisect_right(starts, lo_pos) - 1
            segments = []
            while slot < len(order) and starts[slot] < hi_pos:
                c_start, c_stop = starts[slot], starts[slot + 1]
                segments.append(
                    (int(order[slot]), max(lo_pos, c_start) - c_start, min(hi_pos, c_stop) - c_start)
                )
                slot += 1
            out.append(segments)
        return out

    def window_runs(self, epoch: int, j: int) -> np.ndarray:
        """(ceil(window length / mix_run),) int64: run ``r`` of the mixed window is unmixed run
        ``runs[r]``, a run being ``mix_run`` consecutive positions (the window's last run may be short)."""
        start, stop = self.window_span(j)
        n_runs = -(-(stop - start) // self.mix_run)
        if not self.shuffle:
            return np.arange(n_runs, dtype=np.int64)
        key = [self.seed, epoch, _TAG_WINDOW, self.world_size, self.rank, j]
        return np.random.default_rng(key).permutation(n_runs)

    def window_permutation(self, epoch: int, j: int) -> np.ndarray:
        """(window length,) int64: position ``q`` of the mixed window holds unmixed position ``perm[q]``."""
        start, stop = self.window_span(j)
        return runs_to_positions(self.window_runs(epoch, j), self.mix_run, stop - start)

    def window_ray_ids(self, epoch: int, j: int) -> np.ndarray:
        """(window length,) int64: ray ids of window ``j`` after mixing."""
        segments = self.epoch_segments(epoch, j, j + 1)[0]
        ids = [c * self.chunk_rays + np.arange(lo, hi) for c, lo, hi in segments]
        return np.concatenate(ids)[self.window_permutation(epoch, j)]

    def batch_windows(self, k: int) -> list[tuple[int, int, int]]:
        """The pieces of windows batch ``k`` covers: ``(window, lo, hi)`` offsets in the mixed window."""
        return self.span_windows(*self.batch_span(k))

    def span_windows(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """The pieces of windows that positions ``[start, stop)`` of the permuted share cover."""
        pieces = []
        for j in range(start // self.window_rays, (stop - 1) // self.window_rays + 1):
            w_start, w_stop = self.window_span(j)
            pieces.append((j, max(start, w_start) - w_start, min(stop, w_stop) - w_start))
        return pieces

    def batch_ray_ids(self, epoch: int, k: int) -> np.ndarray:
        """(batch length,) int64: ray ids of batch ``k`` of ``epoch``, in batch order."""
        parts = [self.window_ray_ids(epoch, j)[lo:hi] for j, lo, hi in self.batch_windows(k)]
        return np.concatenate(parts)

    # ---- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingPlan:
        return cls(**d)


def check_plan_fields(what: str, plan: Any, positive: tuple[str, ...]) -> None:
    """Raise ``ConfigError`` (``what: expected ...``) unless the fields ``positive`` of ``plan`` are
    positive integers, ``0 <= rank < world_size`` and ``seed >= 0``."""
    for name in positive:
        value = getattr(plan, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{what}: expected {name} a positive integer, got {value!r}")
    if not 0 <= plan.rank < plan.world_size:
        raise ConfigError(f"{what}: expected rank in [0, {plan.world_size}), got {plan.rank}")
    if plan.seed < 0:
        raise ConfigError(f"{what}: expected seed >= 0, got {plan.seed}")


def runs_to_positions(runs: np.ndarray, mix_run: int, size: int) -> np.ndarray:
    """(size,) int64 positions of a window of ``size`` rays mixed by run order ``runs``."""
    if mix_run == 1:
        return runs
    positions = (runs[:, None] * mix_run + np.arange(mix_run)).reshape(-1)
    return positions[positions < size] if size % mix_run else positions


def reference_epoch_ray_ids(plan: SamplingPlan, epoch: int) -> list[np.ndarray]:
    """Simple twin of :meth:`SamplingPlan.batch_ray_ids`: every batch of ``epoch``, built ray by ray.

    Returns:
        ``n_batches`` int64 arrays of ray ids.
    """
    sequence: list[int] = []
    for chunk in plan.chunk_order(epoch).tolist():
        size = min(plan.chunk_rays, plan.n_rays - chunk * plan.chunk_rays)
        sequence.extend(chunk * plan.chunk_rays + offset for offset in range(size))
    start, stop = plan.share
    share = sequence[start:stop]
    mixed: list[int] = []
    for j in range(math.ceil(len(share) / plan.window_rays)):
        window = share[j * plan.window_rays : (j + 1) * plan.window_rays]
        mixed.extend(window[q] for q in plan.window_permutation(epoch, j).tolist())
    batches = []
    for k in range(plan.n_batches):
        lo = k * plan.batch_size
        hi = len(mixed) if (k == plan.n_batches - 1 and not plan.drop_last) else lo + plan.batch_size
        batches.append(np.asarray(mixed[lo:hi], dtype=np.int64))
    return batches
