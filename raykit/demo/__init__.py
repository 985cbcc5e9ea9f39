"""``raykit demo``: ``raykit run`` on the built-in scene, with the demo's comparisons as extra stages.

Stages (each recorded in ``OUT/pipeline.json``; a rerun skips what is up to date):

1. ``scene``: render the built-in scene; write it as a Blender ``nerf_synthetic`` folder and a COLMAP
   model;
2. the pipeline of ``raykit run`` on the Blender folder (``raykit.pipeline``): convert, validate,
   profile, train each sampler for the same time budget, evaluate, export with verification, render;
3. ``demo-stores``: the same capture as a WebDataset store and from its COLMAP form, every store
   validated, and the forms and backends compared ray for ray;
4. ``demo-loader``: the loader over worker counts and batch sizes against the two classic baselines;
5. ``demo-layouts``: the images layout against the ray layout (``raykit.demo.layouts``);
6. ``demo-dynamic`` (with ``--dynamic``): the built-in dynamic scene, the static field against the
   time-conditioned one (``raykit.demo.dynamic``);
7. the report: ``report.md`` and ``report.html`` with the pipeline's sections and the demo's, and
   ``results.json`` with every figure.

``--quick`` runs the same stages on the tiny scene with short budgets (about two minutes).
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from raykit.fileio import json_safe

__all__ = ["DemoPlan", "plan_for", "run_demo"]


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
    dynamic_seconds: float  # ``--dynamic``: training time of each field on the dynamic scene


def plan_for(quick: bool) -> DemoPlan:
    """The full plan (about 8 minutes on 2 cores) or the ``--quick`` one (about 2 minutes)."""
    if quick:
        return DemoPlan("tiny", 6.0, 40, (0, 1), (1024, 4096), 2, 2.0, 5.0)
    return DemoPlan("small", 75.0, 300, (0, 1, 2), (1024, 4096, 16384), 10, 10.0, 40.0)


def run_demo(
    out: str | os.PathLike[str], *, quick: bool = False, seed: int = 0, dynamic: bool = False
) -> Path:
    """Run every stage into ``out`` (resuming what an earlier demo left there); return the report's path.
    ``dynamic``: the dynamic scene's section too (``raykit.demo.dynamic``)."""
    from raykit.demo.stages import demo_configs, demo_extra, scene_stage
    from raykit.pipeline import StageRunner, check_run_folder, run_pipeline

    out_dir = Path(out)
    check_run_folder(out_dir)  # a new or empty folder, or one of raykit's own run folders
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = plan_for(quick)
    runner = StageRunner(out_dir)
    scene = runner.execute(scene_stage(out_dir, plan, seed))
    cfg = demo_configs(out_dir, scene, plan, seed)
    report = run_pipeline(cfg, extra=demo_extra(out_dir, scene, plan, seed, dynamic), runner=runner)
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


def write_results(out: Path, results: dict[str, Any]) -> Path:
    """``out/results.json``: every figure of the demo (plan, machine, scene, stores, loader, runs)."""
    path = out / "results.json"
    path.write_text(json.dumps(json_safe(results), indent=2) + "\n")
    return path
