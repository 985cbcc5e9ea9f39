"""Evaluation benchmark: rays/s of the trainer's evaluation renders, A/B between two checkouts.

A lego-sized test split: the built-in scene rendered at 200x200 with 200 test views (8 M rays, as
nerf_synthetic's lego at ``--downscale 4``) and 100 training views. ``prepare`` trains one model on it
(``--sampler`` for ``--train-steps``, with the checkout this script lives in) and saves its tensors;
``measure`` renders every test view with the checkout on ``PYTHONPATH`` (``raykit.trainer``'s
``render_image``, the path of ``eval.json``, progress checks and ``raykit render``), and reports rays/s
and the PSNR of the renders (equal PSNR on both sides: the renders are the same), and the process's
CPU seconds beside the wall seconds (on a shared machine the CPU time carries better; at 2 threads
set ``OMP_WAIT_POLICY=PASSIVE`` so that a thread waiting for a taken core does not spin and count);
``ab`` alternates ``measure`` between checkouts, in subprocesses, block of views by block
(``--block``), so that both checkouts meet the same load, and reports both speed-ups.

    python benchmarks/bench_eval.py prepare --work benchmarks/data/bench-eval
    python benchmarks/bench_eval.py ab --work benchmarks/data/bench-eval --trees ../base,. --threads 1

(``../base``: a checkout of the base commit beside this one.)

Results go to ``benchmarks/results/eval_ab.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
N_TRAIN, N_TEST, SIZE = 100, 200, 200
# The model's config: only fields both sides of an A/B know (the config of this round's start).
MODEL_KEYS = ("sampler", "scene_space", "background", "levels", "base_resolution", "max_resolution",
              "features", "hidden", "occ_resolution", "occ_threshold", "march_steps", "prop_samples",
              "prop_final", "prop_resolution", "early_stop_eps", "occ_alpha_threshold", "steps")  # fmt: skip


def _store(work: Path) -> Path:
    """The 200x200 built-in scene with 100 train and 200 test views as a Zarr ray store (reused)."""
    import numpy as np

    from raykit.store import ImageRecord, SceneInfo, write_store
    from raykit.testing import builtin

    path = work / "store"
    if (path / "manifest.json").exists():
        return path
    builtin.SIZES["bench-eval"] = builtin.SceneSize(SIZE, SIZE, N_TRAIN, 1, N_TEST)
    scene = builtin.render_scene("bench-eval", seed=0, workers=os.cpu_count() or 1)

    def pixels(image: np.ndarray) -> np.ndarray:
        return image

    records = [
        ImageRecord(name, split, scene.camera, scene.c2w[i], float(scene.near[i]), float(scene.far[i]),
                    f"builtin://bench-eval/{name}", functools.partial(pixels, scene.images[i]))
        for i, (name, split) in enumerate(zip(scene.names, scene.splits, strict=True))
    ]  # fmt: skip
    bounds = (tuple(scene.bounds[0].tolist()), tuple(scene.bounds[1].tolist()))
    scene_info = SceneInfo(world_frame="builtin scene, z up", bounds=bounds)
    write_store(path, records, scene=scene_info, backend="zarr")
    return path


def prepare(work: Path, sampler: str, steps: int) -> None:
    """Train the model the measurements render (``work/model-SAMPLER.pt``): ``steps`` steps, so that the
    model does not depend on the machine's load."""
    import torch

    from raykit.trainer import TrainConfig, train
    from raykit.trainer.checkpoint import latest_checkpoint, load_checkpoint

    store = _store(work)
    run = work / f"run-{sampler}"
    shutil.rmtree(run, ignore_errors=True)
    config = TrainConfig(store=str(store), out=str(run), sampler=sampler, steps=steps,
                         eval_splits="val", ckpt_every=1_000_000)  # fmt: skip
    train(config)
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None
    meta, tensors = load_checkpoint(checkpoint)
    model_config = {k: meta.config[k] for k in MODEL_KEYS}
    torch.save({"config": model_config, "tensors": tensors, "step": meta.step}, work / f"model-{sampler}.pt")
    print(f"model-{sampler}.pt: step {meta.step}")


def measure(
    work: Path, sampler: str, images: int | None, threads: int | None, first: int = 0
) -> dict[str, Any]:
    """Render test views ``first`` .. ``first + images - 1`` with the raykit on ``sys.path``; rays/s, PSNR."""
    import numpy as np
    import torch

    if threads:
        torch.set_num_threads(threads)

    from raykit.store import open_store
    from raykit.trainer import TrainConfig
    from raykit.trainer.evaluate import models_from_state, render_image

    saved = torch.load(work / f"model-{sampler}.pt", weights_only=False)
    store = open_store(str(work / "store"))
    config = TrainConfig(store=str(work / "store"), out=str(work / "unused"), **saved["config"])
    device = torch.device("cpu")
    field, grid = models_from_state(config, saved["tensors"], device)
    names = store.images("test")[first : None if images is None else first + images]
    render_image(config, store, names[0], field, grid, device)  # warm-up: first-use allocations
    values, rays = [], 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for name in names:
        pred, target = render_image(config, store, name, field, grid, device)
        mse = float(((pred.double() - target.double()) ** 2).mean())  # the float PSNR these figures were
        values.append(-10.0 * math.log10(mse))
        rays += pred.shape[0] * pred.shape[1]
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "images": len(names),
        "rays": rays,
        "seconds": seconds,
        "rays_per_s": rays / seconds,
        "cpu_seconds": cpu_seconds,
        "rays_per_cpu_s": rays / cpu_seconds,
        "psnr": float(np.mean(values)),
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],
    }


