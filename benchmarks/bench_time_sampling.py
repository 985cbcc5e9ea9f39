"""DyNeRF's importance sampling over time (``--ray-sampling temporal``: ISG, then IST) against
``uniform`` on a multi-view video capture (issue 59): the time to reach uniform's final PSNR.

The capture is the built-in dynamic scene (``raykit.testing.render_dynamic``: a sphere moving along x
among static objects, fixed cameras on a ring, the last camera held out, its odd frames ``test``),
``--cameras`` x ``--times`` views of ``--size`` pixels, written as a Neural 3D Video capture (mp4
through PyAV, ``write_n3dv``), converted to the images layout, and given its ISG/IST weights
(``raykit add-component STORE temporal``, default level). Then ``raykit train`` (the field ``auto``
picks: kplanes) for ``--seconds`` per run, each arm of ``--arms`` for each seed in turn (paired,
interleaved): ``uniform``, ``temporal`` (the trainer's default ``--ist-step``) and ``temporal@N``
(``--ist-step N``: 0 is IST throughout, a step past the run's last is ISG throughout);
``--side-by-side`` runs a seed's arms at the same time instead, each its own process of
``--threads`` threads, so that every arm meets the same load on a shared machine.
Every run logs quick test-PSNR checks every ``--progress-every-s`` training seconds over all the test
views (``progress.jsonl``; the checks' time is not training time).

Per seed, the target is uniform's last check (its PSNR at the end of its budget); for every arm, the
training seconds and the step of its first check at or above it (None: not reached), the seconds as a
ratio of uniform's budget (steps do not depend on the machine's load, seconds do); and each run's
final ``eval.json`` test PSNR. ``--train-flags`` passes more ``raykit train`` flags (a smaller field
for a short budget on a loaded machine).

    python benchmarks/bench_time_sampling.py --seconds 300 --seeds 0 1 2
    python benchmarks/bench_time_sampling.py --arms uniform temporal@50000 temporal@0 --train-flags "..."

(BENCHMARKS.md, issue 59's time-sampling section, has the short run's whole command.)

Results: ``benchmarks/results/time_sampling.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import command_line, describe, write_report

ROOT = Path(__file__).resolve().parent


def video_store(args: argparse.Namespace) -> Path:
    """The built-in dynamic scene as a weighted images-layout store (made once in ``--work``)."""
    from raykit.converters import convert
    from raykit.converters.weights import add_temporal_weights
    from raykit.store import open_store
    from raykit.testing import render_dynamic, write_n3dv

    work = Path(args.work)
    name = f"video-c{args.cameras}-t{args.times}-s{args.size}"
    store = work / f"{name}.zarr"
    if (store / "manifest.json").exists() and "ist" in open_store(store).components:
        return store
    shutil.rmtree(store, ignore_errors=True)
    t0 = time.perf_counter()
    scene = render_dynamic(n_cameras=args.cameras, n_times=args.times, size=args.size, own_intrinsics=-1)
    capture = write_n3dv(scene, work / f"{name}-capture")
    convert(capture, store, layout="images", overwrite=True)
    add_temporal_weights(store)
    print(f"capture made in {time.perf_counter() - t0:.1f} s: {store}", flush=True)
    return store


def train_command(store: Path, out: Path, arm: str, seed: int, args: argparse.Namespace) -> list[str]:
    """The ``raykit train`` command line of one run of ``arm``."""
    mode, _, ist = arm.partition("@")
    return [sys.executable, "-m", "raykit", "train", str(store), "--out", str(out),
            "--max-seconds", str(args.seconds), "--seed", str(seed), "--threads", str(args.threads),
            "--ray-sampling", mode, *(["--ist-step", ist] if ist else []),
            "--progress-every-s", str(args.progress_every_s), "--progress-images", "100000",
            *args.train_flags.split()]  # fmt: skip


def run_record(out: Path, arm: str, seed: int, wall_s: float) -> dict[str, Any]:
    """One finished run's progress checks and final test PSNR."""
    checks = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    evaluated = json.loads((out / "eval.json").read_text())
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    choice = json.loads((out / "run.json").read_text())["ray_sampling"]
    return {
        "arm": arm,
        "seed": seed,
        "steps": log[-1]["step"],
        "final_psnr": round(float(evaluated["splits"]["test"]["psnr"]), 3),
        "checks": [(round(c["elapsed_s"], 2), c["step"], round(c["psnr"], 3)) for c in checks],
        "schedule": choice.get("schedule", arm.partition("@")[0]),
        "wall_s": round(wall_s, 1),
    }


