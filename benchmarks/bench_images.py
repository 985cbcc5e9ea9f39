"""Whole-image loading benchmark (issue 18): raykit's ImageLoader against the splatting-repository pattern.

Capture (generated here, once, under ``benchmarks/data/images-capture/``): ``--n`` photo-like JPEGs
(quality 90) of ``--width`` x ``--height`` (default 100 of 1280x800, 1.02 MP): a smooth random colour
field with hard-edged shapes and Gaussian noise, so that they decode like photographs. One OPENCV
camera with real radial/tangential distortion. The capture is written to two ray stores: ``ordered``
(every image in one image-ordered split, read per image through ``RayStore.read_image``; the images
layout of issue 15, not on main yet, is to read like it) and ``shuffled`` (every image in a shuffled
train split, which raykit fills its cache from in one pass over the split).

Cases (each in its own subprocess, so that its peak RSS is its own; batch 1, ``--workers`` worker
processes for both loaders, CPU, images as (H, W, 3) float32 in [0, 1]):

* ``fits``: ``cache_bytes`` holds the capture: images/s in epochs after the first, time to first
  batch from a closed store;
* ``quarter``: ``cache_bytes`` a quarter of the decoded capture (the capture 4x the cache): images/s
  over whole epochs, peak RSS of the loading process (and of its workers);
* ``undistort``: ``undistort=True`` with the cache holding the capture, against the baseline
  decoding and ``cv2.remap``-ing every image at every step (maps from ``cv2.initUndistortRectifyMap``
  computed once, as trainers that undistort on the fly do); also ``undistort`` with the quarter cache;
* ``shuffled``: the ``fits`` case on the shuffled train split (its first batch pays the one pass).

Baseline: a ``torch.utils.data.Dataset`` whose ``__getitem__`` opens and decodes one JPEG with PIL and
returns it as a float tensor with its K and pose, in a ``DataLoader`` (batch 1, shuffled by a seeded
generator, ``num_workers`` the same, ``persistent_workers``), the pattern of common splatting
repositories. Both loaders' worker start-up is excluded from images/s (measured from the second batch
of an epoch after the first); time to first batch includes it.

    python benchmarks/bench_images.py                       # everything, ~10 minutes on 2 busy cores
    python benchmarks/bench_images.py --n 100 --epochs 3 --out out/images.json

Results go to ``benchmarks/results/images.json``; the machine's load average is recorded beside them.
``python benchmarks/bench_images.py --markdown benchmarks/results/images.json`` prints the
BENCHMARKS.md section.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from machine import command_line, describe, write_report

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data"
PARAMS = (1100.0, 1102.0, 640.5, 400.5, -0.12, 0.035, 0.0008, -0.0006)  # OPENCV fx fy cx cy k1 k2 p1 p2
MB = 1 << 20


# ---- the capture -----------------------------------------------------------------------------------
def photo(seed: int, height: int, width: int) -> np.ndarray:
    """(H, W, 3) uint8 photo-like image: smooth colour field, hard-edged shapes, sensor-like noise."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    coarse = rng.uniform(30, 225, (9, 14, 3)).astype(np.uint8)
    base = Image.fromarray(coarse).resize((width, height), Image.BICUBIC)
    draw = ImageDraw.Draw(base)
    for _ in range(25):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = x0 + int(rng.integers(20, width // 4)), y0 + int(rng.integers(20, height // 4))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    noisy = np.asarray(base, dtype=np.int16) + rng.normal(0, 6, (height, width, 3)).astype(np.int16)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def decode_jpeg(path: str) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def build_capture(n: int, width: int, height: int) -> Path:
    folder = DATA / f"images-capture-{n}-{width}x{height}"
    done = folder / "done.json"
    if done.exists():
        return folder
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(photo(i, height, width)).save(folder / f"img_{i:04d}.jpg", quality=90)
    done.write_text(json.dumps({"n": n}))
    return folder


def pose(i: int, n: int) -> np.ndarray:
    """(4, 4) OpenCV camera-to-world on a circle of radius 4, looking at the origin."""
    angle = 2 * np.pi * i / n
    centre = np.array([4 * np.cos(angle), 4 * np.sin(angle), 1.0])
    forward = -centre / np.linalg.norm(centre)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, np.cross(forward, right), forward, centre
    return c2w


def build_store(capture: Path, kind: str, width: int, height: int) -> tuple[Path, float]:
    """The ray store of ``capture`` (``ordered``: split ``test``; ``shuffled``: split ``train``)."""
    from raykit.cameras import Camera
    from raykit.store import ImageRecord, SceneInfo, open_store, write_store

    dst = capture.parent / f"{capture.name}-{kind}.zarr"
    if (dst / "manifest.json").exists():
        return dst, float(json.loads((dst.parent / f"{dst.name}.time").read_text()))
    camera = Camera("OPENCV", width, height, PARAMS)
    files = sorted(capture.glob("*.jpg"))
    split = "test" if kind == "ordered" else "train"
    records = [
        ImageRecord(f.name, split, camera, pose(i, len(files)), 0.5, 10.0, str(f),
                    functools.partial(decode_jpeg, str(f)))
        for i, f in enumerate(files)
    ]  # fmt: skip
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        write_store(dst, records, scene=SceneInfo(), executor=pool, memory_staging_bytes=0)
    seconds = time.perf_counter() - t0
    (dst.parent / f"{dst.name}.time").write_text(str(seconds))
    open_store(dst)
    return dst, seconds


# ---- the loaders (run inside one subprocess per case) -------------------------------------------------
class PhotoDataset:
    """The baseline: one JPEG decoded per ``__getitem__`` (PIL), optionally ``cv2.remap``-undistorted."""

    def __init__(self, files: list[str], undistort: bool, width: int, height: int) -> None:
        self.files, self.undistort = files, undistort
        fx, fy, cx, cy, k1, k2, p1, p2 = PARAMS
        # OpenCV pixel centres are integers: COLMAP's cx - 0.5.
        self.K = np.array([[fx, 0, cx - 0.5], [0, fy, cy - 0.5], [0, 0, 1]])
        self.dist = np.array([k1, k2, p1, p2])
        self.maps: Any = None
        self.size = (width, height)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        image = decode_jpeg(self.files[i])
        if self.undistort:
            import cv2

            if self.maps is None:  # once per worker
                self.maps = cv2.initUndistortRectifyMap(
                    self.K, self.dist, None, self.K, self.size, cv2.CV_32FC1
                )
            image = cv2.remap(image, self.maps[0], self.maps[1], cv2.INTER_LINEAR)
        tensor = torch.from_numpy(np.ascontiguousarray(image)).float().div_(255.0)
        c2w = torch.from_numpy(pose(i, len(self.files)))
        return {"image": tensor, "K": torch.from_numpy(self.K), "c2w": c2w}


def _baseline(args: argparse.Namespace) -> Any:
    import torch

    files = sorted(str(p) for p in Path(args.capture).glob("*.jpg"))
    dataset = PhotoDataset(files, args.undistort, args.width, args.height)
    generator = torch.Generator().manual_seed(0)
    return torch.utils.data.DataLoader(
        dataset, batch_size=1, shuffle=True, num_workers=args.workers, generator=generator,
        persistent_workers=args.workers > 0,
    )  # fmt: skip


def _raykit(args: argparse.Namespace) -> Any:
    from raykit.loaders import ImageLoader

    split = "test" if args.store.endswith("ordered.zarr") else "train"
    return ImageLoader(args.store, split, batch_size=1, seed=0, num_workers=args.workers,
                       cache_bytes=args.cache_bytes, undistort=args.undistort)  # fmt: skip


def _rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


def run_case(args: argparse.Namespace) -> dict[str, Any]:
    """One loader, ``args.epochs`` epochs; images/s per epoch (from its second batch), first batch s."""
    import torch

    torch.set_num_threads(1)
    rss_before = _current_rss_mb()
    t0 = time.perf_counter()
    loader = _raykit(args) if args.loader == "raykit" else _baseline(args)
    epochs, first = [], None
    for _ in range(args.epochs):
        count, start = 0, time.perf_counter()
        for batch in loader:
            images = batch.images if args.loader == "raykit" else batch["image"]
            assert images.shape[-1] == 3 and images.dtype == torch.float32
            if first is None:
                first = time.perf_counter() - t0
            if count == 0:
                start = time.perf_counter()
            count += 1
        epochs.append((count - 1) / (time.perf_counter() - start))
    result: dict[str, Any] = {"images_per_s": epochs, "first_batch_s": first, "rss_before_mb": rss_before,
                              "peak_rss_mb": _rss_mb()}  # fmt: skip
    if args.loader == "raykit":
        result["cache"] = loader.cache_stats().to_dict()
        loader.close()
    else:
        del loader
    result["workers_peak_rss_mb"] = _rss_mb(resource.RUSAGE_CHILDREN)
    return result


def _subprocess(**options: Any) -> dict[str, Any]:
    argv = [sys.executable, __file__]
    for key, value in options.items():
        if value is True:
            argv.append(f"--{key.replace('_', '-')}")
        elif value is not False and value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"case {options} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["loadavg_1m"] = os.getloadavg()[0]
    shown = {k: v for k, v in options.items() if k not in ("capture", "store")}
    print(json.dumps({**shown, **result}), flush=True)
    return result


_ROWS = (
    ("baseline", "baseline: PIL decode per `__getitem__`, DataLoader"),
    ("raykit_fits", "ImageLoader, capture fits in `cache_bytes`"),
    ("raykit_quarter", "ImageLoader, capture 4x `cache_bytes`"),
    ("baseline_undistort", "baseline + `cv2.remap` per step"),
    ("raykit_undistort_fits", "ImageLoader `undistort=True`, fits"),
    ("raykit_undistort_quarter", "ImageLoader `undistort=True`, 4x the cache"),
    ("raykit_shuffled_fits", "ImageLoader, fits, shuffled train split (one-pass fill)"),
)


def markdown(report: dict[str, Any]) -> str:
    """The BENCHMARKS.md section of a report (``--markdown RESULTS.json``)."""
    cases, cap = report["cases"], report["capture"]

    def steady(name: str) -> float:
        rates = cases[name]["images_per_s"]
        return float(np.mean(rates[1:])) if len(rates) > 1 else float(rates[0])

    lines = [
        "## Issue 18: ImageLoader",
        f"Command: `{report['command']}`",
        "",
        f"Capture: {cap['n']} photo-like JPEGs of {cap['width']}x{cap['height']} "
        f"({cap['width'] * cap['height'] / 1e6:.2f} MP, {cap['jpeg_bytes'] / MB:.0f} MB of JPEG, "
        f"{cap['decoded_bytes'] / MB:.0f} MB decoded), one OPENCV camera; batch 1, "
        f"{report['cases']['baseline'].get('workers', 2)} workers for both loaders, CPU, float32 images. "
        f"Load average (1, 5, 15 min) at start {[round(x, 1) for x in report['loadavg_start']]}, at end "
        f"{[round(x, 1) for x in report['loadavg_end']]}: the 2 cores were shared with other work, so "
        "figures are noisy; each case records its own 1-minute load.",
        "",
        "| case | images/s epoch 0 | images/s later epochs | first batch s | peak RSS MB (largest worker) | "
        "cache hit rate | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in _ROWS:
        if name not in cases:
            continue
        c = cases[name]
        hit = c.get("cache", {}).get("hit_rate")
        lines.append(
            f"| {label} | {c['images_per_s'][0]:.1f} | {steady(name):.1f} | {c['first_batch_s']:.2f} | "
            f"{c['peak_rss_mb']:.0f} ({c['workers_peak_rss_mb']:.0f}) | "
            f"{'-' if hit is None else f'{hit:.2f}'} | {c['loadavg_1m']:.1f} |"
        )
    base, und = steady("baseline"), steady("baseline_undistort")
    budget, q = report["cache_bytes"]["quarter"] / MB, cases["raykit_quarter"]
    fits, quarter = steady("raykit_fits") / base, steady("raykit_quarter") / base
    und_fits, und_quarter = steady("raykit_undistort_fits") / und, steady("raykit_undistort_quarter") / und
    lines += [
        "",
        f"- fits in the cache: **{fits:.1f}x** the baseline's images/s after the first epoch (target >= 3x).",
        f"- capture 4x the cache ({budget:.0f} MB budget): **{quarter:.2f}x** the baseline (target >= 1x); "
        f"peak RSS of the loading process {q['peak_rss_mb']:.0f} MB = budget + "
        f"{q['peak_rss_mb'] - budget:.0f} MB (target <= +400 MB; {q['rss_before_mb']:.0f} MB of it is "
        "Python + torch before the loader exists). The largest worker process (each imports torch) "
        "is in brackets.",
        f"- `undistort=True`, fits: **{und_fits:.1f}x** the cv2.remap baseline (undistorted once, "
        f"cached); 4x the cache: {und_quarter:.2f}x (every miss is read and remapped again; raykit's "
        "remap is numpy, 4 gathers per pixel, slower than OpenCV's SIMD remap).",
        f"- conversion of the ordered store: {report['stores']['ordered_write_s']:.0f} s.",
    ]
    if "raykit_shuffled_fits" in cases:
        first = cases["raykit_shuffled_fits"]["first_batch_s"]
        lines.append(
            f"- shuffled train split: conversion {report['stores']['shuffled_write_s']:.0f} s; the first "
            f"batch waits for the one pass over the split that fills the cache ({first:.0f} s)."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--skip-shuffled", action="store_true", help="skip the shuffled-split case")
    parser.add_argument("--out", default=str(ROOT / "results" / "images.json"))
    parser.add_argument("--markdown", metavar="RESULTS", help="print the BENCHMARKS.md section of a report")
    # internal: one case in this process
    parser.add_argument("--case", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loader", default="raykit", help=argparse.SUPPRESS)
    parser.add_argument("--capture", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--cache-bytes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--undistort", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args)))
        return
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return
    load_start = os.getloadavg()
    capture = build_capture(args.n, args.width, args.height)
    ordered, ordered_s = build_store(capture, "ordered", args.width, args.height)
    decoded = args.n * args.width * args.height * 3
    common = {"workers": args.workers, "epochs": args.epochs, "width": args.width, "height": args.height}
    fits, quarter = decoded + 64 * MB, decoded // 4
    cases: dict[str, Any] = {}
    for name, loader, store, cache, undistort in (
        ("baseline", "baseline", None, 0, False),
        ("raykit_fits", "raykit", ordered, fits, False),
        ("raykit_quarter", "raykit", ordered, quarter, False),
        ("baseline_undistort", "baseline", None, 0, True),
        ("raykit_undistort_fits", "raykit", ordered, fits, True),
        ("raykit_undistort_quarter", "raykit", ordered, quarter, True),
    ):
        cases[name] = _subprocess(case=True, loader=loader, capture=capture, store=store, cache_bytes=cache,
                                  undistort=undistort, **common)  # fmt: skip
    shuffled_s = None
    if not args.skip_shuffled:
        shuffled, shuffled_s = build_store(capture, "shuffled", args.width, args.height)
        cases["raykit_shuffled_fits"] = _subprocess(
            case=True, loader="raykit", store=shuffled, cache_bytes=fits, **common
        )
    jpeg_bytes = sum(p.stat().st_size for p in capture.glob("*.jpg"))
    report = {
        "command": command_line(),
        "machine": describe(1),
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
        "capture": {
            "n": args.n,
            "width": args.width,
            "height": args.height,
            "jpeg_bytes": jpeg_bytes,
            "decoded_bytes": decoded,
            "camera": ["OPENCV", list(PARAMS)],
        },
        "stores": {"ordered_write_s": ordered_s, "shuffled_write_s": shuffled_s},
        "cache_bytes": {"fits": fits, "quarter": quarter},
        "cases": cases,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
