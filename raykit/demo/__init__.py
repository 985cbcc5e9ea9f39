"""``raykit demo``: the main job end to end on the built-in scene, with a report a person wants to read.

Steps (each prints one line and a progress bar where it is long):

1. render the built-in scene and write it as a Blender ``nerf_synthetic`` folder and a COLMAP model;
2. convert both forms to Zarr and WebDataset ray stores, validate every store, and check that the
   forms and backends hold the same rays;
3. profile the loader against the two classic baselines, over worker counts and batch sizes;
4. train the compact trainer with each sampler for a fixed time budget and evaluate on the test split;
   then compare the images layout with the ray layout (``raykit.demo.layouts``);
5. write ``report.md`` with tables, plots and rendered test views beside the ground truth.

``--quick`` runs the same steps on the tiny scene with short budgets (under two minutes).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = ["DemoPlan", "plan_for", "run_demo"]

T = TypeVar("T")


@dataclass(frozen=True)
class DemoPlan:
    """Sizes and budgets of one demo run."""

    scene_size: str
    train_seconds: float
    bench_batches: int
    bench_workers: tuple[int, ...]
    bench_batch_sizes: tuple[int, ...]
    eval_max_images: int
    progress_every_s: float


def plan_for(quick: bool) -> DemoPlan:
    """The full plan (about 8 minutes on 2 cores) or the ``--quick`` one (about 1 minute)."""
    if quick:
        return DemoPlan("tiny", 6.0, 40, (0, 1), (1024, 4096), 2, 2.0)
    return DemoPlan("small", 75.0, 300, (0, 1, 2), (1024, 4096, 16384), 10, 10.0)


def _step(title: str, fn: Callable[[], T], timings: dict[str, float]) -> T:
    print(f"==> {title}", flush=True)
    start = time.perf_counter()
    result = fn()
    timings[title] = time.perf_counter() - start
    print(f"    done in {timings[title]:.1f} s", flush=True)
    return result


def run_demo(out: str | os.PathLike[str], *, quick: bool = False, seed: int = 0) -> Path:
    """Run every step into ``out`` (replacing a previous demo there) and return the report's path."""
    from raykit.demo import steps
    from raykit.demo.report import write_report

    out_dir = Path(out)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    plan = plan_for(quick)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    scene = _step("render the built-in scene", lambda: steps.make_scene(out_dir, plan, seed), timings)
    stores = _step("convert and validate", lambda: steps.convert_all(out_dir, scene), timings)
    bench = _step("profile the loader", lambda: steps.profile(out_dir, stores, scene, plan), timings)
    runs = _step("train each sampler", lambda: steps.train_all(out_dir, stores, plan, seed), timings)
    from raykit.demo.layouts import compare_layouts

    layouts = _step(
        "compare the layouts", lambda: compare_layouts(out_dir, scene, stores, runs, plan, seed), timings
    )
    timings["total"] = time.perf_counter() - started
    results = {
        "plan": asdict(plan),
        "seed": seed,
        "machine": machine_info(),
        "scene": scene,
        "stores": stores,
        "bench": bench,
        "runs": runs,
        "layouts": layouts,
        "timings_s": timings,
    }
    (out_dir / "results.json").write_text(json.dumps(_jsonable(results), indent=2) + "\n")
    report = write_report(out_dir, results)
    print(f"report: {report}")
    return report


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
    }


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return obj
