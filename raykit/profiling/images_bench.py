"""``raykit bench`` of an images-layout split: the windowed-shuffle loader, end to end and by stage.

The report has the keys of :func:`raykit.profiling.loader.run_bench` (so one table shows either
layout) plus the figures that compare the layouts: ``read_mb_per_s`` (stored bytes read per second,
end to end), ``decode_share`` (decoding's part of the time of all stages) and ``shuffle_quality``.

Stages, each timed on its own over the images and rays of the measured batches:

* ``read``: the stored bytes of the images that enter the window (CRC-checked);
* ``decode``: those bytes to pixels (what worker processes do);
* ``gather``: each batch's rays from the decoded window images (the plan's draws);
* ``generate``: compact rays -> ``RayBatch`` on the device.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from raykit.loaders.batching import DeviceBatcher
from raykit.loaders.cache import ChunkCache
from raykit.loaders.loader import RayLoader
from raykit.loaders.source import WindowImageSource
from raykit.loaders.stages import StageTimes, StrategyInputs
from raykit.loaders.window import WindowPlan
from raykit.loaders.windowed import WindowDraws, gather_planned
from raykit.loaders.workers import ChunkFetcher
from raykit.profiling.mixing import shuffle_quality
from raykit.store.image_codec import decode_stored
from raykit.store.reader import RayStore

__all__ = ["run_images_bench"]

MB = 1 << 20


def _rate(rays: int, seconds: float, bytes_per_ray: float) -> dict[str, float]:
    seconds = max(seconds, 1e-9)
    return {"seconds": seconds, "rays_per_s": rays / seconds, "mb_per_s": rays * bytes_per_ray / seconds / MB}


def _timed_loop(loader: Any, batches: int, bytes_per_ray: float) -> dict[str, float]:
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
    out = _rate(rays, time.perf_counter() - start, bytes_per_ray)
    del iterator
    return {**out, "first_batch_s": first_s, "batches": batches}


def run_images_bench(
    store: RayStore,
    split: str = "train",
    batch_size: int = 4096,
    workers: int = 0,
    cache_mb: float = 512,
    device: Any = "cpu",
    batches: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """Profile ``batches`` batches of the images-layout ``split``; a JSON-able report."""
    device = torch.device(device)
    info = store.splits[split]
    channels = store.rgba_channels
    entry = store.index[split]
    stored_per_ray = sum(int(b) for b in entry["image_bytes"]) / info.n_rays
    kwargs = {"batch_size": batch_size, "seed": seed, "device": device, "num_workers": workers,
              "cache_bytes": int(cache_mb * MB)}  # fmt: skip
    loader = RayLoader(store, split, **kwargs)  # the window strategy (the split's layout)
    batches = max(1, min(batches, len(loader)))
    cold = _timed_loop(loader, batches, channels + 4)
    loader.load_state_dict({**loader.state_dict(), "epoch": 0, "batch": 0})
    loader.wait_for_workers()
    warm = _timed_loop(loader, batches, channels + 4)
    loader.close()
    plan = loader.plan
    source = loader.source
    assert isinstance(plan, WindowPlan) and isinstance(source, WindowImageSource)
    pieces = [p for _, p in zip(range(batches), plan.iter_batches(0), strict=False)]
    entering = list(dict.fromkeys(i for batch in pieces for i, _, _ in batch))
    t0 = time.perf_counter()
    data = {i: store.stored_image(split, i) for i in entering}
    t1 = time.perf_counter()
    decoded = {i: decode_stored(b, channels, store.url).reshape(-1, channels) for i, b in data.items()}
    t2 = time.perf_counter()
    fetcher = ChunkFetcher(source, ChunkCache(0), 0, 1)  # (the stage reads nothing here)
    draws = WindowDraws(StrategyInputs(source, plan, lambda: fetcher, StageTimes({}), 1))
    window = {i: draws.enter(0, i, rgba) for i, rgba in decoded.items()}
    raws = [gather_planned([(batch, {i: window[i] for i, _, _ in batch})])[0] for batch in pieces]
    t3 = time.perf_counter()
    batcher = DeviceBatcher(store, device)
    batcher(raws[0])
    t4 = time.perf_counter()
    for raw in raws:
        batcher(raw)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t5 = time.perf_counter()
    rays = sum(len(r) for r in raws)
    read_bytes = sum(len(b) for b in data.values())
    stages = {
        "read": {**_rate(rays, t1 - t0, stored_per_ray), "mb_per_s": read_bytes / max(t1 - t0, 1e-9) / MB},
        "decode": _rate(rays, t2 - t1, channels),
        "gather": _rate(rays, t3 - t2, channels + 4),
        "generate": _rate(rays, t5 - t4, channels + 4),
    }
    rows = store.split_rows(split)
    images = [store.decode_pids(r.pid)[0] - rows[0] for r in raws[:50] if len(r) == batch_size]
    total = sum(s["seconds"] for s in stages.values())
    return {
        "store": store.url,
        "backend": store.backend,
        "layout": "images",
        "split": split,
        "n_rays": info.n_rays,
        "settings": {
            "batch_size": batch_size,
            "workers": workers,
            "cache_mb": cache_mb,
            "device": str(device),
            "batches": batches,
            "seed": seed,
            "torch_threads": torch.get_num_threads(),
            "window_images": plan.window_images,
        },
        "cold": cold,
        "warm": warm,
        "cache": {"hit_rate": 0.0, "bytes": 0, "window_images": plan.window_images},
        "stages": stages,
        "read_mb_per_s": read_bytes / max(warm["seconds"], 1e-9) / MB,
        "stored_bytes_per_ray": stored_per_ray,
        "decode_share": stages["decode"]["seconds"] / max(total, 1e-9),
        "shuffle_quality": shuffle_quality(images, store.table.n_pixels[rows]) if images else None,
    }
