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

``--trees A,B --seconds S`` is the other comparison: default flags at equal time between two checkouts
(e.g. a round's start and its end), ``raykit train STORE --out WORK/ab-I-TREE --max-seconds S
--ckpt-every 100000`` with each checkout on ``PYTHONPATH`` and torch's own threads, one run at a time,
``--pairs`` pairs in alternating order (A B, B A, ...), so that both checkouts meet the same load:

    python benchmarks/bench_defaults.py --store STORE --trees ../base,. --seconds 75 --pairs 3 \\
        --out benchmarks/results/defaults_ab.json

With ``--seconds 0`` the pairs train ``--steps`` steps instead, one torch thread each
(``OMP_WAIT_POLICY=PASSIVE``), the two runs of a pair at the same time (equal steps; on a shared
machine the pair still meets the same load). ``--together`` runs the two runs of an equal-time pair
at the same time too, one torch thread each (on a machine shared with other work: each run has a
core, and both meet the same load).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def train_for(
    tree: str, store: str, out: Path, seconds: float, steps: int, one_thread: bool = False
) -> float:
    """One default-flags run of ``seconds`` (or, for 0, of ``steps`` steps on one thread; with
    ``one_thread`` on one thread either way) with the checkout ``tree`` (a fresh interpreter): its wall
    seconds (training, then the final evaluation)."""
    one_thread = one_thread or not seconds
    budget = ["--max-seconds", str(seconds)] if seconds else ["--steps", str(steps)]
    budget += ["--threads", "1"] if one_thread else []
    # -P: the working directory does not go first on sys.path, so that PYTHONPATH picks the checkout
    argv = [sys.executable, "-P", "-m", "raykit", "train", store, "--out", str(out), *budget,
            "--ckpt-every", "100000"]  # fmt: skip
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": tree, **({"OMP_WAIT_POLICY": "PASSIVE"} if one_thread else {})}
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def trees_ab(
    store: str,
    trees: list[str],
    seconds: float,
    steps: int,
    pairs: int,
    work: Path,
    out: str,
    together: bool = False,
) -> None:
    """Default flags at equal time (``seconds``; or at equal steps for 0), ``pairs`` pairs of runs
    alternating between the checkouts ``trees`` (at equal steps, or ``together``, the runs of a pair at
    once, one thread each)."""
    runs: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    for pair in range(pairs):
        order = trees if pair % 2 == 0 else trees[::-1]
        folders = {tree: work / f"ab-{pair}-{Path(tree).resolve().name}" for tree in order}
        for run in folders.values():
            shutil.rmtree(run, ignore_errors=True)
        load = os.getloadavg()[0]
        walls = {}
        if seconds and not together:
            for tree in order:
                walls[tree] = train_for(tree, store, folders[tree], seconds, steps)
        else:
            with ThreadPoolExecutor(len(order)) as pool:
                jobs = {
                    tree: pool.submit(train_for, tree, store, folders[tree], seconds, steps, True)
                    for tree in order
                }
                walls = {tree: job.result() for tree, job in jobs.items()}
        for tree in order:
            test = json.loads((folders[tree] / "eval.json").read_text())["splits"]["test"]
            record = {"pair": pair, **figures(folders[tree]), "eval_seconds": test["seconds"],
                      "wall_seconds": walls[tree], "load_before": load,
                      "load_after": os.getloadavg()[0]}  # fmt: skip
            runs[tree].append(record)
            print(portable(tree), json.dumps(record), flush=True)
    summary = {}
    for tree, records in runs.items():
        summary[portable(tree)] = {
            key: sum(r[key] for r in records) / len(records)
            for key in ("psnr", "ssim", "steps", "train_seconds", "seconds_per_step", "eval_seconds")
        } | {"runs": records}
    first, last = runs[trees[0]], runs[trees[-1]]
    report = {
        "benchmark": "defaults_equal_time_ab" if seconds else "defaults_equal_steps_ab",
        "store": portable(store),
        "seconds": seconds,
        "steps": None if seconds else steps,
        "together": together or not seconds,
        "machine": describe(),
        "command": command_line(),
        "psnr_difference_per_pair": [b["psnr"] - a["psnr"] for a, b in zip(first, last, strict=True)],
        "steps_ratio_per_pair": [b["steps"] / a["steps"] for a, b in zip(first, last, strict=True)],
        "seconds_per_step_ratio_per_pair": [
            b["seconds_per_step"] / a["seconds_per_step"] for a, b in zip(first, last, strict=True)
        ],
        "results": summary,
    }
    write_report(out, report)


def figures(run: Path) -> dict[str, Any]:
    """Test figures and training time of a finished run folder."""
    test = json.loads((run / "eval.json").read_text())["splits"]["test"]
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    last = [r for r in records if "step" in r][-1]
    config = json.loads((run / "config.json").read_text())
    return {
        "psnr": test["psnr"],
        "ssim": test["ssim"],
        "psnr_float": test.get("psnr_float"),  # None in an eval.json from before the protocol
        "steps": last["step"],
        "train_seconds": last["elapsed_s"],
        "seconds_per_step": last["elapsed_s"] / max(last["step"], 1),
        "sampler": config.get("sampler"),
        "scene_space": config.get("scene_space"),
        "max_resolution": config.get("max_resolution"),
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
    parser.add_argument("--trees", default=None, help="A,B: default flags at equal time between checkouts")
    parser.add_argument(
        "--seconds", type=float, default=75.0, help="--trees: training seconds per run (0: --steps, 1 thread)"
    )
    parser.add_argument("--pairs", type=int, default=3, help="--trees: pairs of runs")
    parser.add_argument(
        "--together", action="store_true", help="--trees: the runs of a pair at once, one thread each"
    )
    args = parser.parse_args()
    work = Path(args.work)
    if args.trees:
        trees = args.trees.split(",")
        trees_ab(args.store, trees, args.seconds, args.steps, args.pairs, work, args.out, args.together)
        return
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
