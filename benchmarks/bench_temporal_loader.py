"""``RayLoader(sampling="temporal")`` against ``sampling="uniform"`` on the same multi-view video store
(issue 58's target: weighted loading at least 0.8x the uniform images-layout loader's rays/s).

The store is synthetic (``temporal_weights.camera_frames``: per camera a background, a moving
rectangle, a flickering patch, noise), ``--cameras`` x ``--frames`` frames of ``--size``, written in
the images layout (Zarr, lossless) with each frame's camera and frame index; ``raykit add-component
STORE temporal`` adds its ISG and IST weights (level 4). Both loaders are built once and warmed (the
split decoded into their image caches), then timed in interleaved turns of ``--batches`` batches of
4096 rays, the order alternating per round; ``mode`` ``batch`` times the ``RayBatch``es (rays generated
on the CPU, as a trainer gets them), ``raw`` the compact rays the stages hand the batcher (the sampling
stage's own cost). ``ist_step`` is half the batches a loader yields, so both kinds are drawn. Each
turn also records the process's CPU time (all its threads) per 2^17 rays, steadier than the rate on a
shared machine.

    python benchmarks/bench_temporal_loader.py            # 6 cameras x 60 frames of 338x253

Results: ``benchmarks/results/temporal_loader.json``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from machine import command_line, describe, write_report
from temporal_weights import camera_frames

ROOT = Path(__file__).resolve().parent
BATCH = 4096


def _frame(frames: list[np.ndarray], t: int) -> np.ndarray:
    return frames[t]


def write_video(path: Path, cameras: int, frames: int, width: int, height: int) -> float:
    """The synthetic store at ``path`` with its temporal weights; the seconds it took."""
    from raykit.cameras import Camera
    from raykit.converters.weights import add_temporal_weights
    from raykit.store import ImageRecord, SceneInfo, write_store

    start = time.perf_counter()
    camera = Camera("PINHOLE", width, height, (0.8 * width, 0.8 * width, width / 2, height / 2))
    records = []
    for c in range(cameras):
        made = list(camera_frames(c, frames, height, width, [0.0]))
        c2w = np.eye(4)
        c2w[:3, 3] = (np.cos(c), np.sin(c), 3.0)
        for t in range(frames):
            load = functools.partial(_frame, made, t)
            view = (f"cam{c:02d}/{t:04d}", "train", camera, c2w, 0.5, 6.0, "", load)
            records.append(ImageRecord(*view, time=t / max(1, frames - 1), camera_index=c, frame_index=t))
    write_store(path, records, scene=SceneInfo(), layout="images")
    add_temporal_weights(path)
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> dict[str, Any]:
    from raykit.loaders import RayLoader

    width, height = args.size
    with tempfile.TemporaryDirectory(prefix="raykit-bench-temporal-") as folder:
        path = Path(folder) / "video.zarr"
        written = write_video(path, args.cameras, args.frames, width, height)
        total = 2 * args.rounds * args.batches
        samplings: dict[str, Any] = {
            "uniform": "uniform",
            "temporal": {"kind": "temporal", "ist_step": args.warm + total // 2},
        }
        results: dict[str, Any] = {}
        for mode in ("batch", "raw"):
            maker = {} if mode == "batch" else {"make_batch": lambda raw: raw}
            loaders = {k: RayLoader(path, "train", BATCH, 0, device="cpu", sampling=s, **maker)
                       for k, s in samplings.items()}  # fmt: skip
            streams = {k: loader.forever() for k, loader in loaders.items()}
            for stream in streams.values():  # warm: the split decoded into the image cache
                for _ in range(args.warm):
                    next(stream)
            rates: dict[str, list[float]] = {k: [] for k in streams}
            cpu: dict[str, list[float]] = {k: [] for k in streams}  # the process's CPU ms per 2^17 rays
            for r in range(args.rounds):
                for k in sorted(streams, reverse=bool(r % 2)):
                    start, clock = time.perf_counter(), time.process_time()
                    for _ in range(args.batches):
                        next(streams[k])
                    rates[k].append(args.batches * BATCH / (time.perf_counter() - start) / 1e6)
                    cpu[k].append((time.process_time() - clock) * 1e3 * 2**17 / (args.batches * BATCH))
            medians = {k: float(np.median(v)) for k, v in rates.items()}
            results[mode] = {
                "mrays_per_s": rates,
                "median_mrays_per_s": medians,
                "temporal_over_uniform": medians["temporal"] / medians["uniform"],
                "cpu_ms_per_2e17_rays": {k: round(float(np.median(v)), 1) for k, v in cpu.items()},
                "seconds_by_step": {
                    k: {s: round(t, 3) for s, t in loader.seconds.items()} for k, loader in loaders.items()
                },
            }
            for loader in loaders.values():
                loader.close()
            print(mode, {k: round(v, 2) for k, v in medians.items()},
                  f"ratio {results[mode]['temporal_over_uniform']:.2f}",
                  "cpu ms per 2^17 rays", results[mode]["cpu_ms_per_2e17_rays"], flush=True)  # fmt: skip
    return {"store": {"cameras": args.cameras, "frames": args.frames, "size": [width, height],
                      "weights_factor": 4, "write_and_weights_s": round(written, 2)},
            "batch_size": BATCH, "rounds": args.rounds, "batches_per_turn": args.batches,
            "warm_batches": args.warm, "results": results}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cameras", type=int, default=6)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--size", type=int, nargs=2, default=(338, 253), metavar=("W", "H"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=100, help="batches per timed turn")
    parser.add_argument("--warm", type=int, default=100, help="batches each loader yields first")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "temporal_loader.json")
    args = parser.parse_args(argv)
    report = {"command": command_line(), "machine": describe(2), **run(args)}
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
