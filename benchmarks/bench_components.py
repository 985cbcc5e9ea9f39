"""Loaders with masks and depth maps against the same loaders without them (issue 45): interleaved A/B.

The built-in scene (``--size``) is written as a nerfstudio capture with masks and depth maps
(``raykit.scene.write_nerfstudio``) and converted once to a rays-layout and an images-layout store
(``--work``, reused). Each round measures, for ``components=()`` (off) and ``None`` (every component the
store has: mask and depth) in alternating order, in this one process:

* ``rays_loader``: ``RayLoader`` on the rays-layout store, batches of 4096, no worker processes, rays/s
  over ``--batches`` batches after as many warm-up batches (the caches warm);
* ``images_loader``: the same on the images-layout store (its window strategy);
* ``image_loader``: ``ImageLoader`` on the images-layout store, one image a batch, images/s.

The result is each figure's median over the rounds and the ratio on/off (target: at least 0.85).

    python benchmarks/bench_components.py --size small --rounds 5 --out benchmarks/results/components.json
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
    from raykit.scene import render_scene, write_nerfstudio

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


def steady(loader: Any, warm: int, n: int, per_batch: bool) -> float:
    """Batches (or rays) per second over ``n`` batches after ``warm`` batches."""
    batches = loader.forever()
    for _ in range(warm):
        next(batches)
    start, count = time.perf_counter(), 0
    for _ in range(n):
        batch = next(batches)
        count += 1 if per_batch else len(batch)
    seconds = time.perf_counter() - start
    loader.close()
    return count / seconds


def measure(rays: Path, images: Path, components: Any, batches: int) -> dict[str, float]:
    from raykit.loaders import ImageLoader, RayLoader
    from raykit.store import open_store

    out = {}
    loader = RayLoader(open_store(rays), "train", 4096, 0, num_workers=0, components=components)
    out["rays_loader_rays_per_s"] = steady(loader, batches, batches, False)
    loader = RayLoader(open_store(images), "train", 4096, 0, num_workers=0, components=components)
    out["images_loader_rays_per_s"] = steady(loader, batches, batches, False)
    whole = ImageLoader(open_store(images), "train", 1, 0, components=components)
    out["image_loader_images_per_s"] = steady(whole, batches // 4, batches // 2, True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", help="the built-in scene's size (tiny, small, realistic)")
    parser.add_argument("--work", type=Path, default=None, help="where the capture and stores go")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    from machine import command_line, describe

    work = args.work or DATA / f"components-{args.size}"
    work.mkdir(parents=True, exist_ok=True)
    rays, images = make_stores(args.size, work)
    runs = []
    for round_ in range(args.rounds):
        order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
        for variant in order:
            figures = measure(rays, images, VARIANTS[variant], args.batches)
            runs.append({"round": round_, "variant": variant, **figures, "loadavg_1m": os.getloadavg()[0]})
            print(json.dumps(runs[-1]), flush=True)
    keys = ("rays_loader_rays_per_s", "images_loader_rays_per_s", "image_loader_images_per_s")
    medians = {
        variant: {k: statistics.median(r[k] for r in runs if r["variant"] == variant) for k in keys}
        for variant in VARIANTS
    }
    ratios = {k: medians["on"][k] / medians["off"][k] for k in keys}
    # per round: on / off of the same round (pairs measured back to back)
    paired = {
        k: statistics.median(
            next(r[k] for r in runs if r["round"] == i and r["variant"] == "on")
            / next(r[k] for r in runs if r["round"] == i and r["variant"] == "off")
            for i in range(args.rounds)
        )
        for k in keys
    }
    report = {"command": command_line(), "machine": describe(2), "size": args.size, "batches": args.batches,
              "medians": medians, "ratio_on_off": ratios, "median_paired_ratio": paired, "target": 0.85,
              "runs": runs}  # fmt: skip
    print(json.dumps({"ratio_on_off": ratios, "median_paired_ratio": paired}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
