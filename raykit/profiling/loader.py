"""Loader profiling: rays/s and MB/s, cold and warm, by stage, and how well batches are mixed.

Stages, each timed on its own over the same rays:

* ``read``: read and decompress chunks from the store (what worker processes do);
* ``gather``: mixing-window assembly and per-batch gathers from cached chunks;
* ``generate``: compact rays -> ``RayBatch`` (pixel-id decoding and ray generation), in groups of
  ``group_rays`` on ``gen_threads`` threads as the loader does;
* ``h2d``: host-to-device copy of the compact arrays (pinned, non-blocking), CUDA only.

``end_to_end`` runs the loader itself, cold (empty cache; worker processes start meanwhile) and then
warm (the same batches again once the workers are up, their chunks now cached when the budget
allows). ``shuffle_quality`` (``raykit.profiling.mixing``) is the mean number of distinct images
in a batch divided by its expectation for rays drawn uniformly at random from the split (1.0 is as
good as a perfect shuffle).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import numpy as np
import torch

from raykit.errors import ConfigError
from raykit.loaders import RAY_CACHE_BYTES, DeviceBatcher, RayLoader
from raykit.profiling.mixing import shuffle_quality
from raykit.profiling.timing import MB, rate, report_head, timed_loop
from raykit.ranges import device_problem
from raykit.store import RawRays, RayStore, payload_bytes

__all__ = ["format_table", "run_bench", "write_png"]


def _stage_read(store: RayStore, split: str, chunks: list[int], bytes_per_ray: float) -> dict[str, float]:
    from raykit.store import open_store

    fresh = open_store(store.url)
    start = time.perf_counter()
    rays = sum(len(fresh.read_chunk(split, c)) for c in chunks)
    return rate(rays, time.perf_counter() - start, bytes_per_ray)


def _stage_generate(
    store: RayStore, raws: list[RawRays], loader: RayLoader, device: Any, bytes_per_ray: float
) -> dict[str, float]:
    """Generation as the loader does it: groups of ``group_rays`` on ``gen_threads`` threads."""
    batcher = DeviceBatcher(store, device)
    per_group = max(1, loader.group_rays // loader.plan.batch_size)
    groups = [RawRays.concat(raws[i : i + per_group]) for i in range(0, len(raws), per_group)]
    batcher(groups[0])
    with ThreadPoolExecutor(loader.gen_threads, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        start = time.perf_counter()
        list(pool.map(batcher, groups))
        if batcher.device.type == "cuda":
            torch.cuda.synchronize(batcher.device)
        seconds = time.perf_counter() - start
    return rate(sum(len(r) for r in raws), seconds, bytes_per_ray)


def _stage_h2d(raws: list[RawRays], device: torch.device, bytes_per_ray: float) -> dict[str, float] | None:
    if device.type != "cuda":
        return None
    pinned = [
        (torch.from_numpy(r.rgba).pin_memory(), torch.from_numpy(r.pid.view(np.int32)).pin_memory())
        for r in raws
    ]
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for rgba, pid in pinned:
        rgba.to(device, non_blocking=True), pid.to(device, non_blocking=True)
    torch.cuda.synchronize(device)
    return rate(sum(len(r) for r in raws), time.perf_counter() - start, bytes_per_ray)


def run_bench(
    store: RayStore,
    split: str = "train",
    batch_size: int = 4096,
    workers: int = 0,
    cache_bytes: int = RAY_CACHE_BYTES,
    device: Any = "cpu",
    batches: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """Profile loading ``batches`` batches of ``split``; returns a JSON-able report.

    Raises:
        ConfigError: ``split`` is not one of the store's, or ``device`` not one this machine has.
    """
    if split not in store.splits:
        raise ConfigError(f"--split: {store.url} has no split {split!r} (it has {', '.join(store.splits)})")
    if problem := device_problem(device):
        raise ConfigError(f"--{problem}")
    if store.splits[split].holds_images:  # the windowed shuffle (raykit.profiling.images_bench)
        from raykit.profiling.images_bench import run_images_bench

        return run_images_bench(store, split, batch_size, workers, cache_bytes, device, batches, seed)
    device = torch.device(device)
    info = store.splits[split]
    bytes_per_ray = store.fields["rgba"].channels + 4
    kwargs = {
        "batch_size": batch_size,
        "seed": seed,
        "device": device,
        "num_workers": workers,
        "cache_bytes": cache_bytes,
    }
    loader = RayLoader(store, split, **kwargs)
    batches = max(1, min(batches, len(loader)))
    cold = timed_loop(loader, batches, bytes_per_ray)
    loader.load_state_dict({**loader.state_dict(), "epoch": 0, "batch": 0})
    loader.wait_for_workers()  # their start-up (importing torch) counts in cold only
    warm = timed_loop(loader, batches, bytes_per_ray)
    cache = loader.cache_stats().to_dict()
    loader.close()
    stage_loader = RayLoader(store, split, **{**kwargs, "num_workers": 0})
    stage_loader.cache = loader.cache  # warm: the chunks the end-to-end runs cached
    gather_start = time.perf_counter()
    raws = [raw for _, raw in zip(range(batches), stage_loader.raw_batches(0), strict=False)]
    gather = rate(sum(len(r) for r in raws), time.perf_counter() - gather_start, bytes_per_ray)
    needed = min(info.n_chunks, -(-batches * batch_size // info.chunk_rays) + loader.plan.mix_chunks)
    stages = {
        "read": _stage_read(store, split, loader.plan.chunk_order(0)[:needed].tolist(), bytes_per_ray),
        "gather": gather,
        "generate": _stage_generate(store, raws, stage_loader, device, bytes_per_ray),
        "h2d": _stage_h2d(raws, device, bytes_per_ray),
    }
    in_split = store.split_rows(split)
    pixels = store.table.n_pixels[in_split]
    images = [store.decode_pids(r.pid)[0] - in_split[0] for r in raws[:50] if len(r) == batch_size]
    stored = payload_bytes(store)
    stage_s = sum(r["seconds"] for r in stages.values() if r is not None)
    settings = {"batch_size": batch_size, "workers": workers, "cache_bytes": cache_bytes, "device": device,
                "batches": batches, "seed": seed}  # fmt: skip
    return {
        **report_head(store, split, "rays", **settings),
        "read_mb_per_s": stored
        / max(sum(i.n_rays for i in store.splits.values()), 1)
        * warm["rays_per_s"]
        / MB,  # each ray read once an epoch, at the payload's bytes per ray
        "decode_share": stages["read"]["seconds"] / max(stage_s, 1e-9),  # type: ignore[index]  # read: decompressing
        "cold": cold,
        "warm": warm,
        "cache": cache,
        "stages": stages,
        "shuffle_quality": shuffle_quality(images, pixels) if images else None,
    }


def format_table(report: dict[str, Any]) -> str:
    """The report as a plain-text table."""
    rows = [("stage", "rays/s", "MB/s", "seconds")]
    for name in ("cold", "warm"):
        r = report[name]
        rows.append(
            (
                f"end-to-end {name}",
                f"{r['rays_per_s'] / 1e6:.2f} M",
                f"{r['mb_per_s']:.0f}",
                f"{r['seconds']:.3f}",
            )
        )
    for name, r in report["stages"].items():
        if r is not None:
            rows.append(
                (name, f"{r['rays_per_s'] / 1e6:.2f} M", f"{r['mb_per_s']:.0f}", f"{r['seconds']:.3f}")
            )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    s = report["settings"]
    header = (
        f"{report['store']} ({report['backend']}, split {report['split']}, {report['n_rays']} rays) "
        f"batch {s['batch_size']}, workers {s['workers']}, cache {s['cache_bytes'] / MB:g} MB, {s['device']}"
    )
    q = report["shuffle_quality"]
    footer = [
        f"first batch: cold {report['cold']['first_batch_s'] * 1e3:.1f} ms, "
        f"warm {report['warm']['first_batch_s'] * 1e3:.1f} ms",
        f"cache: hit rate {report['cache']['hit_rate']:.2f}, {report['cache']['bytes'] / MB:.1f} MB held",
    ]
    if "decode_share" in report:
        footer.append(
            f"layout {report.get('layout', 'rays')}: {report['read_mb_per_s']:.1f} MB/s read from the store, "
            f"decode {100 * report['decode_share']:.0f} % of the stage time"
        )
    if q is not None:
        footer.append(
            f"shuffle quality: {q['distinct_images']:.1f} distinct images per batch, "
            f"{q['uniform_expected']:.1f} for a uniform draw (ratio {q['ratio']:.3f}); "
            f"histogram distance {q['tv_ratio']:.2f}x a uniform draw's"
        )
    return "\n".join([header, *lines, *footer])


def write_png(report: dict[str, Any], path: str | IO[bytes]) -> None:
    """Bar chart of rays/s by stage and end to end (matplotlib, Agg backend) as a PNG file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, values = [], []
    for name in ("cold", "warm"):
        names.append(f"end-to-end\n{name}")
        values.append(report[name]["rays_per_s"] / 1e6)
    for name, r in report["stages"].items():
        if r is not None:
            names.append(name)
            values.append(r["rays_per_s"] / 1e6)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(names, values, color=["#4c72b0"] * 2 + ["#55a868"] * (len(names) - 2))
    ax.set_ylabel("M rays/s")
    q = report["shuffle_quality"]
    title = f"raykit bench: batch {report['settings']['batch_size']}, {report['settings']['device']}"
    if q is not None:
        title += f", shuffle quality {q['ratio']:.2f}"
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
