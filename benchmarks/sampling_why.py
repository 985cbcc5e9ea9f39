"""Where a trained run's error is, and what loss-driven sampling could buy there (issue 57).

Reads a store and one or more run folders of ``raykit train`` (their ``renders/test`` images) and
reports, per run, over the test views:

* ``noise_psnr_ceiling``: the PSNR a noise-free render would score against these noisy photos, from
  Immerkaer's (1996) noise estimate (the absolute response to a 3x3 Laplacian-difference kernel; it
  also counts fine texture, so the ceiling is a lower bound);
* ``share_of_se_top10`` / ``top1``: the share of the squared error in the 10% and 1% worst pixels;
* ``share_of_se_edges``: the share of the squared error on the 20% of pixels with the largest image
  gradient;
* ``is_second_moment``: the second moment of an importance-sampled gradient estimate against
  uniform's, for a per-pixel gradient proportional to the residual, with instant-ngp's error map (the
  squared error averaged over ``--cell`` x ``--cell`` pixels, mixed half and half with uniform, the
  loader's default floor). 1.0 means nothing to gain; 0.5 would be worth twice the batch.

    python benchmarks/sampling_why.py --store STORE --runs RUN_UNIFORM RUN_LOSS

Results: ``benchmarks/results/sampling_why.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from machine import command_line, describe, write_report
from PIL import Image

ROOT = Path(__file__).resolve().parent
LAPLACE_DIFF = np.array([[1, -2, 1], [-2, 4, -2], [1, -2, 1]], dtype=np.float64)


def noise_sigma(image: np.ndarray) -> float:
    """Immerkaer's noise estimate of ``image`` (H, W, C) in its own units, averaged over channels."""
    h, w = image.shape[:2]
    response = np.zeros((h - 2, w - 2, image.shape[2]))
    for dy in range(3):
        for dx in range(3):
            response += LAPLACE_DIFF[dy, dx] * image[dy : dy + h - 2, dx : dx + w - 2]
    return float(np.sqrt(np.pi / 2) * np.abs(response).mean() / 6)


def view_figures(truth: np.ndarray, render: np.ndarray, cell: int, floor: float) -> dict[str, float]:
    """The figures of one view: ``truth`` and ``render`` (H, W, 3) floats in [0, 1]."""
    se = ((render - truth) ** 2).mean(-1)
    h, w = (se.shape[0] // cell) * cell, (se.shape[1] // cell) * cell
    se, residual = se[:h, :w], np.sqrt(se[:h, :w])
    cells = se.reshape(h // cell, cell, w // cell, cell).mean((1, 3))
    drawn = np.repeat(np.repeat(cells, cell, 0), cell, 1)
    prob = floor / drawn.size + (1 - floor) * drawn / drawn.sum()
    grey = truth[:h, :w].mean(-1)
    gradient = np.zeros_like(grey)
    gradient[:-1] += np.abs(np.diff(grey, axis=0))
    gradient[:, :-1] += np.abs(np.diff(grey, axis=1))
    worst = np.sort(se.ravel())[::-1]
    return {
        "se": float(se.mean()),
        "share_of_se_top10": float(worst[: worst.size // 10].sum() / worst.sum()),
        "share_of_se_top1": float(worst[: worst.size // 100].sum() / worst.sum()),
        "share_of_se_edges": float(se[gradient > np.quantile(gradient, 0.8)].sum() / se.sum()),
        "is_second_moment": float((residual**2 / (prob * drawn.size)).mean() / (residual**2).mean()),
    }


def run_figures(store: Any, run: Path, cell: int, floor: float) -> dict[str, Any]:
    views = []
    for name in store.images("test"):
        truth = store.read_image(name)[..., :3].astype(np.float64) / 255
        stem = Path(name).stem
        (path,) = sorted((run / "renders" / "test").glob(f"*_{stem}.png"))
        render = np.asarray(Image.open(path))[..., :3].astype(np.float64) / 255
        views.append(view_figures(truth, render, cell, floor))
    out = {key: float(np.mean([v[key] for v in views])) for key in views[0] if key != "se"}
    out["psnr_of_mean_se"] = float(-10 * np.log10(np.mean([v["se"] for v in views])))
    return {"run": run.name, "views": len(views), **out}


def main() -> None:
    from raykit.store import open_store

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--cell", type=int, default=8, help="the error map's cell, in pixels")
    parser.add_argument("--floor", type=float, default=0.5, help="the uniform share of each batch")
    parser.add_argument("--out", default=str(ROOT / "results" / "sampling_why.json"))
    args = parser.parse_args()
    store = open_store(args.store)
    sigmas = [noise_sigma(store.read_image(n)[..., :3].astype(np.float64)) for n in store.images("test")]
    ceiling = float(np.mean([-20 * np.log10(s / 255) for s in sigmas]))
    runs = [run_figures(store, Path(r), args.cell, args.floor) for r in args.runs]
    report = {"command": command_line(), "machine": describe(), "store": Path(args.store).name,
              "noise_sigma_8bit": float(np.mean(sigmas)), "noise_psnr_ceiling": ceiling,
              "cell": args.cell, "floor": args.floor, "runs": runs}  # fmt: skip
    for run in runs:
        print(run)
    print(f"noise ceiling {ceiling:.2f} dB (sigma {np.mean(sigmas):.1f} of 255)")
    write_report(args.out, report)


if __name__ == "__main__":
    main()
