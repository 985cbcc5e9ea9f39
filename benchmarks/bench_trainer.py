"""Trainer benchmark: each sampler trained for a fixed time budget on the built-in "small" scene.

For each sampler (stratified, hierarchical, occupancy) one run of ``raykit.trainer.train`` with
``max_seconds=BUDGET`` on the 100x100 built-in scene (60 train / 10 test views), then the full test
evaluation. Reported per sampler: test PSNR/SSIM, steps, steps/s, rays/s, samples per ray, the time
breakdown (data wait and compute; with ``--phases`` data wait, sampling, network, rendering,
backward, optimizer, timed by ``raykit.recorder``, which synchronises the device at each), and the
quick test-PSNR curve against training time; then the training time each sampler needed to reach
stratified's final quick PSNR.

    python benchmarks/bench_trainer.py --budget 300          # the full benchmark
    python benchmarks/bench_trainer.py --budget 30 --out out/t.json   # a quick look

Results go to ``benchmarks/results/trainer.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from machine import command_line, describe, portable, write_report

import raykit.recorder
from raykit.errors import RaykitError
from raykit.store import ImageRecord, SceneInfo, open_store, write_store
from raykit.testing import render_scene
from raykit.trainer import TrainConfig, train

ROOT = Path(__file__).resolve().parent
PHASES = ("data", "sampling", "network", "rendering", "backward", "optimizer")


def _pixels(image: np.ndarray) -> np.ndarray:
    return image


def build_store(path: Path, size: str, seed: int, unbounded: bool = False) -> Path:
    """Render the built-in scene (or its unbounded variant) as a Zarr ray store (reused when there)."""
    if (path / "manifest.json").exists():
        try:
            open_store(str(path))
            return path
        except RaykitError:  # written by an older raykit: render again
            shutil.rmtree(path)
    scene = render_scene(size, seed=seed, unbounded=unbounded)
    records = [
        ImageRecord(name, split, scene.camera, scene.c2w[i], float(scene.near[i]), float(scene.far[i]),
                    f"builtin://{size}/{name}", functools.partial(_pixels, scene.images[i]))
        for i, (name, split) in enumerate(zip(scene.names, scene.splits, strict=True))
    ]  # fmt: skip
    bounds = (tuple(scene.bounds[0].tolist()), tuple(scene.bounds[1].tolist()))
    frame = "builtin scene (unbounded variant), z up" if unbounded else "builtin scene, z up"
    write_store(path, records, scene=SceneInfo(world_frame=frame, bounds=bounds), backend="zarr")
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(run: Path) -> dict[str, Any]:
    """One run's figures from its log.jsonl, progress.jsonl and eval.json."""
    log = _records(run / "log.jsonl")
    phases = [p for p in (*PHASES, "compute") if any(p in r["seconds"] for r in log)]
    seconds = {p: sum(r["seconds"].get(p, 0.0) for r in log) for p in phases}
    total = sum(seconds.values())
    steps = log[-1]["step"]
    rays = sum(r["rays_per_s"] * r["step_time_s"] for r in log)
    samples = sum(r["samples_per_ray"] * r["rays_per_s"] * r["step_time_s"] for r in log)
    test = json.loads((run / "eval.json").read_text())["splits"]["test"]
    return {
        "test_psnr": test["psnr"],
        "test_ssim": test["ssim"],
        "steps": steps,
        "train_seconds": total,
        "rays_per_s": rays / total,
        "steps_per_s": steps / total,
        "samples_per_ray": samples / max(rays, 1),
        "seconds": seconds,
        "fraction": {p: seconds[p] / total for p in phases},
        "final_train_psnr": log[-1]["psnr"],
        "peak_memory_mb": max(r["peak_memory_mb"] for r in log),
        "eval_seconds": test["seconds"],
        "progress": [{"elapsed_s": p["elapsed_s"], "step": p["step"], "psnr": p["psnr"]}
                     for p in _records(run / "progress.jsonl")],
    }  # fmt: skip


def _parse(text: str) -> Any:
    """A ``--set`` value: JSON (numbers, true/false, null) or else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def time_to_reach(progress: list[dict[str, Any]], target: float) -> float | None:
    """First training time at which the quick test PSNR reached ``target`` (None if never)."""
    return next((p["elapsed_s"] for p in progress if p["psnr"] >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget", type=float, default=300.0, help="training seconds per sampler")
    parser.add_argument("--samplers", default="stratified,hierarchical,occupancy,proposal")
    parser.add_argument("--size", default="small", help="built-in scene size")
    parser.add_argument(
        "--work",
        default=str(Path(tempfile.gettempdir()) / "raykit-bench-trainer"),
        help="store and run directories",
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "trainer.json"))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--progress-points", type=int, default=10, help="quick test-PSNR checks per run")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="time every phase of the step (raykit.recorder; synchronises the device at each phase)",
    )
    parser.add_argument("--set", action="append", default=[], help="extra TrainConfig field=value")
    parser.add_argument(
        "--merge", action="store_true", help="keep the other samplers' results already in --out (rerun some)"
    )
    args = parser.parse_args()
    work = Path(args.work)
    start = time.perf_counter()
    store = build_store(work / f"scene-{args.size}", args.size, seed=0)
    store_seconds = time.perf_counter() - start
    extra = {}
    for item in args.set:
        key, value = item.split("=", 1)
        extra[key] = _parse(value)
    command = command_line(
        ["benchmarks/bench_trainer.py"]
        + [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if v not in (None, [], False)]
    )
    results: dict[str, Any] = {}
    if args.merge and Path(args.out).exists():
        results = json.loads(Path(args.out).read_text())["results"]
    for sampler in args.samplers.split(","):
        run = work / f"run-{sampler}"
        shutil.rmtree(run, ignore_errors=True)  # a fresh run each time
        config = TrainConfig(
            store=str(store), out=str(run), sampler=sampler, steps=1_000_000, max_seconds=args.budget,
            progress_every_s=args.budget / args.progress_points, progress_images=4, log_every=25,
            ckpt_every=100_000, threads=args.threads, **extra,
        )  # fmt: skip
        t0, load_before = time.perf_counter(), os.getloadavg()[0]
        with raykit.recorder.recording() if args.phases else contextlib.nullcontext():
            train(config)
        results[sampler] = {**summarize(run), "wall_seconds": time.perf_counter() - t0, "command": command}
        results[sampler]["load_average_1min"] = [load_before, os.getloadavg()[0]]
        print(sampler, json.dumps({k: v for k, v in results[sampler].items() if k != "progress"}, indent=1))
    if "stratified" in results and results["stratified"]["progress"]:
        target = results["stratified"]["progress"][-1]["psnr"]
        for result in results.values():
            result["seconds_to_stratified_final_quick_psnr"] = time_to_reach(result["progress"], target)
    report = {
        "benchmark": "trainer",
        "scene": args.size,
        "budget_seconds": args.budget,
        "store": portable(str(store)),
        "store_fingerprint": open_store(str(store)).fingerprint,
        "store_build_seconds": store_seconds,
        "config_overrides": extra,
        "machine": {**describe(torch.get_num_threads()), "torch": torch.__version__},
        "command": command,
        "results": results,
    }  # fmt: skip
    write_report(args.out, report)


if __name__ == "__main__":
    main()
