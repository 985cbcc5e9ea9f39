"""Static against time-conditioned field on the built-in dynamic scene, at equal time (issue 59).

The built-in dynamic scene (``raykit.testing.render_dynamic``: ``--moving`` groups of objects moving
on the ground, 1 = one sphere along x) is rendered from ``--cameras`` cameras on a ring at
``--times`` times, ``--size`` pixels square, written as a D-NeRF capture and converted; the last
camera is held out (its odd frames are the test split). Each seed trains, for ``--seconds`` of
training each, one after the other (the order rotating per seed, so all meet the same load):

- ``static``: ``--field static`` on every frame (one field for all times);
- ``kplanes``: ``--field kplanes`` on every frame;
- ``per_frame`` (unless ``--no-per-frame``): ``--field kplanes`` trained per frame, one field for
  each test frame on that frame's views only, each for ``--seconds / --times`` (the share of the
  total a frame gets when every frame is trained on its own: equal total time); its PSNR is the mean
  over the test frames of each frame's field's test PSNR, the same views as the others' test split.

``static_bound_psnr`` is the most a static field can score on the test views (:func:`static_bound`):
how much of the images the motion is.

Every other flag is at its default (the same sampler and settings for all) unless ``--set KEY=VALUE``
gives a ``TrainConfig`` field for every run; ``--steps`` trains each run for a number of steps instead
of ``--seconds`` (equal steps), ``--fields`` picks the fields. Each run records the test PSNR (the
protocol's, every test view), the steps and the seconds a step::

    python benchmarks/bench_dynamic_field.py --seconds 60 --seeds 0,1
    python benchmarks/bench_dynamic_field.py --steps 800 --fields kplanes --no-per-frame --set time_lr_scale=1

Results go to ``benchmarks/results/dynamic_field.json`` (``--out``). ``--pieces`` times the pieces of
a step instead (:func:`pieces`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent


def _one(
    store: Path, out: Path, field: str, budget: dict[str, Any], seed: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """One training run of ``field`` for ``budget`` (``max_seconds`` or ``steps``), ``extra`` the other
    ``TrainConfig`` fields (``--threads``, ``--set``)."""
    from raykit.trainer import TrainConfig, train

    run = train(TrainConfig(store=str(store), out=str(out), field=field, seed=seed, **budget, **extra))
    test = json.loads((run / "eval.json").read_text())["splits"]["test"]
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    steps, elapsed = log[-1]["step"], log[-1]["elapsed_s"]
    return {"psnr": test["psnr"], "steps": steps, "ms_per_step": 1e3 * elapsed / steps}


def _frame_scene(scene: Any, frame: int) -> Any:
    """The views of one time step of a ``DynamicScene``."""
    keep = np.flatnonzero(scene.frame_index == frame)
    pick = lambda values: tuple(values[i] for i in keep)  # noqa: E731
    return dataclasses.replace(
        scene,
        names=pick(scene.names),
        splits=pick(scene.splits),
        times=scene.times[keep],
        camera_index=scene.camera_index[keep],
        frame_index=scene.frame_index[keep],
        cameras=pick(scene.cameras),
        c2w=scene.c2w[keep],
        images=pick(scene.images),
    )


def _per_frame(
    scene: Any, work: Path, budget: dict[str, Any], seed: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """``kplanes`` trained on each test frame alone for ``budget / frames``; the mean over frames."""
    from raykit.converters import convert
    from raykit.testing import write_dnerf

    frames = sorted({int(scene.frame_index[i]) for i, s in enumerate(scene.splits) if s == "test"})
    times = len(set(scene.frame_index.tolist()))
    share = {k: v / times if k == "max_seconds" else max(1, round(v / times)) for k, v in budget.items()}
    records = []
    for frame in frames:
        store = work / f"frame{frame}.zarr"
        if not store.exists():
            convert(write_dnerf(_frame_scene(scene, frame), work / f"frame{frame}"), store)
        records.append(_one(store, work / f"per_frame-{seed}-{frame}", "kplanes", share, seed, extra))
    return {
        "psnr": statistics.mean(r["psnr"] for r in records),
        "steps": sum(r["steps"] for r in records),
        "ms_per_step": statistics.mean(r["ms_per_step"] for r in records),
        "budget_per_frame": share,
        "frame_psnr": {str(f): r["psnr"] for f, r in zip(frames, records, strict=True)},
    }


def static_bound(scene: Any) -> float:
    """The mean test PSNR of the best image a static field can render for the held-out camera: per
    pixel, the mean over the test frames (over white). A static field renders one image per camera
    whatever the time, so no static field scores above this; it measures how much of the test images
    the motion is."""
    from raykit.testing.dynamic import rgb_over_white

    test = [i for i, split in enumerate(scene.splits) if split == "test"]
    images = np.stack([rgb_over_white(scene.images[i]).astype(np.float64) / 255 for i in test])
    mse = ((images - images.mean(axis=0)) ** 2).mean(axis=(1, 2, 3))
    return float(np.mean(-10 * np.log10(np.maximum(mse, 1e-10))))


def error_split(scene: Any, run: Path) -> dict[str, float]:
    """Where a run's test error is: the held-out camera's pixels that change over its frames (the
    motion) against the rest. ``moving_share``: the moving pixels' part of the squared error;
    ``psnr_static_pixels`` / ``psnr_moving_pixels``: the PSNR if the other part were exact (the mean
    squared error over the test views, every pixel counted)."""
    from PIL import Image

    from raykit.testing.dynamic import rgb_over_white

    held = int(scene.camera_index[next(i for i, s in enumerate(scene.splits) if s == "test")])
    frames = np.stack([rgb_over_white(scene.images[i]) for i in np.flatnonzero(scene.camera_index == held)])
    moving = (frames != frames[:1]).any(axis=(0, 3))
    index = {name: i for i, name in enumerate(scene.names)}
    images = json.loads((run / "eval.json").read_text())["splits"]["test"]["images"]
    on_moving, on_static = [], []
    for image in images:
        truth = rgb_over_white(scene.images[index[image["name"].removesuffix(".png")]]).astype(np.float64)
        render = np.asarray(Image.open(run / "renders" / "test" / image["file"]).convert("RGB"), np.float64)
        squared = (((truth - render) / 255) ** 2).mean(axis=-1)
        on_moving.append(squared[moving].sum() / squared.size)
        on_static.append(squared[~moving].sum() / squared.size)
    moving_mse, static_mse = float(np.mean(on_moving)), float(np.mean(on_static))
    return {
        "moving_pixels": float(moving.mean()),
        "moving_share": moving_mse / (moving_mse + static_mse),
        "psnr_static_pixels": float(-10 * np.log10(static_mse)),
        "psnr_moving_pixels": float(-10 * np.log10(moving_mse)),
    }


def pieces(points: int = 33_000, repeats: int = 3) -> dict[str, float]:
    """Seconds of the pieces of a step, the default fields in one process, interleaved, the median of
    ``repeats``: forward + backward of ``points`` samples, the regularisers per step (every step, as
    the first round took them, and as now, an 8-step window's mean), and one full refresh of a 64^3
    occupancy grid (a kplanes field at 4 and at 1 time per cell, the static field)."""
    import time

    import torch

    from raykit.trainer.field import RadianceField
    from raykit.trainer.occupancy import OccupancyGrid
    from raykit.trainer.spacetime import (
        TV_EVERY,
        SpaceTimeField,
        max_over_time,
        plane_tv,
        regularisation,
        time_smoothness,
    )

    aabb = torch.tensor([-1.5, -1.5, -1.5, 1.5, 1.5, 1.5])
    gen = torch.Generator().manual_seed(0)
    pos = torch.rand(points, 3, generator=gen) * 3 - 1.5
    dirs = torch.nn.functional.normalize(torch.randn(points, 3, generator=gen), dim=-1)
    times = torch.rand(points, generator=gen)
    static, timed = RadianceField(aabb), SpaceTimeField(aabb, (0.0, 1.0), 6)
    grid = OccupancyGrid(aabb, 64)

    def step(field: Any) -> None:
        sigma, rgb = field(pos, dirs, times if field.timed else None)
        (sigma.sum() + rgb.sum()).backward()

    def regularise_every_step() -> None:
        (1e-4 * plane_tv(timed.planes) + 1e-3 * time_smoothness(timed.time_planes)).backward()

    def regularise_now() -> None:
        for k in range(TV_EVERY):
            regularisation(timed, 1e-4, 1e-3, k).backward()  # type: ignore[union-attr]

    jobs = {
        "static_forward_backward_s": (lambda: step(static), 1),
        "kplanes_forward_backward_s": (lambda: step(timed), 1),
        "regularisers_every_step_s": (regularise_every_step, 1),
        "regularisers_now_per_step_s": (regularise_now, TV_EVERY),
        "refresh_kplanes_4_times_s": (
            lambda: grid.refresh(max_over_time(timed.density, timed.time_range, 4, gen), 0.02, gen),
            1,
        ),
        "refresh_kplanes_1_time_s": (
            lambda: grid.refresh(max_over_time(timed.density, timed.time_range, 1, gen), 0.02, gen),
            1,
        ),
        "refresh_static_s": (lambda: grid.refresh(static.density, 0.02, gen), 1),
    }
    seconds: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(repeats):
        for name, (job, per) in jobs.items():
            start = time.perf_counter()
            job()
            seconds[name].append((time.perf_counter() - start) / per)
    return {name: statistics.median(values) for name, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cameras", type=int, default=6)
    parser.add_argument("--times", type=int, default=12)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--moving", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=None, help="train each run for this many steps instead")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--fields", default="static,kplanes", help="which of static, kplanes to train")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a TrainConfig field for every run"
    )
    parser.add_argument("--no-per-frame", action="store_true")
    parser.add_argument("--pieces", action="store_true", help="time the pieces of a step instead (pieces())")
    parser.add_argument("--out", default=str(ROOT / "results" / "dynamic_field.json"))
    args = parser.parse_args()
    if args.pieces:
        measured = pieces()
        Path(args.out).write_text(
            json.dumps({"benchmark": "dynamic_field_pieces", **measured}, indent=2) + "\n"
        )
        print(json.dumps(measured, indent=1))
        return

    from raykit.converters import convert
    from raykit.testing import render_dynamic, write_dnerf

    work = Path(tempfile.mkdtemp(prefix="dynamic_field_"))
    scene = render_dynamic(n_cameras=args.cameras, n_times=args.times, size=args.size, moving=args.moving)
    store = work / "store.zarr"
    convert(write_dnerf(scene, work / "cap"), store)
    budget = {"max_seconds": args.seconds} if args.steps is None else {"steps": args.steps}
    extra: dict[str, Any] = {"threads": args.threads}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            extra[key] = value
    kinds = args.fields.split(",") + ([] if args.no_per_frame else ["per_frame"])
    runs = []
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        for kind in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:
            if kind == "per_frame":
                result = _per_frame(scene, work, budget, seed, extra)
            else:
                result = _one(store, work / f"{kind}-{seed}", kind, budget, seed, extra)
                result["error_split"] = error_split(scene, work / f"{kind}-{seed}")
            record = {"field": kind, "seed": seed, **result}
            print(json.dumps(record), flush=True)
            runs.append(record)
    means = {kind: statistics.mean(r["psnr"] for r in runs if r["field"] == kind) for kind in kinds}
    report: dict[str, Any] = {
        "benchmark": "dynamic_field",
        "scene": {"cameras": args.cameras, "times": args.times, "size": args.size, "moving": args.moving},
        "static_bound_psnr": static_bound(scene),
        **budget,
        "settings": extra,
        "runs": runs,
        "mean_psnr": means,
    }
    if {"static", "kplanes"} <= means.keys():
        report["kplanes_minus_static_db"] = means["kplanes"] - means["static"]
    if {"kplanes", "per_frame"} <= means.keys():
        report["kplanes_minus_per_frame_db"] = means["kplanes"] - means["per_frame"]
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("runs", "scene", "benchmark")}))


if __name__ == "__main__":
    main()
