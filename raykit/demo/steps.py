"""The demo's own steps (besides the pipeline's); each returns a JSON-able summary for the report."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from raykit.converters import convert
from raykit.errors import RaykitError
from raykit.loaders import image_rays
from raykit.profiling import baseline_cached_images, baseline_precomputed_rays, run_bench
from raykit.store import RayStore, open_store, validate_store
from raykit.testing import render_scene, write_blender, write_colmap

__all__ = ["compare_stores", "convert_all", "make_scene", "profile"]


def make_scene(out: Path, plan: Any, seed: int) -> dict[str, Any]:
    """Render the built-in scene once; write its Blender and COLMAP (binary) forms."""
    scene = render_scene(plan.scene_size, seed=seed)
    write_blender(scene, out / "scene" / "blender")
    write_colmap(scene, out / "scene" / "colmap", binary=True)
    counts = {split: len(scene.indices(split)) for split in ("train", "val", "test")}
    return {
        "size": plan.scene_size,
        "seed": seed,
        "width": scene.camera.width,
        "height": scene.camera.height,
        "camera_model": scene.camera.model,
        "views": counts,
        "render_s": scene.render_seconds,
        "blender": out / "scene" / "blender",
        "colmap": out / "scene" / "colmap",
        "splits": {split: [scene.names[i] for i in scene.indices(split)] for split in counts},
    }


def convert_all(out: Path, scene: dict[str, Any], blender_zarr: str, convert_s: float) -> dict[str, Any]:
    """Blender -> WebDataset, COLMAP -> Zarr beside the pipeline's Blender -> Zarr store (``blender_zarr``,
    converted in ``convert_s``); validate each; compare their rays."""
    stores_dir = out / "stores"
    colmap_split = {s: [f"{n}.png" for n in names] for s, names in scene["splits"].items()}
    jobs = {
        "blender-wds": (scene["blender"], "blender", "wds", None),
        "colmap-zarr": (scene["colmap"], "colmap", "zarr", colmap_split),
    }
    summary: dict[str, Any] = {"blender-zarr": _store_summary(open_store(blender_zarr), convert_s)}
    for name, (src, source, backend, split) in jobs.items():
        start = time.perf_counter()
        store = convert(src, stores_dir / name, source=source, backend=backend, split=split, progress=True,
                        overwrite=True)  # fmt: skip
        seconds = time.perf_counter() - start
        problems = validate_store(store.url)
        if problems:
            raise RaykitError(f"demo: store {name} failed validation: {problems[0]}")
        summary[name] = _store_summary(store, seconds)
    if validate_store(blender_zarr):
        raise RaykitError(f"demo: store {blender_zarr} failed validation")
    summary["equal_fingerprints_zarr_wds"] = (
        summary["blender-zarr"]["fingerprint"] == summary["blender-wds"]["fingerprint"]
    )
    summary["blender_vs_colmap"] = compare_stores(
        open_store(blender_zarr), open_store(stores_dir / "colmap-zarr"), "test"
    )
    summary["blender_zarr_vs_wds"] = compare_stores(
        open_store(blender_zarr), open_store(stores_dir / "blender-wds"), "test"
    )
    return summary


def _store_summary(store: RayStore, seconds: float) -> dict[str, Any]:
    files = store.manifest["files"]
    n_rays = sum(info.n_rays for info in store.splits.values())
    on_disk = sum(int(entry["size"]) for entry in files.values())
    return {
        "path": store.url,
        "backend": store.backend,
        "fingerprint": store.fingerprint,
        "splits": {
            s: {"rays": i.n_rays, "images": i.n_images, "chunks": i.n_chunks} for s, i in store.splits.items()
        },
        "bytes_on_disk": on_disk,
        "bytes_per_ray": on_disk / max(n_rays, 1),
        "convert_s": seconds,
        "valid": True,
    }


def compare_stores(a: Any, b: Any, split: str) -> dict[str, float]:
    """Largest differences between two stores' rays, image by image (names compared without extension)."""
    by_stem = {Path(n).with_suffix("").as_posix(): n for n in b.images(split)}
    worst = {"origins": 0.0, "directions": 0.0, "rgb": 0.0, "images": 0}
    for name in a.images(split):
        ra, rb = image_rays(a, name), image_rays(b, by_stem[Path(name).with_suffix("").as_posix()])
        for key in ("origins", "directions", "rgb"):
            diff = (getattr(ra, key) - getattr(rb, key)).abs().max().item()
            worst[key] = max(worst[key], diff)
        worst["images"] += 1
    return worst


def profile(out: Path, stores: dict[str, Any], scene: dict[str, Any], plan: Any) -> dict[str, Any]:
    """raykit's loader over worker counts and batch sizes, and the two baselines, on the Zarr store."""
    store = open_store(stores["blender-zarr"]["path"])
    capture = Path(scene["blender"])
    grid = []
    for workers in plan.bench_workers:
        for batch_size in plan.bench_batch_sizes:
            report = run_bench(
                store, "train", batch_size=batch_size, workers=workers, batches=plan.bench_batches
            )
            grid.append(report)
            print(
                f"    workers {workers} batch {batch_size:>6}: "
                f"{report['warm']['rays_per_s'] / 1e6:6.2f} M rays/s warm",
                flush=True,
            )
    wds = run_bench(
        open_store(stores["blender-wds"]["path"]), "train", batch_size=4096, batches=plan.bench_batches
    )
    baselines = {
        "a_precomputed_rays": baseline_precomputed_rays(store, capture, 4096, plan.bench_batches),
        "b_cached_images": baseline_cached_images(store, capture, 4096, plan.bench_batches),
    }
    result = {"grid": grid, "wds_4096": wds, "baselines": baselines}
    (out / "bench.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result