def ab(work: Path, trees: list[str], sampler: str, block: int, threads: int | None, out: str) -> None:
    """Interleaved A/B: the test views in blocks of ``block``; each block rendered by every checkout in
    turn (the order alternating from block to block), each run in a fresh process. Per checkout: all
    rays over all seconds; per block: the ratio of the last checkout's rays/s to the first's."""
    from machine import command_line, describe, portable, write_report

    results: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    for index, first in enumerate(range(0, N_TEST, block)):
        for tree in trees if index % 2 == 0 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": tree}
            argv = [sys.executable, __file__, "measure", "--work", str(work), "--sampler", sampler,
                    "--images", str(block), "--first", str(first)]  # fmt: skip
            argv += ["--threads", str(threads)] if threads else []
            line = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
            figures = {"first": first, **json.loads(line.strip().splitlines()[-1])}
            results[tree].append(figures)
            print(portable(tree), json.dumps(figures), flush=True)
    summary = {}
    for tree, runs in results.items():
        rays, seconds = sum(r["rays"] for r in runs), sum(r["seconds"] for r in runs)
        cpu_seconds = sum(r.get("cpu_seconds", float("nan")) for r in runs)
        summary[portable(tree)] = {
            "rays_per_s": rays / seconds,
            "seconds_for_the_split": seconds,
            "rays_per_cpu_s": rays / cpu_seconds,
            "cpu_seconds_for_the_split": cpu_seconds,
            "images": sum(r["images"] for r in runs),
            "psnr": sum(r["psnr"] * r["images"] for r in runs) / sum(r["images"] for r in runs),
            "runs": runs,
        }
    ratios = sorted(
        b["rays_per_s"] / a["rays_per_s"] for a, b in zip(results[trees[0]], results[trees[-1]], strict=True)
    )
    base, new = (summary[portable(t)]["rays_per_s"] for t in (trees[0], trees[-1]))
    base_cpu, new_cpu = (summary[portable(t)]["rays_per_cpu_s"] for t in (trees[0], trees[-1]))
    cpu_ratios = sorted(
        b["rays_per_cpu_s"] / a["rays_per_cpu_s"]
        for a, b in zip(results[trees[0]], results[trees[-1]], strict=True)
    )
    loads = [r["load_average_1min"] for runs in results.values() for r in runs]
    report = {
        "benchmark": "eval_ab",
        "scene": f"built-in scene {SIZE}x{SIZE}, {N_TEST} test views, model trained {sampler}",
        "sampler": sampler,
        "machine": describe(),
        "command": command_line(),
        "speedup_last_over_first": new / base,
        "speedup_per_block": ratios,
        "speedup_median_block": ratios[len(ratios) // 2],
        "cpu_speedup_last_over_first": new_cpu / base_cpu,
        "cpu_speedup_per_block": cpu_ratios,
        "cpu_speedup_median_block": cpu_ratios[len(cpu_ratios) // 2],
        "load_average_1min_range": [min(loads), max(loads)],
        "results": summary,
    }
    write_report(out, report)
    print(f"speed-up {new / base:.2f}x (blocks: median {ratios[len(ratios) // 2]:.2f}x); in CPU time "
          f"{new_cpu / base_cpu:.2f}x (blocks: median {cpu_ratios[len(cpu_ratios) // 2]:.2f}x); "
          f"load {min(loads):.1f}-{max(loads):.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("prepare", "measure", "ab"))
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "raykit-bench-eval"))
    parser.add_argument("--sampler", default="occupancy")
    parser.add_argument("--train-steps", type=int, default=2000)
    parser.add_argument("--trees", default=str(ROOT.parent), help="comma-separated checkouts (ab)")
    parser.add_argument("--images", type=int, default=None, help="measure: render N test views")
    parser.add_argument("--first", type=int, default=0, help="measure: the first test view rendered")
    parser.add_argument("--block", type=int, default=20, help="ab: test views per run")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", default=str(ROOT / "results" / "eval_ab.json"))
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.action == "prepare":
        prepare(work, args.sampler, args.train_steps)
    elif args.action == "measure":
        print(json.dumps(measure(work, args.sampler, args.images, args.threads, args.first)))
    else:
        ab(work, args.trees.split(","), args.sampler, args.block, args.threads, args.out)


if __name__ == "__main__":
    main()
