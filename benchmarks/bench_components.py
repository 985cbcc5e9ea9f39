"""Loaders with masks and depth maps against the same loaders without them (issue 45): interleaved A/B.

The built-in scene (``--size``) is written as a nerfstudio capture with masks and depth maps
(``raykit.testing.write_nerfstudio``) and converted once to a rays-layout and an images-layout store
(``--work``, reused). In this one process, for each loader, one loader with ``components=()`` (off)
and one with ``None`` (every component the store has: mask and depth, on) are made, each runs its first
epoch (timed: ``*_first_epoch``, the cold cost, pixels and components decoded as first used), then
``--rounds`` rounds alternate them (order flipped every round), each timing a window of batches after
draining what its prefetch made meanwhile:

* ``rays_loader``: ``RayLoader`` on the rays-layout store, batches of 4096, no worker processes, rays/s
  over windows of ``--batches`` batches;
* ``images_loader``: the same on the images-layout store (its window strategy);
* ``image_loader``: ``ImageLoader`` on the images-layout store, one image a batch, images/s over windows
  of ``--batches`` batches.

Each window also records its figure per second of the process's CPU time (``*_cpu``: the loader's
cost, steadier than wall time on a shared machine). The result is each figure's median over the
rounds and the ratio on/off (target: at least 0.85); the first epochs likewise (``*_first_epoch_*_cpu``).

    python benchmarks/bench_components.py --size small --rounds 10 --out benchmarks/results/components.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
VARIANTS = {"off": (), "on": None}


def make_stores(size: str, work: Path) -> tuple[Path, Path]:
    """The capture and its two stores (reused when there)."""
    from raykit.converters import convert
    from raykit.testing import render_scene, write_nerfstudio

    rays, images = work / "rays.zarr", work / "images.zarr"
    capture = work / "capture"
    if not (capture / "transforms.json").exists():
        scene = render_scene(size, seed=0, workers=2)
        write_nerfstudio(scene, capture, masks=True, depth=True, depth_format="npy")
    if not (rays / "manifest.json").exists():
        convert(capture, rays, threads=2)
    if not (images / "manifest.json").exists():
        convert(capture, images, threads=2, layout="images")
    return rays, images


def timed(batches: Any, n: int, per_batch: bool) -> tuple[float, float]:
    """Batches (or rays) per second over the next ``n`` of ``batches``, and per second of this process's
    CPU time (all its threads: the cost, steadier than wall time on a shared machine)."""
    start, cpu, count = time.perf_counter(), time.process_time(), 0
    for _ in range(n):
        batch = next(batches)
        count += 1 if per_batch else len(batch)
    return count / (time.perf_counter() - start), count / (time.process_time() - cpu)


def measure(rays: Path, images: Path, rounds: int, window: int) -> list[dict[str, Any]]:
    """One record per (round, variant): each loader's first epoch and its timed window."""
    from raykit.loaders import ImageLoader, RayLoader
    from raykit.store import open_store

    def make(kind: str, components: Any) -> Any:
        if kind == "image_loader":
            return ImageLoader(open_store(images), "train", 1, 0, components=components)
        path = rays if kind == "rays_loader" else images
        return RayLoader(open_store(path), "train", 4096, 0, num_workers=0, components=components)

    kinds = {
        "rays_loader": (window, False),
        "images_loader": (window, False),
        "image_loader": (window, True),
    }
    unit = {True: "images_per_s", False: "rays_per_s"}
    records: dict[tuple[int, str], dict[str, Any]] = {}
    for round_ in range(rounds):
        for kind, (n, per_image) in kinds.items():
            for variant in VARIANTS if round_ % 2 == 0 else reversed(VARIANTS):
                loader = make(kind, VARIANTS[variant])  # a fresh loader: no instance's luck carries over
                stream = loader.forever()
                record = records.setdefault((round_, variant), {})
                first, first_cpu = timed(stream, len(loader), per_image)
                record[f"{kind}_first_epoch_{unit[per_image]}"] = first
                record[f"{kind}_first_epoch_{unit[per_image]}_cpu"] = first_cpu
                figure, per_cpu = timed(stream, n, per_image)
                record[f"{kind}_{unit[per_image]}"] = figure
                record[f"{kind}_{unit[per_image]}_cpu"] = per_cpu
                stream.close()
                loader.close()
    return [{"round": r, "variant": v, **figures} for (r, v), figures in sorted(records.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", help="the built-in scene's size (tiny, small, realistic)")
    parser.add_argument("--work", type=Path, default=None, help="where the capture and stores go")
    parser.add_argument("--batches", type=int, default=1000, help="batches per timed window")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    from machine import command_line, describe

    work = args.work or DATA / f"components-{args.size}"
    work.mkdir(parents=True, exist_ok=True)
    rays, images = make_stores(args.size, work)
    load_before = os.getloadavg()[0]
    runs = measure(rays, images, args.rounds, args.batches)
    for run in runs:
        print(json.dumps(run), flush=True)
    medians = {
        variant: {
            key: statistics.median(r[key] for r in runs if r["variant"] == variant and key in r)
            for key in {k for r in runs for k in r if "_per_s" in k}
        }
        for variant in VARIANTS
    }
    ratios = {key: medians["on"][key] / medians["off"][key] for key in sorted(medians["on"])}
    report = {"command": command_line(), "machine": describe(2), "size": args.size, "batches": args.batches,
              "rounds": args.rounds, "loadavg_1m_before": load_before,
              "loadavg_1m_after": os.getloadavg()[0], "medians": medians,
              "ratio_on_off": ratios, "target": 0.85, "runs": runs}  # fmt: skip
    print(json.dumps({"ratio_on_off": ratios}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
