"""Interleaved A/B of conversion speed between two checkouts (e.g. main and a branch), same captures.

For each round and each checkout, a fresh process with ``PYTHONPATH`` on that checkout measures the
single-core decode of each capture (Pillow ``np.asarray`` of every image, best of 2) and converts it with
1 worker of 1 and of 2 threads (best of 2 each): wall seconds, CPU seconds of the process, 1-minute load.

    python benchmarks/ab_convert.py ../main . --out benchmarks/results/convert_ab_conv.json

Captures (under ``benchmarks/data``, made by ``bench_convert.py`` and ``bench_layouts.py``): the photo-like
Blender capture to the rays layout and the JPEG capture to the images layout.
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
from pathlib import Path
from typing import Any

from machine import command_line, describe

DATA = Path(__file__).resolve().parent / "data"
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("photo-rays", "convert-realistic-0-photo2", {}),
    (
        "jpeg-images",
        "images-realistic-jpeg",
        {"layout": "images", "split": "every:8", "near": 0.5, "far": 8.0},
    ),
]


def child(size: str) -> dict[str, Any]:
    """The measurements of the checkout this process imports (captures of scene ``size``)."""
    import numpy as np
    import torch
    from PIL import Image

    import raykit
    from raykit.converters import convert

    torch.set_num_threads(1)
    out: dict[str, Any] = {"raykit": Path(raykit.__file__).parent.parent.name}  # the checkout's folder name
    work = Path(tempfile.mkdtemp(prefix="ab-convert-"))
    try:
        for name, capture, options in CASES:
            capture = capture.replace("realistic", size)
            files = sorted(p for p in (DATA / capture).rglob("*") if p.suffix in (".png", ".jpg"))
            decode = float("inf")
            for _ in range(2):
                start = time.perf_counter()
                for path in files:
                    with Image.open(path) as img:
                        np.asarray(img)
                decode = min(decode, time.perf_counter() - start)
            out[name] = {"decode_s": decode}
            for threads in (1, 2):
                runs = []
                for _ in range(2):
                    shutil.rmtree(work / "s", ignore_errors=True)
                    start, cpu = time.perf_counter(), time.process_time()
                    convert(DATA / capture, work / "s", threads=threads, **options)
                    runs.append((time.perf_counter() - start, time.process_time() - cpu, os.getloadavg()[0]))
                seconds, cpu_s, load = min(runs)
                out[name][f"1x{threads}"] = {"seconds": seconds, "cpu_seconds": cpu_s, "loadavg_1m": load,
                                             "per_worker_vs_decode": decode / seconds}  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="*", help="repository roots, measured in this order each round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--size", default="realistic", help="the captures' scene size (their names' part)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.size)))
        return
    runs = []
    for round_ in range(args.rounds):
        for root in args.checkouts:
            env = {**os.environ, "PYTHONPATH": str(Path(root).resolve())}
            command = [sys.executable, __file__, "--child", "--size", args.size]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            measured = json.loads(done.stdout.splitlines()[-1])
            runs.append({"round": round_, "checkout": Path(root).resolve().name, **measured})
            print(json.dumps(runs[-1]), flush=True)
    if args.out:
        report = {"command": command_line(), "machine": describe(), "runs": runs}
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