def train_seed(store: Path, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every arm of one seed: one after the other, or all at once (``--side-by-side``: each arm its
    own process of ``--threads`` threads, so the arms share whatever else loads the machine)."""
    outs = {arm: Path(args.work) / f"run-{arm.replace('@', '-')}-s{seed}" for arm in args.arms}
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)
    commands = {arm: train_command(store, outs[arm], arm, seed, args) for arm in args.arms}
    records = []
    if args.side_by_side:
        t0 = time.perf_counter()
        procs = {arm: subprocess.Popen(cmd, stdout=subprocess.DEVNULL) for arm, cmd in commands.items()}
        for arm, proc in procs.items():
            if proc.wait() != 0:
                raise subprocess.CalledProcessError(proc.returncode, commands[arm])
        wall = time.perf_counter() - t0
        records = [run_record(outs[arm], arm, seed, wall) for arm in args.arms]
    else:
        for arm, cmd in commands.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            records.append(run_record(outs[arm], arm, seed, time.perf_counter() - t0))
    return records


def time_to_reach(checks: list[tuple[float, int, float]], target: float) -> tuple[float, int] | None:
    """Training seconds and step of the first check at or above ``target`` (None: never)."""
    return next(((t, step) for t, step, psnr in checks if psnr >= target), None)


def summarise(runs: list[dict[str, Any]], arms: list[str], seeds: list[int]) -> dict[str, Any]:
    by = {(r["arm"], r["seed"]): r for r in runs}
    per_seed = []
    for seed in seeds:
        uniform = by[("uniform", seed)]
        budget, steps, target = uniform["checks"][-1]
        row: dict[str, Any] = {
            "seed": seed,
            "target_psnr": target,
            "uniform_s": budget,
            "uniform_steps": steps,
        }
        for arm in arms:
            run = by[(arm, seed)]
            reached = time_to_reach(run["checks"], target)
            row[arm] = {
                "time_to_target_s": None if reached is None else reached[0],
                "ratio_to_uniform": None if reached is None else round(reached[0] / budget, 3),
                "steps_to_target": None if reached is None else reached[1],
                "steps": run["steps"],
                "last_check_psnr": run["checks"][-1][2],
                "final_psnr": run["final_psnr"],
                "final_minus_uniform_db": round(run["final_psnr"] - uniform["final_psnr"], 3),
            }
        per_seed.append(row)
    return {"per_seed": per_seed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cameras", type=int, default=5, help="cameras of the rig (the last held out)")
    parser.add_argument("--times", type=int, default=24, help="frames per camera")
    parser.add_argument("--size", type=int, default=48, help="image side in pixels")
    parser.add_argument("--seconds", type=float, default=300.0, help="training budget per run")
    parser.add_argument("--progress-every-s", type=float, default=15.0)
    parser.add_argument("--arms", nargs="+", default=["uniform", "temporal"],
                        help="uniform, temporal, temporal@N (--ist-step N)")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--side-by-side", action="store_true", help="run a seed's arms at once, a process of --threads each"
    )
    parser.add_argument("--train-flags", default="", help="more raykit train flags, one string")
    parser.add_argument("--work", default=str(ROOT / "data" / "time_sampling"))
    parser.add_argument("--out", default=str(ROOT / "results" / "time_sampling.json"))
    args = parser.parse_args()
    if "uniform" not in args.arms:
        parser.error("--arms: uniform is the reference")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    store = video_store(args)
    runs = []
    for seed in args.seeds:  # paired, interleaved: every arm of a seed before the next seed
        for record in train_seed(store, seed, args):
            runs.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "checks"}), flush=True)
    report = {
        "command": command_line(),
        "machine": describe(args.threads),
        "capture": {"cameras": args.cameras, "times": args.times, "size": args.size, "store": store.name},
        "seconds": args.seconds,
        "progress_every_s": args.progress_every_s,
        "train_flags": args.train_flags,
        "side_by_side": args.side_by_side,
        "runs": runs,
        **summarise(runs, args.arms, args.seeds),
    }
    write_report(args.out, report)
    print(json.dumps(report["per_seed"], indent=1))


if __name__ == "__main__":
    main()
