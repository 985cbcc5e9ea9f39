"""The loader's ``loss`` sampling stage against ``uniform`` (issue 57): what it costs and what it buys.

* ``throughput``: ``RayLoader`` rays/s at batch 4096 on the built-in scene (``--size``; the issue's
  target scene is ``realistic``, 100 views of 800x800) in both layouts, ``uniform`` and ``loss``
  interleaved (``--rounds`` rounds, each mode a fresh loader, ``--batches`` batches after the first,
  ``num_workers=0``, 2 torch threads); the ``loss`` loop feeds ``observe`` a per-ray loss (the
  colour's distance from grey, a stand-in with a real spatial structure). Target: loss >= 0.85x.
* ``quality``: ``raykit train`` on a capture (``--capture``, converted once at ``--downscale``; or
  ``builtin:SIZE``, the built-in scene) for ``--seconds`` (or ``--steps``: equal work, for a loaded
  machine) per run, ``--ray-sampling uniform`` then ``loss`` for each seed (paired, interleaved),
  test PSNR from each run's ``eval.json``.

    python benchmarks/bench_sampling.py throughput --size small --rounds 3
    python benchmarks/bench_sampling.py quality --capture ../shared/data/plant_capture --downscale 4 \\
        --seconds 75 --seeds 0 1
    python benchmarks/bench_sampling.py quality --capture builtin:small --steps 200 --seeds 0 1

Results: ``benchmarks/results/sampling_<what>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import command_line, describe, write_report

ROOT = Path(__file__).resolve().parent
MODES = ("uniform", "loss")


def scene_stores(size: str, work: Path) -> dict[str, Path]:
    """The built-in scene of ``size`` as a rays- and an images-layout store (made once in ``work``)."""
    from raykit.converters import convert
    from raykit.testing import render_scene, write_blender

    src = work / f"scene-{size}"
    if not (src / "transforms_test.json").exists():
        shutil.rmtree(src, ignore_errors=True)
        write_blender(render_scene(size, seed=0), src)
    out = {}
    for layout in ("rays", "images"):
        dst = out[layout] = work / f"scene-{size}-{layout}"
        if not (dst / "manifest.json").exists():
            convert(src, dst, layout=layout, split="source", overwrite=True)
    return out


def loader_rate(store: Any, mode: str, batches: int) -> dict[str, float]:
    """Steady rays/s of one fresh loader over ``batches`` batches after the first."""
    import torch

    from raykit.loaders import RayLoader

    loader = RayLoader(store, "train", 4096, 0, num_workers=0, sampling=mode)
    seen, cpu = 0, 0.0
    t0 = start = time.perf_counter()
    for i, batch in enumerate(loader.forever()):
        loader.observe(batch, (batch.rgb - 0.5).abs().mean(dim=1).to(torch.float32))
        if i == 0:
            start, cpu = time.perf_counter(), time.process_time()
        else:
            seen += len(batch)
        if i == batches:
            break
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    loader.close()
    rates = {"rays_per_s": seen / elapsed, "first_batch_s": start - t0}
    return {**rates, "cpu_ms_per_batch": 1e3 * cpu / batches}  # all threads' CPU time


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from raykit.store import open_store

    torch.set_num_threads(2)
    stores = {k: open_store(v) for k, v in scene_stores(args.size, Path(args.work)).items()}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {k: {m: [] for m in MODES} for k in stores}
    for _ in range(args.rounds):
        for layout, store in stores.items():
            for mode in MODES:
                runs[layout][mode].append(loader_rate(store, mode, args.batches))
    summary = {}
    for layout, modes in runs.items():
        rates = {m: [r["rays_per_s"] for r in modes[m]] for m in MODES}
        ratios = [b / a for a, b in zip(rates["uniform"], rates["loss"], strict=True)]
        cpu = {m: [r["cpu_ms_per_batch"] for r in modes[m]] for m in MODES}
        summary[layout] = {"uniform_mrays_s": [round(r / 1e6, 3) for r in rates["uniform"]],
                           "loss_mrays_s": [round(r / 1e6, 3) for r in rates["loss"]],
                           "ratio_per_round": [round(r, 3) for r in ratios],
                           "cpu_ms_per_batch": {m: [round(c, 2) for c in cpu[m]] for m in MODES}}  # fmt: skip
    return {
        "size": args.size,
        "batches": args.batches,
        "rounds": args.rounds,
        "runs": runs,
        "summary": summary,
    }


def quality(args: argparse.Namespace) -> dict[str, Any]:
    from raykit.converters import convert

    work = Path(args.work)
    if args.capture.startswith("builtin:"):  # the built-in scene's rays-layout store
        store = scene_stores(args.capture.split(":", 1)[1], work)["rays"]
    else:
        store = work / f"{Path(args.capture).name}-d{args.downscale}"
        if not (store / "manifest.json").exists():
            convert(args.capture, store, downscale=args.downscale, overwrite=True)
    budget = ["--steps", str(args.steps)] if args.steps else ["--max-seconds", str(args.seconds)]
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for seed in args.seeds:
        for mode in MODES:
            out = work / f"run-{store.name}-{mode}-s{seed}"
            shutil.rmtree(out, ignore_errors=True)
            cmd = [sys.executable, "-m", "raykit", "train", str(store), "--out", str(out), *budget,
                   "--seed", str(seed), "--ray-sampling", mode, "--threads", str(args.threads)]  # fmt: skip
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, env=os.environ.copy(), stdout=subprocess.DEVNULL)
            evaluated = json.loads((out / "eval.json").read_text())
            log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
            results[mode].append({"seed": seed, "psnr": _psnr(evaluated), "steps": log[-1]["step"],
                                  "wall_s": round(time.perf_counter() - t0, 1)})  # fmt: skip
    deltas = [b["psnr"] - a["psnr"] for a, b in zip(results["uniform"], results["loss"], strict=True)]
    return {"capture": Path(args.capture).name, "downscale": args.downscale, "seconds": args.seconds,
            "steps": args.steps,
            "threads": args.threads, "results": results, "loss_minus_uniform_db": deltas}  # fmt: skip


def _psnr(evaluated: dict[str, Any]) -> float:
    """The test split's mean PSNR from an ``eval.json``."""
    splits = evaluated.get("splits", evaluated)
    test = splits.get("test", next(iter(splits.values())))
    return float(test["psnr"] if "psnr" in test else test["mean"]["psnr"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("throughput", "quality"))
    parser.add_argument("--size", default="small", help="built-in scene size (throughput)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--capture", default=str(ROOT.parent.parent / "shared" / "data" / "plant_capture"))
    parser.add_argument("--downscale", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=75.0, help="time budget per run (quality)")
    parser.add_argument("--steps", type=int, default=None, help="equal steps per run instead of --seconds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default=str(ROOT / "data" / "sampling"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    report = throughput(args) if args.what == "throughput" else quality(args)
    report = {"command": command_line(), "machine": describe(2), **report}
    out = args.out or ROOT / "results" / f"sampling_{args.what}.json"
    write_report(out, report)
    print(json.dumps({k: v for k, v in report.items() if k not in ("runs", "machine")}, indent=1))


if __name__ == "__main__":
    main()
