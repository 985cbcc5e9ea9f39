"""Issue 26: the ray loader with and without workers, ``num_workers="auto"``, and the images layout.

Each case runs in a fresh process (``PYTHONPATH`` on this checkout), cases interleaved over
``--rounds`` rounds: open the store, make the loader (batch 4096, CPU, 2 torch threads), wait for its
workers, take the first batch, then time ``--batches`` batches. Cases: the rays store with 0 and 2
workers and ``"auto"``; the images store (window 16) with 0 workers and ``"auto"``. Reports the median
steady rays/s per case, the images/rays ratio, each run's 1-minute load and what ``auto`` chose.

    python benchmarks/make_loader_stores.py --views 40 --size 800
    python benchmarks/bench_loader_modes.py benchmarks/data/loader-synthetic-40-800 --rounds 3

Results go to ``benchmarks/results/loader_modes.json``.
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

from machine import command_line, describe

ROOT = Path(__file__).resolve().parent
CASES = {
    "rays_w0": ("rays.zarr", {"num_workers": 0}),
    "rays_w2": ("rays.zarr", {"num_workers": 2}),
    "rays_auto": ("rays.zarr", {}),
    "images_w0": ("images.zarr", {"num_workers": 0, "window_images": 16}),
    "images_auto": ("images.zarr", {"window_images": 16}),
}


def case(url: str, options: dict[str, Any], batches: int) -> dict[str, Any]:
    """One run in this process: steady rays/s after the first batch, workers up."""
    import torch

    from raykit.loaders import RayLoader
    from raykit.store import open_store

    torch.set_num_threads(2)
    start = time.perf_counter()
    loader = RayLoader(open_store(url), "train", 4096, seed=0, cache_bytes=1 << 30, **options)
    loader.wait_for_workers()
    iterator = loader.forever()
    first = len(next(iterator))
    first_s = time.perf_counter() - start
    t0, rays = time.perf_counter(), 0
    for _, batch in zip(range(batches), iterator, strict=False):
        rays += len(batch)
    seconds = time.perf_counter() - t0
    out = {"steady_rays_per_s": rays / seconds, "first_batch_s": first_s, "first_rays": first,
           "num_workers": loader.num_workers, "workers_reason": loader.workers_reason,
           "loadavg_1m": os.getloadavg()[0],
           "loader_seconds": {k: round(v, 3) for k, v in loader.seconds.items()}}  # fmt: skip
    loader.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", type=Path, nargs="?", help="directory with rays.zarr and images.zarr")
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "loader_modes.json")
    parser.add_argument("--case", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(case(args.case[0], json.loads(args.case[1]), int(args.case[2]))))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CASES}
    for _ in range(args.rounds):
        for name, (store, options) in CASES.items():
            cmd = [sys.executable, __file__, "--case", str((args.stores / store).resolve()),
                   json.dumps(options), str(args.batches)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(name, json.dumps(runs[name][-1]), flush=True)
    medians = {n: sorted(r["steady_rays_per_s"] for r in rs)[len(rs) // 2] for n, rs in runs.items()}
    report = {
        "benchmark": "loader-modes",
        "command": command_line(),
        "batches": args.batches,
        "runs": runs,
        "median_steady_rays_per_s": medians,
        "images_over_rays": medians["images_w0"] / medians["rays_w0"],
        "w2_over_w0": medians["rays_w2"] / medians["rays_w0"],
        "machine": describe(2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("median_steady_rays_per_s", "images_over_rays", "w2_over_w0")}))


if __name__ == "__main__":
    main()
