"""``raykit bench`` of an images-layout split: the windowed-shuffle loader, end to end and by stage.

The report has the keys of :func:`raykit.profiling.loader.run_bench` (so one table shows either
layout) plus the figures that compare the layouts: ``read_mb_per_s`` (stored bytes read per second,
end to end), ``decode_share`` (decoding's part of the time of all stages) and ``shuffle_quality``.

Stages, as the loader's own stages time themselves (``RayLoader.seconds``) over the measured batches,
in a loader that decodes on its own thread (each step on its thread, so they overlap):

* ``read``: the stored bytes of the images that enter the window (CRC-checked);
* ``decode``: those bytes to pixels (what worker processes do);
* ``enter``: decoded images put in the epoch's ray order as they enter the window;
* ``gather``: each group's rays from the window images (the plan's draws);
* ``generate``: compact rays -> ``RayBatch`` on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raykit.loaders import RayLoader, WindowPlan
from raykit.profiling.mixing import shuffle_quality
from raykit.profiling.timing import MB, rate, report_head, timed_loop
from raykit.store import RayStore

__all__ = ["run_images_bench"]


def run_images_bench(
    store: RayStore,
    split: str,
    batch_size: int,
    workers: int,
    cache_bytes: int,
    device: Any,
    batches: int,
    seed: int,
) -> dict[str, Any]:
    """:func:`raykit.profiling.loader.run_bench` of an images-layout ``split`` (its arguments)."""
    device = torch.device(device)
    info = store.splits[split]
    channels = store.rgba_channels
    entry = store.index[split]
    stored_per_ray = sum(int(b) for b in entry["image_bytes"]) / info.n_rays
    kwargs = {"batch_size": batch_size, "seed": seed, "device": device, "num_workers": workers,
              "cache_bytes": cache_bytes}  # fmt: skip
    loader = RayLoader(store, split, **kwargs)  # the window strategy (the split's layout)
    batches = max(1, min(batches, len(loader)))
    cold = timed_loop(loader, batches, channels + 4)
    loader.load_state_dict({**loader.state_dict(), "epoch": 0, "batch": 0})
    loader.wait_for_workers()
    warm = timed_loop(loader, batches, channels + 4)
    loader.close()
    plan = loader.plan
    assert isinstance(plan, WindowPlan)
    # The stages' own times: a loader decoding on its own thread (worker processes time nothing here).
    rows = store.split_rows(split)
    staged = RayLoader(store, split, **{**kwargs, "num_workers": 0})
    rays, images = 0, list[np.ndarray]()
    for _, batch in zip(range(batches), staged, strict=False):
        rays += len(batch)
        if len(images) < 50 and len(batch) == batch_size:
            images.append(batch.image.cpu().numpy() - rows[0])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    staged.close()
    pieces = [p for _, p in zip(range(batches), plan.iter_batches(0), strict=False)]
    entering = {i for batch in pieces for i, _, _ in batch}
    read_bytes = sum(int(entry["image_bytes"][i]) for i in entering)
    seconds = staged.seconds
    stages = {
        "read": {
            **rate(rays, seconds["read"], stored_per_ray),
            "mb_per_s": read_bytes / max(seconds["read"], 1e-9) / MB,
        },
        "decode": rate(rays, seconds["decode"], channels),
        "enter": rate(rays, seconds["enter"], channels),
        "gather": rate(rays, seconds["gather"], channels + 4),
        "generate": rate(rays, seconds["generate"], channels + 4),
    }
    total = sum(s["seconds"] for s in stages.values())
    settings = {"batch_size": batch_size, "workers": workers, "cache_bytes": cache_bytes, "device": device,
                "batches": batches, "seed": seed, "window_images": plan.window_images}  # fmt: skip
    return {
        **report_head(store, split, "images", **settings),
        "cold": cold,
        "warm": warm,
        "cache": {"hit_rate": 0.0, "bytes": 0, "window_images": plan.window_images},
        "stages": stages,
        "read_mb_per_s": read_bytes / max(warm["seconds"], 1e-9) / MB,
        "stored_bytes_per_ray": stored_per_ray,
        "decode_share": stages["decode"]["seconds"] / max(total, 1e-9),
        "shuffle_quality": shuffle_quality(images, store.table.n_pixels[rows]) if images else None,
    }
