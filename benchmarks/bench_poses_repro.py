"""Are ``raykit poses``' matches the same on every run? pycolmap's FAISS matcher against brute force.

The photos' features are extracted once; then each matching arm (``faiss``: pycolmap's default CPU
matcher, ``brute``: ``--brute-force-matching``) matches them again and again, the arms interleaved,
every run from an empty match table (``raykit.poses.sfm.discard_matches``). Each run's raw matches
and verified pairs are hashed; recorded per arm and matcher: the runs, how many distinct outcomes
they gave and how often each came, and the seconds of matching (median, min, max). ``--busy K`` keeps
K busy processes beside the runs (the rare FAISS differences showed on a loaded machine).

    python benchmarks/bench_poses_repro.py --runs 120 --busy 3    # 24 rendered photos, FAISS and brute force
    python benchmarks/bench_poses_repro.py --runs 120 --busy 3 --matcher alternate --out ...
    python benchmarks/bench_poses_repro.py --photos ../shared/data/plant_capture/images --runs 2 \\
        --out benchmarks/results/poses_repro_plant.json          # timing on a real capture
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pycolmap
from machine import command_line, describe, portable, write_report
from PIL import Image

from raykit.poses import sfm
from raykit.testing.photos import render_photos

ROOT = Path(__file__).resolve().parent
ARMS = {"faiss": False, "brute": True}


def _spin() -> None:
    while True:
        pass


def _outcome(database: Path) -> str:
    """A hash of every pair's raw matches and verified inliers, read through pycolmap."""
    digest = hashlib.sha256()
    db = pycolmap.Database.open(str(database))
    try:
        pairs, matches = db.read_all_matches()
        for pair, m in sorted(zip(pairs, matches, strict=True), key=lambda item: item[0]):
            digest.update(int(pair).to_bytes(8, "little") + m.tobytes())
        pairs, geometries = db.read_two_view_geometries()
        for pair, g in sorted(zip(pairs, geometries, strict=True), key=lambda item: item[0]):
            digest.update(int(pair).to_bytes(8, "little") + int(g.config).to_bytes(4, "little"))
            digest.update(g.inlier_matches.tobytes())
    finally:
        db.close()
    return digest.hexdigest()[:12]


def _summary(outcomes: list[str], seconds: list[float]) -> dict[str, Any]:
    counts = sorted((outcomes.count(o) for o in set(outcomes)), reverse=True)
    return {
        "runs": len(outcomes),
        "distinct_outcomes": len(counts),
        "outcome_counts": counts,
        "runs_unlike_the_most_common": len(outcomes) - counts[0],
        "seconds": {
            "median": round(statistics.median(seconds), 3),
            "min": round(min(seconds), 3),
            "max": round(max(seconds), 3),
        },
    }


def _photos(arg: str | None, scratch: Path) -> tuple[Path, list[str]]:
    if arg:
        folder = Path(arg)
        return folder, sorted(p.name for p in folder.iterdir() if p.is_file())
    folder = scratch / "photos"
    folder.mkdir()
    names = [f"view_{i:02d}.png" for i in range(24)]
    for name, image in zip(names, render_photos(24, 240).images, strict=True):
        Image.fromarray(image).save(folder / name)
    return folder, names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", help="a folder of photos (default: 24 rendered photos, 240x240)")
    parser.add_argument("--runs", type=int, default=60, help="matching runs per arm")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument(
        "--matcher",
        choices=("exhaustive", "sequential", "alternate"),
        help="default: sequential for a --photos folder, exhaustive for the rendered photos; alternate: "
        "one run each way in turn (as a folder rerun with the other matcher, in one process)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--busy", type=int, default=0, help="busy processes running beside the runs")
    parser.add_argument("--out", default=str(ROOT / "results" / "poses_repro.json"))
    args = parser.parse_args()
    matcher = args.matcher or ("sequential" if args.photos else "exhaustive")
    turns = ["exhaustive", "sequential"] if matcher == "alternate" else [matcher]
    groups = [f"{arm}/{turn}" for arm in args.arms for turn in turns]  # outcomes compared within a group

    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        folder, names = _photos(args.photos, scratch)
        database = scratch / "database.db"
        with sfm.quiet_pycolmap():
            sfm.extract(
                database, folder, names, camera_model="SIMPLE_RADIAL", single=True, max_image_size=3200,
                max_features=8192, threads=args.threads, progress=False,
            )  # fmt: skip
        busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
        for proc in busy:
            proc.start()
        outcomes: dict[str, list[str]] = {group: [] for group in groups}
        seconds: dict[str, list[float]] = {group: [] for group in groups}
        load_before = os.getloadavg()[0]
        try:
            for run in range(args.runs):
                turn = turns[run % len(turns)]
                for arm in args.arms:
                    group = f"{arm}/{turn}"
                    sfm.discard_matches(database, raw=True)
                    start = time.perf_counter()
                    with sfm.quiet_pycolmap():
                        sfm.match(
                            database, sequential=turn == "sequential", brute_force=ARMS[arm],
                            threads=args.threads, seed=0, progress=False,
                        )  # fmt: skip
                    seconds[group].append(time.perf_counter() - start)
                    outcomes[group].append(_outcome(database))
                distinct = ", ".join(f"{g} {len(set(outcomes[g]))} distinct" for g in groups if outcomes[g])
                print(f"run {run + 1}/{args.runs}: {distinct}", flush=True)
        finally:
            for proc in busy:
                proc.kill()  # (SIGTERM would print pycolmap's stack trace handler in each)
                proc.join()
        load_after = os.getloadavg()[0]

    result: dict[str, Any] = {
        "benchmark": "poses_repro",
        "command": command_line(),
        "machine": describe(),
        "photos": portable(args.photos) if args.photos else "24 rendered photos, 240x240",
        "n_photos": len(names),
        "matcher": matcher,
        "threads": args.threads,
        "busy_processes": args.busy,
        "pycolmap": pycolmap.__version__,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "arms": {group: _summary(outcomes[group], seconds[group]) for group in groups},
    }
    write_report(args.out, result)
    print(json.dumps(result["arms"], indent=1))


if __name__ == "__main__":
    main()
