"""Stored-image decoding: Pillow against ``raykit.imagedecode``'s fast path (simplejpeg, OpenCV).

Two parts, both checking that the pixels are identical:

* **per image**: median ms of ``reference_decode_image`` (Pillow) and ``decode_image`` over ``--reps``
  decodes of a 1920x1080 photo-like JPEG (quality 90, 4:2:0: gradients, a texture and noise), an
  800x800 RGBA PNG and an 800x800 WebP lossless (RGB, as ``raykit.store`` re-encodes);
* **loader**: images/s of ``raykit.loaders.ImageLoader`` over an images-layout store converted with
  ``raykit.converters.convert`` from a generated capture of ``--n`` such 1080p JPEGs (a nerfstudio-style
  ``transforms.json``, under ``benchmarks/data/decode-capture-N/``), ``cache_bytes=0`` so that every
  batch decodes, batch 1, ``--workers`` workers, float32 images on the CPU; with
  ``RAYKIT_IMAGE_DECODE=pillow`` (before) and without (after), and the per-item PIL ``DataLoader``
  baseline of ``benchmarks/bench_images.py`` beside them. Each case runs in a fresh process (the
  environment variable reaches the loader's worker processes), ``--rounds`` times, interleaved; the
  rate is taken from the second batch of each epoch (worker start-up excluded).

    python benchmarks/bench_decode.py            # about 2 minutes on 2 cores
    python benchmarks/bench_decode.py --n 24 --rounds 3 --epochs 2

Results: ``benchmarks/results/decode.json`` (with the machine's load average).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_images import pose

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))  # this checkout's raykit, wherever the script is started from


def photo(h: int, w: int, seed: int = 0, channels: int = 3) -> np.ndarray:
    """Photo-like (H, W, C) uint8: colour gradients, a sinusoidal texture and sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    texture = 0.5 + 0.5 * np.sin(x / (9.0 + seed % 5)) * np.cos(y / 7.0)
    base = np.stack([x / w, y / h, texture], axis=-1) * 190 + 20
    pixels = np.clip(base + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)
    if channels == 4:
        alpha = np.clip(255 * (x / w) + rng.normal(0, 20, (h, w)), 0, 255).astype(np.uint8)
        pixels = np.concatenate([pixels, alpha[..., None]], axis=-1)
    return pixels


def encoded(pixels: np.ndarray, fmt: str, **kw: Any) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **kw)
    return out.getvalue()


def per_image(reps: int) -> dict[str, Any]:
    from raykit.imagedecode import _fast, decode_image, reference_decode_image

    images = {
        "jpeg_1920x1080_q90": encoded(photo(1080, 1920), "JPEG", quality=90),
        "png_800x800_rgba": encoded(photo(800, 800, 1, 4), "PNG"),
        "webp_lossless_800x800_rgb": encoded(photo(800, 800, 2), "WEBP", lossless=True, quality=0, method=0,
                                             exact=True),
    }  # fmt: skip
    out: dict[str, Any] = {}
    for name, data in images.items():
        assert _fast(data) is not None, f"{name}: the fast path is not taken (decoder not installed?)"
        assert np.array_equal(decode_image(data), reference_decode_image(data)), name
        times: dict[str, list[float]] = {"pillow": [], "fast": []}
        for _ in range(reps):  # interleaved, so that a load spike hits both
            for key, fn in (("pillow", reference_decode_image), ("fast", decode_image)):
                t0 = time.perf_counter()
                fn(data)
                times[key].append((time.perf_counter() - t0) * 1e3)
        pil, fast = statistics.median(times["pillow"]), statistics.median(times["fast"])
        out[name] = {"bytes": len(data), "pillow_ms": round(pil, 3), "fast_ms": round(fast, 3),
                     "speedup": round(pil / fast, 2), "identical": True}  # fmt: skip
        print(f"{name}: Pillow {pil:.2f} ms, fast {fast:.2f} ms ({pil / fast:.1f}x)", flush=True)
    return out


