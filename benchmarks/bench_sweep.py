"""``raykit sweep``: the small sweep, its overhead, a SIGKILL and a rerun, and Dask against local.

The sweep: 3 captures (the built-in ``tiny`` and ``small`` scenes, rendered once into the work folder,
and ``../shared/data/plant_capture``) x 2 configurations (samplers occupancy and proposal) x 2 seeds,
each run a fixed number of steps (deterministic, so that sweeps can be compared run for run).

1. A clean sweep (``raykit sweep SPEC OUT --jobs J``, a child process, as a user would). Per run: wall
   time, training and evaluation time, and the overhead (the rest: process start, set-up,
   checkpoints, records); the overhead as a share of the run, and of a 60-second run.
2. The same sweep into a new OUT, SIGKILLed at a random moment (seeded), then rerun: the runs that had
   finished before the kill are not run again (their ``row.json`` and their training record are
   unchanged, and the rerun's record in ``sweep.json`` lists them as skipped), and every row equals the
   clean sweep's, timings aside (``raykit.sweep.comparable``).
3. The same sweep on a Dask ``LocalCluster`` with 2 workers: ``results.parquet`` equals the local one,
   timings aside.

Targets (issue 42): completes; after the kill the rerun repeats no finished run and every metric
equals the clean sweep's; overhead at most 5 % of a 60-second run; Dask = local.

    python benchmarks/bench_sweep.py --steps 60 --jobs 2

Results go to ``benchmarks/results/sweep.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import command_line, describe, write_report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "sweep.json"
PLANT = ROOT.parent / "shared" / "data" / "plant_capture"


def spec_text(scenes: Path, plant: Path, steps: int) -> str:
    return f"""seeds = [0, 1]

[evaluation]
max_images = 2

[train]
steps = {steps}
ckpt_every = {max(steps // 3, 1)}
log_every = {max(steps // 10, 1)}
device = "cpu"
threads = 1

[grid]
sampler = ["occupancy", "proposal"]

[[captures]]
name = "tiny"
path = "{scenes / "tiny"}"

[[captures]]
name = "small"
path = "{scenes / "small"}"

[[captures]]
name = "plant"
path = "{plant}"
downscale = 2
"""


def _sweep(spec: Path, out: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "raykit", "sweep", str(spec), str(out), *flags]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run_sweep(spec: Path, out: Path, *flags: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(_sweep(spec, out, *flags), capture_output=True, text=True, env=_env())
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"raykit sweep failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return seconds


def rows(out: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    result: list[dict[str, Any]] = pq.read_table(out / "results.parquet").to_pylist()
    return result


def _comparable(out: Path) -> list[dict[str, Any]]:
    from raykit.sweep import comparable

    return [{k: v for k, v in comparable(r).items() if k != "export_path"} for r in rows(out)]


def overhead(out: Path, wall: float) -> dict[str, Any]:
    per_run = [
        {
            k: r[k]
            for k in ("capture", "config", "seed", "wall_s", "train_s", "eval_s", "overhead_s", "test_psnr")
        }
        for r in rows(out)
    ]
    over = [r["overhead_s"] for r in per_run]
    share = [r["overhead_s"] / r["wall_s"] for r in per_run]
    at60 = [r["overhead_s"] / (60.0 + r["eval_s"] + r["overhead_s"]) for r in per_run]
    return {
        "sweep_wall_s": wall,
        "runs": per_run,
        "overhead_s_median": statistics.median(over),
        "overhead_s_max": max(over),
        "overhead_share_median": statistics.median(share),
        "overhead_share_of_60s_run_median": statistics.median(at60),
        "overhead_share_of_60s_run_max": max(at60),
        "all_done": all(r["status"] == "done" for r in rows(out)),
    }


def killed_and_rerun(
    spec: Path, out: Path, clean_out: Path, clean_wall: float, seed: int, jobs: int
) -> dict[str, Any]:
    delay = random.Random(seed).uniform(0.15, 0.85) * clean_wall
    proc = subprocess.Popen(_sweep(spec, out, f"--jobs={jobs}"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=_env())  # fmt: skip
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)  # the trainers die with their parent (PR_SET_PDEATHSIG)
    finished = {p.parent.name: p.read_bytes() for p in (out / "runs").glob("*/row.json")}
    attempts = {
        name: len(
            json.loads((out / "runs" / name / "pipeline.json").read_text())["stages"]["train"]["attempts"]
        )
        for name in finished
    }
    rerun_wall = run_sweep(spec, out, f"--jobs={jobs}")
    after = {p.parent.name: p.read_bytes() for p in (out / "runs").glob("*/row.json")}
    last = json.loads((out / "sweep.json").read_text())["invocations"][-1]
    resumed = {
        p.parent.name: len(json.loads(p.read_text())["stages"]["train"]["attempts"])
        for p in (out / "runs").glob("*/pipeline.json")
        if p.parent.name not in finished
    }
    return {
        "kill_after_s": delay,
        "finished_before_kill": len(finished),
        "finished_rows_unchanged": all(after[name] == data for name, data in finished.items()),
        "finished_train_attempts_unchanged": all(
            len(json.loads((out / "runs" / n / "pipeline.json").read_text())["stages"]["train"]["attempts"])
            == a
            for n, a in attempts.items()
        ),
        "rerun_skipped": len(last["skipped"]),
        "rerun_ran": len(last["ran"]),
        "rerun_wall_s": rerun_wall,
        "train_attempts_of_rerun_runs": resumed,
        "rows_equal_clean": _comparable(out) == _comparable(clean_out),
    }


def dask_sweep(spec: Path, out: Path, clean_out: Path) -> dict[str, Any]:
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        wall = run_sweep(spec, out, f"--scheduler={cluster.scheduler_address}")
    executors = sorted({r["executor"].split(":")[0] for r in rows(out)})
    return {
        "wall_s": wall,
        "executors": executors,
        "results_equal_local": _comparable(out) == _comparable(clean_out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps of each run")
    parser.add_argument("--jobs", type=int, default=2, help="local concurrent runs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill's moment")
    parser.add_argument("--plant", default=str(PLANT), help="the real capture")
    parser.add_argument("--skip-dask", action="store_true")
    parser.add_argument("--out", default=str(RESULTS), help="JSON report")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from raykit.testing import render_scene, write_blender

    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        for size in ("tiny", "small"):
            write_blender(render_scene(size, seed=0), work / "scenes" / size)
        spec = work / "spec.toml"
        spec.write_text(spec_text(work / "scenes", Path(args.plant).resolve(), args.steps))
        clean = work / "clean"
        wall = run_sweep(spec, clean, f"--jobs={args.jobs}")
        result: dict[str, Any] = {"steps": args.steps, "jobs": args.jobs, "spec": spec.read_text()}
        result["clean"] = overhead(clean, wall)
        print(json.dumps({k: v for k, v in result["clean"].items() if k != "runs"}, indent=2), flush=True)
        for path in (clean / "runs").glob("*/train/checkpoints"):
            shutil.rmtree(path)
        result["kill"] = killed_and_rerun(spec, work / "killed", clean, wall, args.seed, args.jobs)
        print(json.dumps(result["kill"], indent=2), flush=True)
        shutil.rmtree(work / "killed")
        if not args.skip_dask:
            result["dask"] = dask_sweep(spec, work / "dask", clean)
            print(json.dumps(result["dask"], indent=2), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"command": command_line(), "machine": describe(1), **result}
    write_report(args.out, report)


if __name__ == "__main__":
    main()
