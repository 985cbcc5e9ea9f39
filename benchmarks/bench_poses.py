"""Pose estimation benchmark: time per stage and registered fraction of ``raykit poses``.

The textured built-in scene (:func:`raykit.testing.photos.render_photos`, cameras on two rings) is
rendered at two sizes, written as PNG photos into a temporary folder and run through
:func:`raykit.poses.estimate.estimate_poses` with default options (exhaustive matching below 200
photos, SIMPLE_RADIAL, one shared camera) and ``--threads`` (default 2). Recorded per size: wall time
of each stage (features, matching, mapping), the registered fraction, points, mean reprojection error,
and the accuracy against the true poses after the best similarity on camera centres (median/max
rotation error in degrees, median/max centre error relative to the largest distance between cameras).

    python benchmarks/bench_poses.py                      # both sizes -> benchmarks/results/poses.json
    python benchmarks/bench_poses.py --sizes 16x200 --out out/p.json   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pycolmap
from PIL import Image

from raykit.colmap_io import read_model
from raykit.conventions import c2w_from_colmap
from raykit.poses.align import pose_errors
from raykit.poses.estimate import PoseOptions, estimate_poses
from raykit.testing.photos import render_photos

ROOT = Path(__file__).resolve().parent
DEFAULT_SIZES = ("24x240", "48x480")


def run_size(views: int, size: int, threads: int, seed: int) -> dict[str, Any]:
    """Render, estimate poses, compare with the truth; one record."""
    start = time.perf_counter()
    shoot = render_photos(views, size, seed=seed)
    render_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="bench-poses-") as tmp:
        photos = Path(tmp) / "photos"
        photos.mkdir()
        names = [f"view_{i:03d}.png" for i in range(views)]
        for name, image in zip(names, shoot.images, strict=True):
            Image.fromarray(image).save(photos / name)
        load_before = os.getloadavg()
        start = time.perf_counter()
        summary = estimate_poses(photos, Path(tmp) / "out", PoseOptions(threads=threads, seed=seed))
        total_s = time.perf_counter() - start
        load_after = os.getloadavg()
        by_name = {im.name: im for im in read_model(Path(tmp) / "out" / "sparse" / "0").images.values()}
    kept = [i for i, n in enumerate(names) if n in by_name]
    est = np.stack(
        [c2w_from_colmap(np.array(by_name[names[i]].qvec), np.array(by_name[names[i]].tvec)) for i in kept]
    )
    rot_deg, centre_err, extent = pose_errors(est, shoot.c2w[kept])
    return {
        "views": views,
        "size": size,
        "render_s": round(render_s, 2),
        "stages_s": {k: round(v, 2) for k, v in summary.seconds.items()},
        "total_s": round(total_s, 2),
        "registered": len(summary.registered),
        "registered_fraction": len(summary.registered) / views,
        "points": summary.points,
        "reprojection_error_px": round(summary.reprojection_error, 4),
        "matcher": summary.matcher,
        "rotation_error_deg": {"median": float(np.median(rot_deg)), "max": float(rot_deg.max())},
        "centre_error_rel": {
            "median": float(np.median(centre_err) / extent),
            "max": float(centre_err.max() / extent),
        },
        "loadavg_before": load_before[0],
        "loadavg_after": load_after[0],
    }


def _command(args: argparse.Namespace) -> str:
    parts = ["python benchmarks/bench_poses.py"]
    if list(args.sizes) != list(DEFAULT_SIZES):
        parts.append("--sizes " + " ".join(args.sizes))
    if args.threads != 2:
        parts.append(f"--threads {args.threads}")
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(DEFAULT_SIZES), help="VIEWSxPIXELS, e.g. 24x240")
    parser.add_argument("--threads", type=int, default=2, help="pycolmap threads (default: 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "poses.json")
    args = parser.parse_args()
    runs = []
    for spec in args.sizes:
        views, size = (int(v) for v in spec.split("x"))
        runs.append(run_size(views, size, args.threads, args.seed))
        print(json.dumps(runs[-1]))
    result = {
        "benchmark": "poses",
        "command": _command(args),
        "threads": args.threads,
        "pycolmap": pycolmap.__version__,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
