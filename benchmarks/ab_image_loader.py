"""Cached ``ImageLoader`` after its first epoch, interleaved: two checkouts and a per-item PIL ``DataLoader``.

The capture is fox-like (instant-ngp's fox: 50 photos of 1920x1080): ``--n`` photo-like JPEGs of
1920x1080 (quality 90, ``bench_decode.photo``), converted once with ``--layout images`` (split ``all``:
every image in ``train``) under ``benchmarks/data/fox-like-N/``. Each round runs, in turn and each in a
fresh process, ``ImageLoader`` with ``PYTHONPATH`` on checkout A, on checkout B, and the baseline (a
``torch.utils.data.DataLoader`` whose ``__getitem__`` decodes one JPEG with PIL and returns it as float32
in [0, 1], ``bench_images.PhotoDataset``); the order rotates between rounds. Both loaders: batch 1,
``--workers`` worker processes, shuffled, CPU, float32 images; the ImageLoader's cache holds the capture.
Epoch 0 (the cache filling, the workers starting) is not measured; images/s is each later epoch's images
over its time (from its first batch), the median over ``--epochs`` epochs; ``cpu_us`` is the process's CPU
microseconds per image (its own threads; the workers are other processes).

    python benchmarks/ab_image_loader.py ../base . --rounds 3   # benchmarks/results/image_loader_ab_pool.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import command_line, describe, write_report

ROOT = Path(__file__).resolve().parent


def make_capture(n: int) -> tuple[Path, Path]:
    """``n`` photo-like 1080p JPEGs (instant-ngp's fox has 50) and their images-layout store: the
    capture ``bench_node.py`` makes, shared."""
    from bench_node import make_store

    store = make_store(n)
    return store.parent / "capture", store


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One loader, ``1 + args.epochs`` epochs; the measured epochs' images/s and CPU us per image."""
    import torch

    torch.set_num_threads(1)
    if args.child == "raykit":
        import raykit
        from raykit.loaders import ImageLoader

        loader: Any = ImageLoader(args.store, "train", batch_size=1, seed=0, num_workers=args.workers,
                                  cache_bytes=2 << 30)  # fmt: skip
        who = Path(raykit.__file__).resolve().parent.parent.name
    else:
        from bench_images import PhotoDataset

        files = sorted(str(p) for p in (Path(args.capture) / "images").glob("*.jpg"))
        dataset = PhotoDataset(files, False, 1920, 1080)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=1, shuffle=True, num_workers=args.workers, persistent_workers=True,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        who = "pil"
    rates, cpus = [], []
    for epoch in range(1 + args.epochs):
        count, start, cpu = 0, 0.0, 0.0
        for batch in loader:
            images = batch.images if args.child == "raykit" else batch["image"]
            assert images.dtype == torch.float32 and images.shape[-1] == 3
            if count == 0:
                start, cpu = time.perf_counter(), time.process_time()
            count += 1
        if epoch > 0:
            rates.append((count - 1) / (time.perf_counter() - start))
            cpus.append((time.process_time() - cpu) * 1e6 / (count - 1))
    if args.child == "raykit":
        loader.close()
    return {"who": who, "images_per_s": statistics.median(rates), "cpu_us": statistics.median(cpus),
            "epochs_images_per_s": rates, "loadavg_1m": os.getloadavg()[0]}  # fmt: skip


def run(
    kind: str, checkout: str | None, args: argparse.Namespace, capture: Path, store: Path
) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if checkout is not None:
        env["PYTHONPATH"] = str(Path(checkout).resolve())
    argv = [sys.executable, __file__, "--child", kind, "--store", str(store), "--capture", str(capture),
            "--workers", str(args.workers), "--epochs", str(args.epochs)]  # fmt: skip
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{kind} {checkout}: failed\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", nargs="?", help="checkout A (e.g. the base commit)")
    parser.add_argument("b", nargs="?", help="checkout B (e.g. the branch)")
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5, help="measured epochs after the first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "results" / "image_loader_ab_pool.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--capture", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    capture, store = make_capture(args.n)
    cases = [("a", "raykit", args.a), ("b", "raykit", args.b), ("pil", "pil", args.b)]
    rounds = []
    for r in range(args.rounds):
        order = cases[r % 3 :] + cases[: r % 3]
        rounds.append({name: run(kind, checkout, args, capture, store) for name, kind, checkout in order})

    def median(name: str, key: str = "images_per_s") -> float:
        return statistics.median(row[name][key] for row in rounds)

    summary = {
        "a_images_per_s": median("a"),
        "b_images_per_s": median("b"),
        "pil_images_per_s": median("pil"),
        "b_over_a": statistics.median(row["b"]["images_per_s"] / row["a"]["images_per_s"] for row in rounds),
        "b_over_pil": statistics.median(
            row["b"]["images_per_s"] / row["pil"]["images_per_s"] for row in rounds
        ),
        "a_over_pil": statistics.median(
            row["a"]["images_per_s"] / row["pil"]["images_per_s"] for row in rounds
        ),
        "a_cpu_us": median("a", "cpu_us"),
        "b_cpu_us": median("b", "cpu_us"),
    }
    print(json.dumps(summary, indent=1))
    report = {"command": command_line(), "machine": describe(1), "n": args.n, "workers": args.workers,
              "epochs": args.epochs, "summary": summary, "rounds": rounds}  # fmt: skip
    write_report(args.out, report)


if __name__ == "__main__":
    main()
