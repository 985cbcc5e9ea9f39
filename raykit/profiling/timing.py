"""The measurements every ``raykit bench`` report shares: a rate, and a loader timed end to end."""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["MB", "rate", "report_head", "timed_loop"]

MB = 1 << 20


def rate(rays: int, seconds: float, bytes_per_ray: float) -> dict[str, float]:
    """``{seconds, rays_per_s, mb_per_s}`` of ``rays`` of ``bytes_per_ray`` each in ``seconds``."""
    seconds = max(seconds, 1e-9)
    return {"seconds": seconds, "rays_per_s": rays / seconds, "mb_per_s": rays * bytes_per_ray / seconds / MB}


def report_head(store: Any, split: str, layout: str, **settings: Any) -> dict[str, Any]:
    """The fields every report starts with: the store and split measured, and the ``settings`` it was
    measured with (``device`` as text, torch's thread count added)."""
    settings = {**settings, "device": str(settings["device"]), "torch_threads": torch.get_num_threads()}
    return {"store": store.url, "backend": store.backend, "layout": layout, "split": split,
            "n_rays": store.splits[split].n_rays, "settings": settings}  # fmt: skip


def timed_loop(loader: Any, batches: int, bytes_per_ray: float) -> dict[str, float]:
    """The rate of ``batches`` batches of ``loader`` (a CUDA device's work finished), with the seconds
    to its first batch."""
    start = time.perf_counter()
    iterator = iter(loader)
    first = next(iterator)
    first_s = time.perf_counter() - start
    rays = len(first)
    for _, batch in zip(range(batches - 1), iterator, strict=False):
        rays += len(batch)
    device = getattr(loader.make_batch, "device", None)
    if isinstance(device, torch.device) and device.type == "cuda":
        torch.cuda.synchronize(device)
    out = rate(rays, time.perf_counter() - start, bytes_per_ray)
    del iterator
    return {**out, "first_batch_s": first_s, "batches": batches}
