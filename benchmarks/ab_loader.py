"""Interleaved A/B of the ray loader's steady state between two checkouts (e.g. a base commit and main).

Each round runs, for each checkout in turn, a fresh process with ``PYTHONPATH`` on that checkout:
``benchmarks/bench_loader.py --case STORE CACHE_BYTES BATCHES`` of that checkout (open the store, first
batch, a full epoch 0 that fills the cache, then ``BATCHES`` steady batches). Both sides read the same
store, so the store's format must be one both checkouts read, unless ``--store-a`` gives A its own
(e.g. the same capture converted by A's code, in its format). Each run records its 1-minute load and
the machine's busy CPU ticks meanwhile (``/proc/stat``: user + nice + system + steal, the run's own
included; about 2 cores' worth means nothing else ran), so noisy runs can be told apart.

    python benchmarks/ab_loader.py ../base . --rounds 3 --out benchmarks/results/loader_ab.json

The store defaults to ``benchmarks/data/loader-realistic-0/store.zarr`` (made by ``bench_loader.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from machine import command_line, describe

ROOT = Path(__file__).resolve().parent


def _busy_ticks() -> int:
    with open("/proc/stat") as handle:
        fields = handle.readline().split()
    return int(fields[1]) + int(fields[2]) + int(fields[3]) + int(fields[8])


def run_case(checkout: Path, store: Path, cache_bytes: int, batches: int) -> dict[str, Any]:
    """One ``bench_loader.py --case`` run of ``checkout`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    script = checkout / "benchmarks" / "bench_loader.py"
    cmd = [sys.executable, str(script), "--case", str(store), str(cache_bytes), str(batches)]
    ticks = _busy_ticks()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, cwd=checkout)
    ticks = _busy_ticks() - ticks
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "steady_rays_per_s": result["steady_rays_per_s"],
        "epoch0_rays_per_s": result["epoch0_rays_per_s"],
        "time_to_first_batch_s": result["time_to_first_batch_s"],
        "peak_rss_mb": result["peak_rss_bytes"] / 2**20,
        "busy_ticks": ticks,
        "loadavg_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="checkout A (e.g. the base commit)")
    parser.add_argument("b", type=Path, help="checkout B")
    parser.add_argument("--store", type=Path, default=ROOT / "data" / "loader-realistic-0" / "store.zarr")
    parser.add_argument(
        "--store-a", type=Path, default=None, help="A's own store (e.g. an older format); default --store"
    )
    parser.add_argument("--cache-bytes", type=int, default=1_024_000_000)
    parser.add_argument("--batches", type=int, default=15000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "loader_ab.json")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for _ in range(args.rounds):
        for side, checkout in (("a", args.a), ("b", args.b)):
            store = args.store_a if side == "a" and args.store_a is not None else args.store
            run = run_case(checkout.resolve(), store.resolve(), args.cache_bytes, args.batches)
            runs[side].append(run)
            print(side, json.dumps(run), flush=True)
    medians = {
        side: sorted(r["steady_rays_per_s"] for r in side_runs)[len(side_runs) // 2]
        for side, side_runs in runs.items()
    }
    report = {
        "benchmark": "loader-ab",
        "command": command_line(),
        "batches": args.batches,
        "cache_bytes": args.cache_bytes,
        "runs": runs,
        "median_steady_rays_per_s": medians,
        "b_over_a": medians["b"] / medians["a"],
        "machine": describe(2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"median_steady_rays_per_s": medians, "b_over_a": report["b_over_a"]}))


if __name__ == "__main__":
    main()
