"""Interleaved A/B of the three loaders' steady state between two checkouts (e.g. a base commit and a branch).

Each round runs, for each checkout in turn, a fresh process with ``PYTHONPATH`` on that checkout that
measures, on stores both checkouts read (format 3, made once by ``--make`` with checkout A's code from the
``bench_convert.py`` / ``bench_layouts.py`` captures of scene ``--size``):

* ``rays_loader``: ``RayLoader`` on the rays-layout store, batches of 4096, no worker processes, rays/s
  over ``--batches`` batches after as many warm-up batches (the cache warm);
* ``images_loader``: the same ``RayLoader`` on the images-layout store (its window strategy);
* ``image_loader``: ``ImageLoader`` on the images-layout store, one image a batch, images/s.

Each figure comes with the process's CPU seconds per unit (``*_cpu_us``: every thread's, so the
loader's decode threads count; far less sensitive than the rate to other processes on a shared
machine), and each run records its 1-minute load average, so noisy runs can be told apart.

    python benchmarks/ab_loaders.py ../base . --size small --rounds 3 --out benchmarks/results/loaders_ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"


def child(rays_store: str, images_store: str, batches: int) -> dict[str, Any]:
    """The measurements of the checkout this process imports."""
    import torch

    torch.set_num_threads(2)
    import raykit
    from raykit.loaders import ImageLoader, RayLoader
    from raykit.store import open_store

    def steady(loader: Any, warm: int, n: int, per_batch: bool) -> tuple[float, float]:
        """Units (rays or images) per second, and CPU microseconds per unit."""
        batches_ = loader.forever()
        for _ in range(warm):
            next(batches_)
        start, cpu, count = time.perf_counter(), time.process_time(), 0
        for _ in range(n):
            batch = next(batches_)
            count += 1 if per_batch else len(batch)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        loader.close()
        return count / seconds, cpu * 1e6 / count

    out: dict[str, Any] = {"raykit": Path(raykit.__file__).parent.parent.name}  # the checkout's folder name
    rays = RayLoader(open_store(rays_store), "train", 4096, 0, num_workers=0)
    out["rays_loader_rays_per_s"], out["rays_loader_cpu_us"] = steady(rays, batches, batches, False)
    images = RayLoader(open_store(images_store), "train", 4096, 0, num_workers=0)
    out["images_loader_rays_per_s"], out["images_loader_cpu_us"] = steady(images, batches, batches, False)
    whole = ImageLoader(open_store(images_store), "train", 1, 0)
    out["image_loader_images_per_s"], out["image_loader_cpu_us"] = steady(
        whole, batches // 10, batches // 2, True
    )
    out["loadavg_1m"] = os.getloadavg()[0]
    return out


def make_stores(size: str, work: Path) -> tuple[Path, Path]:
    """The two stores, converted by the checkout this process imports (reused when there)."""
    from raykit.converters import convert

    rays, images = work / "rays.zarr", work / "images.zarr"
    if not (rays / "manifest.json").exists():
        convert(DATA / f"convert-{size}-0-photo2", rays, threads=1)
    if not (images / "manifest.json").exists():
        near_far = {"split": "every:8", "near": 0.5, "far": 8.0}
        convert(DATA / f"images-{size}-jpeg", images, threads=1, layout="images", **near_far)
    return rays, images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, nargs="?", help="checkout A (e.g. the base commit)")
    parser.add_argument("b", type=Path, nargs="?", help="checkout B")
    parser.add_argument("--size", default="small", help="the captures' scene size (their names' part)")
    parser.add_argument("--work", type=Path, default=DATA / "ab-loaders")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", nargs=2, metavar=("RAYS", "IMAGES"), help=argparse.SUPPRESS)
    parser.add_argument("--make", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.batches)))
        return
    if args.make:
        print(json.dumps([str(p) for p in make_stores(args.size, args.work)]))
        return
    from machine import command_line, describe

    args.work.mkdir(parents=True, exist_ok=True)
    env_a = {**os.environ, "PYTHONPATH": str(args.a.resolve())}
    made = subprocess.run(
        [sys.executable, __file__, "--make", "--size", args.size, "--work", str(args.work)],
        env=env_a, capture_output=True, text=True, check=True,
    )  # fmt: skip
    rays, images = json.loads(made.stdout.splitlines()[-1])
    runs = []
    for round_ in range(args.rounds):
        for root in (args.a, args.b):
            env = {**os.environ, "PYTHONPATH": str(root.resolve())}
            command = [sys.executable, __file__, "--child", rays, images, "--batches", str(args.batches)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            runs.append({"round": round_, **json.loads(done.stdout.splitlines()[-1])})
            print(json.dumps(runs[-1]), flush=True)
    if args.out:
        report = {"command": command_line(), "machine": describe(), "size": args.size, "runs": runs}
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