# ---- the loader part ---------------------------------------------------------------------------------
def build_store(n: int) -> Path:
    """``n`` 1080p JPEGs with a transforms.json, converted to an images-layout store (once)."""
    folder = ROOT / "data" / f"decode-capture-{n}"
    store = folder / "images.zarr"
    if (store / "manifest.json").exists():
        return store
    from raykit.conventions import opencv_to_opengl_c2w
    from raykit.converters import convert

    (folder / "images").mkdir(parents=True, exist_ok=True)
    frames = []
    for i in range(n):
        jpeg = encoded(photo(1080, 1920, i), "JPEG", quality=90)
        (folder / "images" / f"frame_{i:04d}.jpg").write_bytes(jpeg)
        gl = opencv_to_opengl_c2w(pose(i, n)).tolist()
        frames.append({"file_path": f"images/frame_{i:04d}.jpg", "transform_matrix": gl})
    meta = {"camera_model": "OPENCV", "fl_x": 1500.0, "fl_y": 1500.0, "cx": 960.0, "cy": 540.0,
            "w": 1920, "h": 1080, "k1": 0.0, "k2": 0.0, "p1": 0.0, "p2": 0.0}  # fmt: skip
    (folder / "transforms.json").write_text(json.dumps({**meta, "frames": frames}, indent=1))
    convert(folder, store, layout="images", split="all")
    return store


def run_case(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    if args.case == "baseline":
        from PIL import Image

        files = sorted(str(p) for p in (Path(args.store).parent / "images").glob("*.jpg"))

        class PhotoDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
            def __len__(self) -> int:
                return len(files)

            def __getitem__(self, i: int) -> torch.Tensor:
                with Image.open(files[i]) as image:
                    return torch.from_numpy(np.asarray(image.convert("RGB")).copy()).float().div_(255.0)

        generator = torch.Generator().manual_seed(0)
        loader: Any = torch.utils.data.DataLoader(
            PhotoDataset(), batch_size=1, shuffle=True, generator=generator, num_workers=args.workers,
            persistent_workers=args.workers > 0,
        )  # fmt: skip
    else:
        from raykit.loaders import ImageLoader

        loader = ImageLoader(args.store, args.split, batch_size=1, seed=0, num_workers=args.workers,
                             cache_bytes=0)  # fmt: skip
    rates = []
    for _ in range(args.epochs):
        count, start = 0, time.perf_counter()
        for batch in loader:
            images = batch if args.case == "baseline" else batch.images
            assert images.shape[-1] == 3 and images.dtype == torch.float32
            if count == 0:
                start = time.perf_counter()
            count += 1
        rates.append((count - 1) / (time.perf_counter() - start))
    if args.case != "baseline":
        loader.close()
    return {"images_per_s": rates}


def loader_part(args: argparse.Namespace) -> dict[str, Any]:
    store = build_store(args.n)
    from raykit.store import open_store

    split = "all" if "all" in open_store(store).splits else sorted(open_store(store).splits)[0]
    cases: dict[str, list[float]] = {"baseline": [], "pillow": [], "fast": []}
    for r in range(args.rounds):
        for case in cases:
            env = dict(os.environ)
            env.pop("RAYKIT_IMAGE_DECODE", None)
            if case == "pillow":
                env["RAYKIT_IMAGE_DECODE"] = "pillow"
            argv = [sys.executable, __file__, "--case", case, "--store", str(store), "--split", split,
                    "--workers", str(args.workers), "--epochs", str(args.epochs)]  # fmt: skip
            out = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"{case} failed:\n{out.stderr[-3000:]}")
            rates = json.loads(out.stdout.strip().splitlines()[-1])["images_per_s"]
            steady = statistics.mean(rates[1:]) if len(rates) > 1 else rates[0]
            cases[case].append(round(steady, 2))
            print(f"round {r}: {case}: {steady:.2f} images/s (epochs {[round(x, 1) for x in rates]}), "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    med = {case: statistics.median(v) for case, v in cases.items()}
    return {
        "store": str(store.relative_to(ROOT.parent)),
        "images": args.n,
        "split": split,
        "workers": args.workers,
        "epochs": args.epochs,
        "cache_bytes": 0,
        "images_per_s": cases,
        "median_images_per_s": med,
        "fast_over_pillow": round(med["fast"] / med["pillow"], 2),
        "fast_over_baseline": round(med["fast"] / med["baseline"], 2),
        "pillow_over_baseline": round(med["pillow"] / med["baseline"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--n", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-loader", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "results" / "decode.json"))
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--split", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args)))
        return
    import simplejpeg

    try:
        import cv2

        cv2_version = cv2.__version__
    except ImportError:
        cv2_version = None
    from PIL import __version__ as pil_version

    report: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/bench_decode.py", *sys.argv[1:]]),
        "loadavg_start": os.getloadavg(),
        "versions": {"pillow": pil_version, "simplejpeg": simplejpeg.__version__, "opencv": cv2_version},
        "per_image": per_image(args.reps),
    }
    if not args.skip_loader:
        report["loader"] = loader_part(args)
    report["loadavg_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(Path(args.out))


if __name__ == "__main__":
    main()
