"""Static against time-conditioned field on the built-in dynamic scene, at equal time (issue 59).

The built-in dynamic scene (``raykit.testing.render_dynamic``: one sphere moving along x) is rendered
from ``--cameras`` cameras at ``--times`` times, ``--size`` pixels square, written as a D-NeRF
capture and converted; the last camera is held out (its odd frames are the test split). Each seed
trains ``--field static`` and ``--field kplanes`` for ``--seconds`` of training each, one after the
other (the order alternating per seed, so both meet the same load), every other flag at its default,
and records the test PSNR (the protocol's, every test view), the steps and the seconds a step:

    python benchmarks/bench_dynamic_field.py --seconds 60 --seeds 0,1

Results go to ``benchmarks/results/dynamic_field.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent


def _one(
    store: Path, out: Path, field: str, seconds: float, seed: int, threads: int | None
) -> dict[str, Any]:
    from raykit.trainer import TrainConfig, train

    run = train(
        TrainConfig(
            store=str(store), out=str(out), field=field, max_seconds=seconds, seed=seed, threads=threads
        )
    )
    test = json.loads((run / "eval.json").read_text())["splits"]["test"]
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    steps, elapsed = log[-1]["step"], log[-1]["elapsed_s"]
    return {
        "field": field,
        "seed": seed,
        "psnr": test["psnr"],
        "steps": steps,
        "ms_per_step": 1e3 * elapsed / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cameras", type=int, default=6)
    parser.add_argument("--times", type=int, default=12)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=str(ROOT / "results" / "dynamic_field.json"))
    args = parser.parse_args()

    from raykit.converters import convert
    from raykit.testing import render_dynamic, write_dnerf

    work = Path(tempfile.mkdtemp(prefix="dynamic_field_"))
    capture = write_dnerf(
        render_dynamic(n_cameras=args.cameras, n_times=args.times, size=args.size), work / "cap"
    )
    store = work / "store.zarr"
    convert(capture, store)
    runs = []
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        order = ("static", "kplanes") if i % 2 == 0 else ("kplanes", "static")
        for field in order:
            record = _one(store, work / f"{field}-{seed}", field, args.seconds, seed, args.threads)
            print(json.dumps(record), flush=True)
            runs.append(record)
    means = {
        field: statistics.mean(r["psnr"] for r in runs if r["field"] == field)
        for field in ("static", "kplanes")
    }
    report = {
        "benchmark": "dynamic_field",
        "scene": {"cameras": args.cameras, "times": args.times, "size": args.size},
        "seconds": args.seconds,
        "runs": runs,
        "mean_psnr": means,
        "kplanes_minus_static_db": means["kplanes"] - means["static"],
    }
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"mean_psnr": means, "kplanes_minus_static_db": report["kplanes_minus_static_db"]}))


if __name__ == "__main__":
    main()
