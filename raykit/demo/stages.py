"""The demo as pipeline stages: the scene first, then ``run_pipeline`` with the demo's comparisons."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from raykit.converters import ConvertConfig
from raykit.demo import DemoPlan, machine_info, write_results
from raykit.pipeline import (
    Attempt,
    RunConfig,
    Stage,
    StageConfigs,
    StageRunner,
    fingerprint,
    tree_fingerprint,
)
from raykit.poses import PoseOptions
from raykit.trainer import SAMPLERS, TrainConfig

__all__ = ["demo_configs", "demo_extra", "scene_stage"]


def _command(out: Path, plan: DemoPlan, seed: int) -> list[str]:
    return [
        "raykit",
        "demo",
        f"--out={out}",
        f"--seed={seed}",
        *(["--quick"] if plan.scene_size == "tiny" else []),
    ]


def scene_stage(out: Path, plan: DemoPlan, seed: int) -> Stage:
    """Render the built-in scene into ``OUT/scene`` (Blender and COLMAP forms)."""
    from raykit.demo.steps import make_scene

    def run(attempt: Attempt) -> dict[str, Any]:
        scene = make_scene(out, plan, seed)
        return {**scene, "output": tree_fingerprint(out / "scene")}

    inputs = {"size": plan.scene_size, "seed": seed}
    return Stage("scene", inputs, run, _command(out, plan, seed), (out / "scene",))


def demo_configs(out: Path, scene: dict[str, Any], plan: DemoPlan, seed: int) -> StageConfigs:
    """``raykit run OUT/scene/blender OUT --samplers (all)`` with the plan's budgets."""
    run = RunConfig(
        src=str(scene["blender"]),
        out=str(out),
        samplers=",".join(SAMPLERS),
        minutes=plan.train_seconds * len(SAMPLERS) / 60.0,
        bench_batches=plan.bench_batches,
        seed=seed,
    )
    train = TrainConfig(
        eval_max_images=plan.eval_max_images,
        progress_every_s=plan.progress_every_s,
        threads=torch.get_num_threads(),
        seed=seed,
    )
    convert = ConvertConfig(src=run.src, source="blender", seed=seed, progress=True)
    return StageConfigs(run=run, convert=convert, poses=PoseOptions(seed=seed), train=train)


def demo_extra(out: Path, scene: dict[str, Any], plan: DemoPlan, seed: int, dynamic: bool = False) -> Any:
    """The ``extra`` of ``run_pipeline``: the demo's stages, ``results.json``, the report's sections
    (``dynamic``: the dynamic scene's too)."""

    def extra(runner: StageRunner, results: dict[str, Any]) -> list[Any]:
        from raykit.demo.dynamic import dynamic_section, dynamic_stage
        from raykit.demo.layouts import compare_layouts
        from raykit.demo.report import dataset_section, layouts_section, loader_section
        from raykit.demo.steps import convert_all, profile

        store = results["store"]
        convert_s = (runner.records.get("convert") or {}).get("wall_s") or 0.0
        base = {"scene": scene["output"], "store": store["output"]}
        command = _command(out, plan, seed)

        def stores_run(attempt: Attempt) -> dict[str, Any]:
            summary = convert_all(out, scene, store["url"], convert_s)
            return {
                **summary,
                "output": fingerprint(
                    {k: v.get("fingerprint") for k, v in summary.items() if isinstance(v, dict)}
                ),
            }

        made = (out / "stores" / "blender-wds", out / "stores" / "colmap-zarr")
        stores = runner.execute(Stage("demo-stores", base, stores_run, command, made))
        bench = runner.execute(
            Stage(
                "demo-loader",
                {**base, "plan": asdict(plan)},
                lambda a: {**profile(out, stores, scene, plan), "output": ""},
                command,
            )
        )
        runs = results["runs"]

        def layouts_run(attempt: Attempt) -> dict[str, Any]:
            return {**compare_layouts(out, scene, stores, runs, plan, seed), "output": ""}

        inputs = {**base, "plan": asdict(plan), "runs": {s: r["output"] for s, r in runs.items()}}
        images = [out / "stores" / "blender-zarr-images", out / "runs" / f"{TrainConfig.sampler}-images"]
        layouts = runner.execute(Stage("demo-layouts", inputs, layouts_run, command, images, resumable=False))
        moving = runner.execute(dynamic_stage(out, plan, seed, command)) if dynamic else None
        timings = {name: runner.records.stages[name].get("wall_s") for name in runner.seen}
        write_results(
            out,
            {
                "plan": asdict(plan),
                "seed": seed,
                "machine": machine_info(),
                "scene": scene,
                "stores": stores,
                "bench": bench,
                "runs": runs,
                "layouts": layouts,
                "dynamic": moving,
                "timings_s": timings,
            },
        )
        sections = [dataset_section(scene, stores), loader_section(out, bench), layouts_section(layouts)]
        return sections + ([dynamic_section(moving)] if moving is not None else [])

    return extra
