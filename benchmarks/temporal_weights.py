"""DyNeRF's ISG and IST weights of a Neural-3D-Video-sized capture, camera by camera (issue 58): peak RSS,
wall time and the bytes of the float16 weights, against K-Planes' all-frames-at-once approach.

The capture is synthetic and procedural: ``--cameras`` cameras x ``--frames`` frames of ``--size``
(default 20 x 300 at 1352x1014, N3DV's training size), each frame made when it is read (a per-camera
background, a moving and colour-changing rectangle, a flickering patch, mild noise) and never stored.
``raykit.temporal_weights.temporal_weights`` computes each camera's weights at level ``--factor``
(default 2: 676x507 weights a frame, the resolution of K-Planes' 1.95e9 weights: 19 cameras x 300
frames x 676 x 507); the weights are then dropped (a converter hands them to the store's writer),
keeping each frame's row masses, what the sampler holds (``raykit.loaders.temporal``). ``--cameras``
fewer than 20 measures those and extrapolates the time per camera (the memory does not grow with
cameras). Then ``--draws`` batches of 4096 rays are drawn by ``TemporalSampler`` over every frame's
row masses (ISG, then IST), the drawn rows' weights gathered from the last camera's weights, kept in
memory (a stand-in for a store's rows: the draw's own cost, no reads); and 2048 batches' rays at once
by ``draw_by_frame`` (sorted by frame, each frame's weights read once), per 4096 rays.

    python benchmarks/temporal_weights.py                       # 20 cameras
    python benchmarks/temporal_weights.py --cameras 3           # extrapolated to 20

Results: ``benchmarks/results/temporal_weights.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from machine import command_line, describe, peak_rss, rss, write_report

ROOT = Path(__file__).resolve().parent
N3DV_CAMERAS = 20
KPLANES_WEIGHTS = 1.95e9  # K-Planes issue 29: ISG weights of one N3DV scene, float32, all in RAM
KPLANES_OOM_BYTES = 123e9  # the RAM K-Planes was killed at
BY_FRAME = 2048  # batches of 4096 rays drawn at once by draw_by_frame


def camera_frames(camera: int, frames: int, height: int, width: int, clock: list[float]
                  ) -> Iterator[np.ndarray]:  # fmt: skip
    """The frames of one synthetic camera, made one at a time (``clock[0]``: seconds spent making them)."""
    start = time.perf_counter()
    rng = np.random.default_rng(camera)
    yy, xx = np.mgrid[0:height, 0:width]
    background = np.stack([(xx * 255 // width), (yy * 255 // height), np.full_like(xx, 40 + 7 * camera)], -1)
    background = (background + rng.integers(0, 24, (height, width, 3))).clip(0, 255).astype(np.uint8)
    noise = rng.integers(0, 3, (8, height, width, 1), dtype=np.uint8)  # eight noise planes, cycled
    rect_h, rect_w = height // 5, width // 6
    clock[0] += time.perf_counter() - start
    for t in range(frames):
        start = time.perf_counter()
        frame = background + noise[t % 8]  # a new array: the frame handed out
        y = int((height - rect_h) * (0.5 + 0.5 * np.sin(2 * np.pi * t / frames + camera)))
        x = int((width - rect_w) * t / max(1, frames - 1))
        frame[y : y + rect_h, x : x + rect_w] = (200, (3 * t) % 256, 255 - (2 * t) % 256)
        if (t // 10) % 2:  # a patch that flickers every 10 frames
            frame[height // 2 : height // 2 + 64, width // 8 : width // 8 + 64] = 255
        clock[0] += time.perf_counter() - start
        yield frame


def run(args: argparse.Namespace) -> dict[str, Any]:
    from raykit.loaders.temporal import row_masses
    from raykit.temporal_weights import TemporalWeightsConfig, temporal_weights

    width, height = args.size
    config = TemporalWeightsConfig(factor=args.factor)
    start_rss = rss()
    per_camera, weight_bytes, weight_count = [], 0, 0
    rows: dict[str, list[np.ndarray]] = {"isg": [], "ist": []}
    last: dict[str, np.ndarray] = {}
    for camera in range(args.cameras):
        last.clear()  # the previous camera's weights go before the next ones are computed
        clock = [0.0]
        start = time.perf_counter()
        out = temporal_weights(camera_frames(camera, args.frames, height, width, clock), config)
        seconds = time.perf_counter() - start
        for kind in rows:
            rows[kind].append(row_masses(getattr(out, kind)))
        weight_bytes += out.isg.nbytes + out.ist.nbytes
        weight_count += out.isg.size
        per_camera.append({"seconds": round(seconds, 2), "making_frames_s": round(clock[0], 2),
                           "peak_rss_mib": round(peak_rss() / 2**20, 1)})  # fmt: skip
        print(f"camera {camera}: {seconds:.1f} s ({clock[0]:.1f} s making frames), "
              f"peak RSS {peak_rss() / 2**20:.0f} MiB", flush=True)  # fmt: skip
        last = {"isg": out.isg, "ist": out.ist}
        del out
    h, w = height // args.factor, width // args.factor
    peak_weights = peak_rss()
    draw_ms = draw_cost(rows, last, args.draws, args.factor)
    seconds = sum(c["seconds"] for c in per_camera)
    scale = N3DV_CAMERAS / args.cameras
    row_bytes = sum(sum(r.nbytes for r in kind_rows) for kind_rows in rows.values())
    return {
        "capture": {"cameras": args.cameras, "frames": args.frames, "width": width, "height": height},
        "config": {
            "gamma": config.gamma,
            "shift": config.shift,
            "alpha": config.alpha,
            "factor": args.factor,
        },
        "weights_per_frame": [h, w],
        "weights_per_kind": weight_count,
        "weights_float16_bytes": weight_bytes,
        "sampler_row_mass_bytes": row_bytes,
        "seconds": round(seconds, 1),
        "seconds_per_camera": round(seconds / args.cameras, 2),
        "making_frames_s": round(sum(c["making_frames_s"] for c in per_camera), 1),
        "peak_rss_weights_bytes": peak_weights,
        "peak_rss_bytes": peak_rss(),
        "rss_at_start_bytes": start_rss,
        "per_camera": per_camera,
        "draw_ms_per_4096": draw_ms,
        "n3dv_20_cameras": {
            "extrapolated": args.cameras != N3DV_CAMERAS,
            "seconds": round(seconds * scale, 1),
            "weights_per_kind": int(weight_count * scale),
            "weights_float16_bytes": int(weight_bytes * scale),
            "sampler_row_mass_bytes": int(row_bytes * scale),
        },
        "kplanes": {
            "isg_weights": KPLANES_WEIGHTS,
            "isg_float32_bytes": KPLANES_WEIGHTS * 4,
            "isg_and_ist_float32_bytes": 2 * KPLANES_WEIGHTS * 4,
            "ram_at_oom_kill_bytes": KPLANES_OOM_BYTES,
        },
    }


def draw_cost(rows: dict[str, list[np.ndarray]], last: dict[str, np.ndarray], draws: int, factor: int
              ) -> dict[str, float]:  # fmt: skip
    """Median milliseconds of one batch of 4096 rays drawn by each kind over every frame's row masses."""
    from raykit.loaders.temporal import TemporalSampler, TemporalSamplingConfig

    frames = len(last["isg"])
    masses = {kind: np.concatenate(kind_rows) for kind, kind_rows in rows.items()}
    sampler = TemporalSampler(masses, lambda kind, f, y: last[kind][f % frames, y], last["isg"].shape[2],
                              factor, TemporalSamplingConfig(ist_step=draws), seed=0)  # fmt: skip
    times: dict[str, list[float]] = {"isg": [], "ist": [], "isg_by_frame": [], "ist_by_frame": []}
    for step in range(2 * draws):
        start = time.perf_counter()
        kind = sampler.draw(step, 4096).kind
        times[kind].append(1e3 * (time.perf_counter() - start))
    for step in (0, draws):  # BY_FRAME batches' rays at once, sorted by frame: per 4096 rays
        start = time.perf_counter()
        kind = sampler.draw_by_frame(step, BY_FRAME * 4096).kind
        times[f"{kind}_by_frame"].append(1e3 * (time.perf_counter() - start) / BY_FRAME)
    return {kind: round(float(np.median(t)), 2) for kind, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cameras", type=int, default=N3DV_CAMERAS)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--size", type=int, nargs=2, default=(1352, 1014), metavar=("W", "H"))
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--draws", type=int, default=50, help="batches of 4096 drawn by each kind")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "temporal_weights.json")
    args = parser.parse_args(argv)
    report = {"command": command_line(), "machine": describe(), **run(args)}
    peak = report["peak_rss_bytes"]
    stored = report["weights_float16_bytes"] / 1e9
    print(f"peak RSS {peak / 2**30:.2f} GiB (target <= 2 GiB); weights {stored:.2f} GB float16 for "
          f"{args.cameras} cameras; {report['seconds_per_camera']} s a camera")  # fmt: skip
    write_report(args.out, report)
    return 0 if peak <= 2 * 2**30 else 1


if __name__ == "__main__":
    sys.exit(main())
