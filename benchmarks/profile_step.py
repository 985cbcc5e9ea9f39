"""Where a training step's CPU time goes: ``torch.profiler`` over a window of steps of a default run.

A profile, not a benchmark (the profiler adds its own time to every operator): ``raykit train STORE``
with default flags and ``--threads``, profiled over ``--steps`` steps after ``--skip`` steps, the
operators ranked by their own CPU time per step:

    python benchmarks/profile_step.py --store STORE --threads 2 --skip 400 --steps 40

Results go to ``benchmarks/results/profile_step.json`` (``--out``); the table is printed too.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

import raykit.trainer.loop
from raykit.trainer import TrainConfig, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip", type=int, default=400, help="steps before the profiled window")
    parser.add_argument("--steps", type=int, default=40, help="steps profiled")
    parser.add_argument("--top", type=int, default=12, help="operators kept in the result")
    parser.add_argument("--out", default="benchmarks/results/profile_step.json")
    args = parser.parse_args()
    profiler = profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=args.skip, warmup=5, active=args.steps, repeat=1),
    )
    forward = raykit.trainer.loop.step_losses

    def stepped(*a: Any, **k: Any) -> Any:  # a profiler step begins with each training step
        profiler.step()
        return forward(*a, **k)

    raykit.trainer.loop.step_losses = stepped
    with tempfile.TemporaryDirectory() as work:
        config = TrainConfig(
            store=args.store,
            out=str(Path(work) / "run"),
            steps=args.skip + args.steps + 20,
            threads=args.threads,
            ckpt_every=100_000,
            eval_max_images=1,
        )
        profiler.start()
        train(config)
        profiler.stop()
    events = profiler.key_averages()
    step = next(e for e in events if e.key.startswith("ProfilerStep"))
    ms_per_step = step.cpu_time_total / 1e3 / args.steps
    ops = sorted((e for e in events if e.key.startswith("aten::")), key=lambda e: -e.self_cpu_time_total)
    rows = [
        {
            "op": e.key,
            "self_ms_per_step": e.self_cpu_time_total / 1e3 / args.steps,
            "total_ms_per_step": e.cpu_time_total / 1e3 / args.steps,
            "calls_per_step": e.count / args.steps,
        }
        for e in ops[: args.top]
    ]
    print(f"{ms_per_step:.1f} ms a step under the profiler ({torch.get_num_threads()} threads)")
    for row in rows:
        own, total, calls = row["self_ms_per_step"], row["total_ms_per_step"], row["calls_per_step"]
        print(f"{row['op']:32s} self {own:6.2f} ms  total {total:6.2f} ms  {calls:5.1f} calls")
    result = {
        "benchmark": "profile_step",
        "threads": args.threads,
        "skip": args.skip,
        "steps": args.steps,
        "ms_per_step": ms_per_step,
        "ops": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
