"""Default flags against alternatives at equal steps: test PSNR per configuration (issue 47, part 1).

Wall-clock runs on a shared machine are noise (a 5-minute run made 1,200 to 5,800 steps for the same
code); this benchmark trains each configuration for the same number of steps instead (``--steps``:
about what a quiet 5-minute run reaches, or a stated fraction of it), one torch thread each, two
configurations at a time (``--jobs``) so that each pair meets the same load, and reports each run's
test PSNR (the protocol's, over the whole test split), its training seconds and seconds per step (only
comparable within a pair). A configuration is a name and ``raykit train`` flags:

    python benchmarks/bench_defaults.py --store STORE --steps 3000 \\
        --config default= --config res512=--max-resolution=512

Each run is ``raykit train STORE --out WORK/NAME --steps N --threads 1 --ckpt-every 100000 FLAGS``
(with ``OMP_WAIT_POLICY=PASSIVE``); ``--collect`` only reads finished run folders. Results go to
``benchmarks/results/defaults.json`` (``--out``), merged by run name.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from machine import command_line, describe, portable, write_report

ROOT = Path(__file__).resolve().parent


def train(store: str, out: Path, steps: int, flags: list[str]) -> float:
    """One run (a fresh interpreter): its wall seconds."""
    argv = [sys.executable, "-m", "raykit", "train", store, "--out", str(out), "--steps", str(steps),
            "--threads", "1", "--ckpt-every", "100000", *flags]  # fmt: skip
    start = time.perf_counter()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def figures(run: Path) -> dict[str, Any]:
    """Test figures and training time of a finished run folder."""
    test = json.loads((run / "eval.json").read_text())["splits"]["test"]
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    last = [r for r in records if "step" in r][-1]
    config = json.loads((run / "config.json").read_text())
    return {
        "psnr": test["psnr"],
        "ssim": test["ssim"],
        "psnr_float": test["psnr_float"],
        "steps": last["step"],
        "train_seconds": last["elapsed_s"],
        "seconds_per_step": last["elapsed_s"] / max(last["step"], 1),
        "sampler": config["sampler"],
        "scene_space": config["scene_space"],
        "max_resolution": config["max_resolution"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", required=True)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--config", action="append", default=[], help="NAME=FLAG,FLAG... (repeatable)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "raykit-bench-defaults"))
    parser.add_argument("--collect", action="store_true", help="only read finished run folders")
    parser.add_argument("--out", default=str(ROOT / "results" / "defaults.json"))
    args = parser.parse_args()
    work = Path(args.work)
    configs = {}
    for item in args.config:
        name, _, flags = item.partition("=")
        configs[name] = [f for part in flags.split(",") if part for f in part.split("=", 1)]
    walls: dict[str, float] = {}
    if not args.collect:
        with ThreadPoolExecutor(args.jobs) as pool:
            jobs = {name: pool.submit(train, args.store, work / name, args.steps, flags)
                    for name, flags in configs.items()}  # fmt: skip
            walls = {name: job.result() for name, job in jobs.items()}
    path = Path(args.out)
    report = json.loads(path.read_text()) if path.exists() else {"benchmark": "defaults", "runs": {}}
    for name, flags in configs.items():
        report["runs"][name] = {
            "store": portable(args.store),
            "flags": flags,
            "steps_asked": args.steps,
            **figures(work / name),
            **({"wall_seconds": walls[name]} if name in walls else {}),
        }
        print(name, json.dumps(report["runs"][name]), flush=True)
    report.update(machine=describe(), command=command_line())
    write_report(str(path), report)


if __name__ == "__main__":
    main()
