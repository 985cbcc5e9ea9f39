"""Unbounded-scene benchmark: four samplers, with and without contraction, and under a samples budget.

On the unbounded variant of the built-in scene (``render_scene(size, unbounded=True)``: the built-in
objects, a wide ground, a ring of pillars 6-11 units away and a sky dome of radius 30; every pixel
opaque), each sampler (stratified, hierarchical, occupancy, proposal) trains for ``--budget`` seconds
in scene space ``box`` (the field covers the store's bounds, the whole dome) and ``contract``
(mip-NeRF 360 contraction around the cameras; what ``--scene-space auto`` picks for this store).
Then, in ``contract``, each sampler again with ``--samples-per-step`` (rays per step adapt so that
the field evaluates about that many samples per step): how each sampler spends the same budget.

Reported per run: test PSNR/SSIM, steps, rays/s, samples/ray, rays/step, samples/step, peak memory,
and the memory in use after each forward pass (first and last quarter of the run, min/max after
warm-up). The 1-minute load average before/after each run is recorded (the machine is shared).

    python benchmarks/bench_unbounded.py --budget 60            # the benchmark in BENCHMARKS.md
    python benchmarks/bench_unbounded.py --budget 10 --out out/u.json --spaces contract   # a quick look

Results go to ``benchmarks/results/trainer_unbounded.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_trainer import _records, build_store, summarize
from machine import command_line, describe, write_report

from raykit.store import open_store
from raykit.trainer import TrainConfig, train

ROOT = Path(__file__).resolve().parent


def budget_figures(run: Path, warmup_fraction: float = 0.25) -> dict[str, Any]:
    """Rays/step, samples/step and step memory from log.jsonl, split at the end of warm-up."""
    log = _records(run / "log.jsonl")
    after = log[int(len(log) * warmup_fraction) :] or log
    samples = [r["samples_per_step"] for r in after]
    memory = [r["step_memory_mb"] for r in after]
    mean = sum(samples) / len(samples)
    return {
        "rays_per_step": sum(r["rays_per_step"] for r in after) / len(after),
        "samples_per_step": mean,
        "samples_per_step_min_max": [min(samples), max(samples)],
        "step_memory_mb_min_max": [min(memory), max(memory)],
        "step_memory_variation": (max(memory) - min(memory)) / max(min(memory), 1e-9),
        "log_records_after_warmup": len(after),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget", type=float, default=60.0, help="training seconds per run")
    parser.add_argument("--samplers", default="stratified,hierarchical,occupancy,proposal")
    parser.add_argument("--spaces", default="box,contract", help="scene spaces of the main table")
    parser.add_argument("--samples-per-step", type=int, default=32768, help="budget runs (0: none)")
    parser.add_argument("--size", default="small", help="built-in scene size")
    parser.add_argument(
        "--work",
        default=str(Path(tempfile.gettempdir()) / "raykit-bench-unbounded"),
        help="store and run directories",
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "trainer_unbounded.json"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    work = Path(args.work)
    start = time.perf_counter()
    store = build_store(work / f"scene-{args.size}-unbounded", args.size, seed=0, unbounded=True)
    store_seconds = time.perf_counter() - start
    command = command_line()
    samplers = args.samplers.split(",")
    plan = [(space, sampler, None) for space in args.spaces.split(",") for sampler in samplers]
    if args.samples_per_step:
        plan += [("contract", sampler, args.samples_per_step) for sampler in samplers]
    results: dict[str, Any] = {}
    for space, sampler, per_step in plan:
        name = f"{space}/{sampler}" + (f"/budget{per_step}" if per_step else "")
        run = work / name.replace("/", "-")
        shutil.rmtree(run, ignore_errors=True)
        config = TrainConfig(
            store=str(store), out=str(run), sampler=sampler, scene_space=space, steps=1_000_000,
            max_seconds=args.budget, log_every=10, ckpt_every=100_000, threads=args.threads,
            samples_per_step=per_step,
        )  # fmt: skip
        t0, load_before = time.perf_counter(), os.getloadavg()[0]
        train(config)
        results[name] = {
            **summarize(run),
            **budget_figures(run),
            "scene_space": space,
            "sampler": sampler,
            "samples_per_step_target": per_step,
            "wall_seconds": time.perf_counter() - t0,
            "load_average_1min": [load_before, os.getloadavg()[0]],
        }
        del results[name]["progress"]
        figures = {k: results[name][k] for k in ("test_psnr", "rays_per_s", "samples_per_ray", "steps")}
        print(name, json.dumps(figures))
    report = {
        "benchmark": "trainer_unbounded",
        "scene": f"{args.size} (unbounded variant)",
        "budget_seconds": args.budget,
        "store_fingerprint": open_store(str(store)).fingerprint,
        "store_build_seconds": store_seconds,
        "machine": {**describe(torch.get_num_threads()), "torch": torch.__version__},
        "command": command,
        "results": results,
    }  # fmt: skip
    write_report(args.out, report)


if __name__ == "__main__":
    main()
