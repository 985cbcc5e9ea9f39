"""The demo's layout comparison: the built-in scene as rays and as images, side by side.

Both stores come from the same Blender capture (Zarr backend): bytes on disk, conversion time, the
loader's warm rays/s (batch 4096, CPU) and shuffle quality (``raykit bench``), and the test PSNR of the
default sampler after the same training budget (the rays layout's run is the one ``train_all`` made).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from raykit.converters import convert
from raykit.errors import RaykitError
from raykit.profiling import run_bench
from raykit.store import open_store, validate_store
from raykit.trainer import AUTO_SAMPLERS, TrainConfig, train

__all__ = ["compare_layouts"]

SAMPLER = AUTO_SAMPLERS["box"][0]  # what the default --sampler auto picks for this (bounded) capture


def _layout_row(store_path: str, convert_s: float, plan: Any, psnr: float) -> dict[str, Any]:
    store = open_store(store_path)
    report = run_bench(store, "train", batch_size=4096, batches=plan.bench_batches)
    return {
        "bytes_on_disk": sum(int(v["size"]) for v in store.files.values()),
        "convert_s": convert_s,
        "rays_per_s": report["warm"]["rays_per_s"],
        "first_batch_s": report["cold"]["first_batch_s"],
        "read_mb_per_s": report.get("read_mb_per_s"),
        "decode_share": report.get("decode_share"),
        "shuffle_quality": report["shuffle_quality"],
        "test_psnr": psnr,
    }


def compare_layouts(
    out: Path, scene: dict[str, Any], stores: dict[str, Any], runs: dict[str, Any], plan: Any, seed: int
) -> dict[str, Any]:
    """Convert the Blender capture to the images layout, then measure both layouts (see the module)."""
    start = time.perf_counter()
    images = convert(
        scene["blender"], out / "stores" / "blender-zarr-images", source="blender", layout="images"
    )
    images_s = time.perf_counter() - start
    problems = validate_store(images.url)
    if problems:
        raise RaykitError(f"demo: the images-layout store failed validation: {problems[0]}")
    config = TrainConfig(
        store=images.url, out=str(out / "runs" / f"{SAMPLER}-images"), sampler=SAMPLER, steps=1_000_000,
        max_seconds=plan.train_seconds, seed=seed, eval_splits="test", eval_max_images=plan.eval_max_images,
        progress_every_s=plan.progress_every_s, threads=torch.get_num_threads(), progress=True,
    )  # fmt: skip
    run_dir = train(config)
    psnr = json.loads((run_dir / "eval.json").read_text())["splits"]["test"]["psnr"]
    rays = stores["blender-zarr"]
    return {
        "sampler": SAMPLER,
        "train_seconds": plan.train_seconds,
        "rays": _layout_row(rays["path"], rays["convert_s"], plan, runs[SAMPLER]["psnr"]),
        "images": _layout_row(images.url, images_s, plan, psnr),
    }
