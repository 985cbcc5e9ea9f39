"""A samples budget per step: the number of rays adapts so the field sees about N samples per step.

As in nerfacc's examples: after each step, ``rays = N / samples_per_ray`` where ``samples_per_ray`` is
measured on the step just taken (smoothed by an exponential moving average, so one odd batch does
not swing the next). Rays per step are multiples of a granule (the loader's batch size): a step
concatenates that many loader batches, so the loader position stays exact on resume. The first step
assumes the sampler's largest number of samples per ray, so memory starts at or below its steady
level and never spikes while, say, an occupancy grid is still empty of pruning.

With a fixed samples budget the memory of a step (activations scale with samples, not rays) stays
flat while the samplers decide how many rays that budget buys: few rays when every ray costs many
samples (stratified, or a young occupancy grid), many when the sampler prunes well.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import torch

from raykit.rays import RayBatch

__all__ = ["SampleBudget", "concat_batches", "current_memory_mb", "take_rays"]


@dataclass
class SampleBudget:
    """Rays per step for a target of ``target`` samples per step.

    Attributes:
        target: N, samples wanted per step.
        granule: rays per step are a multiple of this (>= 1 granule).
        max_rays: upper bound on rays per step.
        rays: rays of the next step.
        samples_per_ray: smoothed measurement (0 before the first update).
        smoothing: weight of the newest measurement in the moving average.
    """

    target: int
    granule: int
    max_rays: int
    rays: int
    samples_per_ray: float = 0.0
    smoothing: float = 0.5

    @classmethod
    def start(cls, target: int, granule: int, max_samples_per_ray: int) -> SampleBudget:
        """A budget whose first step assumes ``max_samples_per_ray`` samples on every ray."""
        budget = cls(target, granule, max_rays=max(granule, _round(target, granule)), rays=granule)
        budget.rays = budget.clamp(target / max(max_samples_per_ray, 1))
        return budget

    def clamp(self, rays: float) -> int:
        """``rays`` rounded to whole granules within ``[granule, max_rays]``."""
        return min(self.max_rays, max(self.granule, _round(rays, self.granule)))

    def update(self, n_rays: int, n_samples: int) -> int:
        """Record a step's rays and samples; return the rays of the next step."""
        measured = max(n_samples, 1) / max(n_rays, 1)
        if self.samples_per_ray <= 0:
            self.samples_per_ray = measured
        else:
            self.samples_per_ray += self.smoothing * (measured - self.samples_per_ray)
        self.rays = self.clamp(self.target / self.samples_per_ray)
        return self.rays

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state (saved in checkpoints)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def _round(rays: float, granule: int) -> int:
    return math.floor(rays / granule + 0.5) * granule


def concat_batches(batches: list[RayBatch]) -> RayBatch:
    """One batch holding the rays of ``batches`` in order."""
    if len(batches) == 1:
        return batches[0]
    values: dict[str, Any] = {}
    for f in fields(RayBatch):
        parts = [getattr(b, f.name) for b in batches]
        if f.name == "extra":  # stored fields by name
            values[f.name] = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        else:
            values[f.name] = None if parts[0] is None else torch.cat(parts)
    return RayBatch(**values)


def take_rays(batches: Iterator[RayBatch], rays: int, granule: int) -> RayBatch:
    """The next ``rays`` rays (a multiple of ``granule``, the loader's batch size) from the loader."""
    return concat_batches([next(batches) for _ in range(max(1, rays // granule))])


def current_memory_mb(device: torch.device) -> float:
    """Memory in use now: CUDA allocated bytes, else this process's resident set (VmRSS)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    try:
        with open(f"/proc/{os.getpid()}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0
