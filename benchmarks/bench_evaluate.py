"""``raykit evaluate`` throughput: image pairs/s of PSNR + SSIM (the community protocol) over 800x800 PNGs.

Generates ``--pairs`` pairs of photo-like 800x800 RGB PNGs (ground truth, and a prediction that is the
ground truth blurred with noise added) under ``benchmarks/data/evaluate-N/`` once, then runs
``raykit.evaluation.evaluate`` (``--no-lpips``, ``--threads`` reader threads) ``--rounds`` times on them,
each round in this process with torch limited to ``--torch-threads``. Reported: pairs/s per round (wall
clock from the call to the results file written: reading, hashing, decoding, metrics, JSON) and
whether every round's ``results.json`` has the same bytes. The machine's 1-minute load average is
recorded before and after: other work on the machine lowers the figure.

    python benchmarks/bench_evaluate.py                      # 200 pairs, 3 rounds; about 1 minute
    python benchmarks/bench_evaluate.py --pairs 50 --rounds 1

Results: ``benchmarks/results/evaluate.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))  # this checkout's raykit, wherever the script is started from

from machine import command_line, describe, write_report  # noqa: E402


def photo(size: int, seed: int) -> np.ndarray:
    """Photo-like (size, size, 3) uint8: gradients, a sinusoidal texture and sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    texture = 0.5 + 0.5 * np.sin(x / (9.0 + seed % 5)) * np.cos(y / 7.0)
    base = np.stack([x / size, y / size, texture], axis=-1) * 190 + 20
    return np.clip(base + rng.normal(0, 8, (size, size, 3)), 0, 255).astype(np.uint8)


def make_pairs(folder: Path, pairs: int, size: int) -> tuple[Path, Path]:
    """``folder/gt/view_NNNN.png`` and ``folder/pred/view_NNNN.png``, written once."""
    from PIL import Image, ImageFilter

    gt, pred = folder / "gt", folder / "pred"
    if len(list(pred.glob("*.png"))) == pairs and len(list(gt.glob("*.png"))) == pairs:
        return pred, gt
    for sub in (gt, pred):
        sub.mkdir(parents=True, exist_ok=True)
    for i in range(pairs):
        image = photo(size, i)
        Image.fromarray(image).save(gt / f"view_{i:04d}.png")
        blurred = np.asarray(Image.fromarray(image).filter(ImageFilter.GaussianBlur(1.0)), dtype=np.int16)
        noisy = blurred + np.random.default_rng(10_000 + i).integers(-6, 7, blurred.shape)
        Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(pred / f"view_{i:04d}.png")
    return pred, gt


def run_round(pred: Path, gt: Path, out: Path, threads: int) -> dict[str, Any]:
    from raykit.evaluation import EvaluateConfig, evaluate

    config = EvaluateConfig(pred=str(pred), gt=str(gt), output=str(out), lpips=False, threads=threads)
    start, cpu = time.perf_counter(), time.process_time()
    results = evaluate(config)
    wall = time.perf_counter() - start
    return {
        "seconds": wall,
        "cpu_seconds": time.process_time() - cpu,
        "pairs_per_s": results["n_images"] / wall,
        "means": results["means"],
        "sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--size", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="raykit evaluate --threads")
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "results" / "evaluate.json"))
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.torch_threads)
    pred, gt = make_pairs(ROOT / "data" / f"evaluate-{args.pairs}-{args.size}", args.pairs, args.size)
    load_before = os.getloadavg()[0]
    rounds = [
        run_round(pred, gt, pred.parent / f"results-{i}.json", args.threads) for i in range(args.rounds)
    ]
    rates = [r["pairs_per_s"] for r in rounds]
    report = {
        "command": command_line(),
        "machine": describe(args.torch_threads),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": os.getloadavg()[0],
        "pairs": args.pairs,
        "size": args.size,
        "metrics": ["psnr", "ssim"],
        "rounds": rounds,
        "pairs_per_s_median": float(np.median(rates)),
        "pairs_per_s_best": max(rates),
        "same_bytes_every_round": len({r["sha256"] for r in rounds}) == 1,
        "target_pairs_per_s": 20,
    }
    write_report(args.out, report)
    print(f"{args.pairs} pairs of {args.size}x{args.size}: {', '.join(f'{r:.1f}' for r in rates)} pairs/s "
          f"(load {load_before:.1f} -> {report['loadavg_1m_after']:.1f}); same bytes: "
          f"{report['same_bytes_every_round']}")  # fmt: skip


if __name__ == "__main__":
    main()
