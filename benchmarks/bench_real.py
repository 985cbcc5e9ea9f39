"""Real-capture benchmark: each sampler with default flags, and what ``--sampler auto`` picks.

For each capture (default: ``../shared/data/plant_capture``, 120 real photos around a plant), the
capture is converted (``raykit convert --downscale D``), then each sampler (stratified, hierarchical,
occupancy, proposal) trains with default flags for ``--minutes`` minutes (``--sampler X
--max-seconds``; nothing else changed) and is evaluated on the whole test split. ``auto`` is not a
fifth run: the sampler it picks for the capture (recorded with its reason, from the same code the
trainer runs) is one of the four, and its row is that run's. Optionally (``--before-minutes``) the
occupancy sampler also runs as it did before issue 30 in contracted space (``--occ-alpha-threshold
0``: no density pass) for a samples-per-ray comparison at equal training time.

Reported per run: test PSNR/SSIM, steps, rays/s, samples per ray, peak memory, the quick test-PSNR
curve against training time (4 test images) and the 1-minute load average before and after (the
machine may be shared: run it alone, e.g. under ``flock`` on a lock file all timing runs take).

    python benchmarks/bench_real.py                                          # the benchmark in BENCHMARKS.md
    python benchmarks/bench_real.py --minutes 0.5 --out out/r.json CAPTURE   # a quick look at any capture

Results go to ``benchmarks/results/bench_real.json`` and the plot to
``benchmarks/results/bench_real_psnr.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench_trainer import summarize
from machine import command_line, describe, portable, write_report

from raykit.converters import convert
from raykit.store import open_store
from raykit.trainer import SAMPLERS, TrainConfig, train
from raykit.trainer.defaults import resolve_sampler
from raykit.trainer.space import resolve_space

ROOT = Path(__file__).resolve().parent
PLANT = ROOT.parent / ".." / "shared" / "data" / "plant_capture"


def capture_store(capture: Path, work: Path, downscale: int) -> Path:
    """The capture converted at ``downscale`` (reused when already there)."""
    path = work / f"{capture.name}-x{downscale}.zarr"
    if not (path / "manifest.json").exists():
        convert(capture, path, downscale=downscale, progress=False, overwrite=True)
    return path


def auto_choice(store: Path) -> dict[str, Any]:
    """What ``--sampler auto`` (and ``--scene-space auto``) pick for ``store``, and why."""
    config, space_reason = resolve_space(TrainConfig(store=str(store), out="unused"), open_store(str(store)))
    config, reason = resolve_sampler(config)
    return {"scene_space": config.scene_space, "space_reason": space_reason, "sampler": config.sampler,
            "reason": reason}  # fmt: skip


def one_run(store: Path, out: Path, seconds: float, progress_every: float, **flags: Any) -> dict[str, Any]:
    """Train with default flags except ``flags`` for ``seconds``; the run's figures and the load."""
    load_before = os.getloadavg()[0]
    config = TrainConfig(store=str(store), out=str(out), steps=10**9, max_seconds=seconds,
                         progress_every_s=progress_every, **flags)  # fmt: skip
    run = train(config)
    figures = summarize(run)
    figures["load_1min"] = [load_before, os.getloadavg()[0]]
    recorded = json.loads((run / "config.json").read_text())
    figures["config"] = {k: portable(v) if isinstance(v, str) else v for k, v in recorded.items()}
    return figures


def bench_capture(capture: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    store = capture_store(capture, work, args.downscale)
    meta = open_store(str(store)).manifest
    result: dict[str, Any] = {
        "capture": _shown(capture),
        "downscale": args.downscale,
        "auto": auto_choice(store),
        "source": {k: meta["source"].get(k) for k in ("rotation_scale", "format")},
        "runs": {},
    }
    seconds = args.minutes * 60
    for sampler in args.samplers.split(","):
        out = work / f"{capture.name}-{sampler}"
        result["runs"][sampler] = one_run(
            store, out, seconds, args.progress_every, sampler=sampler, threads=args.threads
        )
        print(sampler, {k: result["runs"][sampler][k] for k in ("test_psnr", "samples_per_ray", "steps")})
    if args.before_minutes > 0:
        out = work / f"{capture.name}-occupancy-before"
        result["occupancy_before"] = one_run(
            store,
            out,
            args.before_minutes * 60,
            args.progress_every,
            sampler="occupancy",
            occ_alpha_threshold=0.0,
            threads=args.threads,
        )
    runs = result["runs"]
    if result["auto"]["sampler"] in runs:
        best = max(runs, key=lambda s: runs[s]["test_psnr"])
        result["auto_row"] = {"sampler": result["auto"]["sampler"], **runs[result["auto"]["sampler"]]}
        result["best_by_hand"] = {"sampler": best, "test_psnr": runs[best]["test_psnr"]}
    return result


def _shown(path: Path) -> str:
    """A path relative to the repository when it is below its parent (no absolute paths in reports)."""
    try:
        return os.path.relpath(path.resolve(), ROOT.parent)
    except ValueError:
        return path.name


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Quick test PSNR against training time, one panel per capture, one line per sampler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        curves = dict(result["runs"])
        if "occupancy_before" in result:
            curves["occupancy (before: no density pass)"] = result["occupancy_before"]
        for name, run in curves.items():
            points = [(0.0, None)] + [(p["elapsed_s"], p["psnr"]) for p in run["progress"]]
            xs = [x / 60 for x, y in points if y is not None]
            ys = [y for _, y in points if y is not None]
            auto = " = auto" if name == result["auto"]["sampler"] else ""
            ax.plot(xs, ys, marker=".", label=f"{name}{auto} ({run['samples_per_ray']:.0f} samples/ray)")
        ax.set_xlabel("training minutes (2 CPU cores)")
        ax.set_ylabel("quick test PSNR dB (4 views)")
        ax.set_title(f"{result['capture']} (downscale {result['downscale']})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("captures", nargs="*", type=Path, help="capture folders (default: plant_capture)")
    parser.add_argument("--minutes", type=float, default=5.0, help="training minutes per sampler")
    parser.add_argument("--downscale", type=int, default=4, help="raykit convert --downscale")
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument(
        "--before-minutes", type=float, default=0.0, help="also run occupancy without its density pass"
    )
    parser.add_argument(
        "--progress-every", type=float, default=30.0, help="seconds between quick PSNR checks"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads per run (default: torch's choice; 1 keeps a shared machine's other "
        "load from stalling torch's spinning thread pool)",
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raykit-bench-real")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_real.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "results" / "bench_real_psnr.png")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    captures = args.captures or [PLANT]
    results = [bench_capture(capture, args, args.work) for capture in captures]
    plot(results, args.plot)
    report = {"command": command_line(), "machine": describe(), "threads": args.threads, "captures": results}
    write_report(args.out, report)
    print(f"wrote {_shown(args.out)} and {_shown(args.plot)}")


if __name__ == "__main__":
    main()
