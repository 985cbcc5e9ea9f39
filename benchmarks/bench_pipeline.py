"""``raykit run`` on a capture: the pipeline's own overhead, and a rerun with nothing changed.

Runs ``raykit run SRC OUT --minutes M`` (a child process, as a user would), then the same command
again. From ``OUT/pipeline.json``: each stage's wall time, the pipeline's overhead (the whole wall
time less conversion and training: poses, validation, the loader profile, evaluation, export with
verification, rendering, the report and the pipeline's own bookkeeping), and the rerun's wall time.

Targets (issue 31): overhead at most 15% of the wall time with ``--minutes 5`` on
``../shared/data/plant_capture``; a rerun with nothing changed at most 5 s.

    python benchmarks/bench_pipeline.py --src ../shared/data/plant_capture --minutes 1
    python benchmarks/bench_pipeline.py --src ../shared/data/plant_capture --minutes 1 -- --downscale 2

Results go to ``benchmarks/results/pipeline.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import command_line, describe, write_report

RESULTS = Path(__file__).resolve().parent / "results" / "pipeline.json"


def _run(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return seconds


def measure(src: str, minutes: float, extra: list[str], out: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "raykit", "run", src, str(out), f"--minutes={minutes}", "--no-progress"]
    argv += extra
    wall = _run(argv)
    stages = json.loads((out / "pipeline.json").read_text())["stages"]
    times = {name: record["wall_s"] for name, record in stages.items()}
    core = sum(t for name, t in times.items() if name == "convert" or name.startswith("train-"))
    rerun = _run(argv)
    return {
        "wall_s": wall,
        "stages_s": times,
        "convert_and_train_s": core,
        "overhead_s": wall - core,
        "overhead_share": (wall - core) / wall,
        "rerun_nothing_changed_s": rerun,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True, help="capture (or store) given to raykit run")
    parser.add_argument("--minutes", type=float, default=5.0, help="training budget")
    parser.add_argument("--out", default=str(RESULTS), help="JSON report")
    parser.add_argument("extra", nargs="*", help="further raykit run flags (after --)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        result = measure(args.src, args.minutes, args.extra, work / "out")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import torch

    machine = describe(torch.get_num_threads())
    report = {"command": command_line(), "machine": machine, "minutes": args.minutes, **result}
    write_report(args.out, report)
    print(json.dumps({k: v for k, v in report.items() if k not in ("machine",)}, indent=2))


if __name__ == "__main__":
    main()
