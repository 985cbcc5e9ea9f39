"""Export benchmark: the cost of TensorBoard monitoring, of exporting, verifying and rendering from an export.

On the built-in "small" scene (100x100, 60 train / 10 test views), the same occupancy run twice, with
``--logger jsonl`` and ``--logger tensorboard`` (a test view every ``--image-every`` seconds), in
alternating order ``--repeats`` times each, the fastest kept: wall time of ``train()`` and training
time (the loop's own clock). Then ``export_run`` (seconds, bytes per file),
``verify_export`` (seconds, PSNR difference to the run's eval) and ``render_export`` of the test split
from the export (seconds per image).

    python benchmarks/bench_export.py                      # results in benchmarks/results/export.json
    python benchmarks/bench_export.py --steps 100 --out out/e.json   # a quick look
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
from bench_trainer import build_store
from machine import command_line, describe, write_report

from raykit.trainer import TrainConfig, export_run, render_export, train, verify_export

ROOT = Path(__file__).resolve().parent


def _timed_run(store: Path, out: Path, logger: str, args: argparse.Namespace) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    config = TrainConfig(
        store=str(store), out=str(out), steps=args.steps, logger=logger, log_image_every_s=args.image_every,
        device="cpu", threads=args.threads,
    )  # fmt: skip
    start = time.perf_counter()
    train(config)
    wall = time.perf_counter() - start
    last = json.loads((out / "log.jsonl").read_text().splitlines()[-1])
    evaluation = json.loads((out / "eval.json").read_text())["splits"]["test"]
    return {
        "logger": logger,
        "wall_s": wall,
        "training_s": last["elapsed_s"],
        "eval_s": evaluation["seconds"],
        # what the logger adds lies outside the loop's training clock: set-up, records, images, eval
        "outside_training_s": wall - last["elapsed_s"],
        "test_psnr": evaluation["psnr"],
        "losses_equal_to_jsonl_run": None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--image-every", type=float, default=10.0, help="tensorboard: seconds between images")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs per logger (the fastest is kept)")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "raykit-bench-export"))
    parser.add_argument("--out", default=str(ROOT / "results" / "export.json"))
    args = parser.parse_args()
    load_before = list(os.getloadavg())
    work = Path(args.work)
    store = build_store(work / "small.zarr", "small", seed=0)
    runs: dict[str, dict[str, Any]] = {}
    for repeat in range(args.repeats):  # alternate the order; keep each logger's fastest run
        for logger in ("jsonl", "tensorboard") if repeat % 2 == 0 else ("tensorboard", "jsonl"):
            run = _timed_run(store, work / logger, logger, args)
            if logger not in runs or run["wall_s"] < runs[logger]["wall_s"]:
                runs[logger] = run
    losses = {
        k: [json.loads(x)["loss"] for x in (work / k / "log.jsonl").read_text().splitlines()] for k in runs
    }
    runs["tensorboard"]["losses_equal_to_jsonl_run"] = losses["tensorboard"] == losses["jsonl"]
    model = work / "model"
    t0 = time.perf_counter()
    export_run(work / "tensorboard", model, force=True)
    t1 = time.perf_counter()
    verified = verify_export(model, device="cpu")
    t2 = time.perf_counter()
    rendered = render_export(model, store, work / "renders", device="cpu")
    t3 = time.perf_counter()
    result = {
        "command": command_line(),
        "machine": {
            **describe(args.threads),
            "torch": torch.__version__,
            "loadavg_before": load_before,
            "loadavg_after": list(os.getloadavg()),
        },
        "runs": runs,
        "tensorboard_overhead_wall_s": runs["tensorboard"]["wall_s"] - runs["jsonl"]["wall_s"],
        "tensorboard_overhead_outside_training_s": runs["tensorboard"]["outside_training_s"]
        - runs["jsonl"]["outside_training_s"],
        "tensorboard_events_bytes": sum(
            p.stat().st_size for p in (work / "tensorboard" / "tensorboard").iterdir()
        ),
        "export": {
            "seconds": t1 - t0,
            "files_bytes": {p.name: p.stat().st_size for p in sorted(model.iterdir())},
        },
        "verify": {"seconds": t2 - t1, **verified},
        "render": {
            "seconds": t3 - t2,
            "n_images": rendered["n_images"],
            "seconds_per_image": (t3 - t2) / max(rendered["n_images"], 1),
            "psnr": rendered["psnr"],
        },
    }
    write_report(args.out, result)


if __name__ == "__main__":
    main()
