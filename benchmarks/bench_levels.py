"""Resolution levels: a 1080p JPEG served at 1/2, 1/4, 1/8 by ``raykit.imagedecode.decode_image_scaled``
(libjpeg-turbo's DCT-domain scaling) against decoding at full size and resizing.

Per level ``k``, median ms over ``--reps`` (interleaved, after a warm-up) of:

* ``levels``: ``decode_image_scaled(data, k)``, what ``ImageLoader(downscale=k)`` decodes with;
* ``full+area``: ``decode_image(data)`` (the same fast full decode) then ``downscale_area`` (the rule of
  ``raykit convert --downscale``, numpy);
* ``full+cv2``: ``decode_image(data)`` then OpenCV's ``resize(..., INTER_AREA)`` (the fastest resize
  at hand, a stricter baseline).

The image is ``benchmarks/bench_decode.py``'s 1920x1080 photo-like JPEG (quality 90, 4:2:0), and, when
``tests/data/plant_capture`` is present, a real photo of it scaled to 1920x1080 (Lanczos) and saved
at quality 90. The loader part serves an images-layout store of ``--n`` such photos with
``cache_bytes=0`` (every batch decodes) at each level: images/s over one epoch, batch 1, on this thread.

    python benchmarks/bench_levels.py              # about a minute on 2 cores

Results: ``benchmarks/results/levels.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_decode import encoded, photo
from machine import command_line, describe

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from raykit.imagedecode import decode_image, decode_image_scaled, downscale_area  # noqa: E402

PLANT = ROOT.parent / "tests" / "data" / "plant_capture" / "images" / "frame_00001.jpg"


def real_1080p() -> bytes | None:
    if not PLANT.exists():
        return None
    from PIL import Image

    with Image.open(PLANT) as img:
        big = img.convert("RGB").resize((1920, 1080), Image.LANCZOS)
    out = io.BytesIO()
    big.save(out, "JPEG", quality=90)
    return out.getvalue()


def time_ms(fn: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def per_image(data: bytes, reps: int) -> dict[str, Any]:
    import cv2

    rows: dict[str, Any] = {}
    for k in (2, 4, 8):
        cases = {
            "levels": lambda k=k: decode_image_scaled(data, k),
            "full+area": lambda k=k: downscale_area(decode_image(data), k),
            "full+cv2": lambda k=k: cv2.resize(
                decode_image(data), (1920 // k, 1080 // k), interpolation=cv2.INTER_AREA
            ),
        }
        for fn in cases.values():
            fn()
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(reps):  # interleaved
            for name, fn in cases.items():
                times[name] += time_ms(fn, 1)
        med = {name: statistics.median(t) for name, t in times.items()}
        rows[f"1/{k}"] = {
            "ms": med,
            "speedup_vs_full_area": med["full+area"] / med["levels"],
            "speedup_vs_full_cv2": med["full+cv2"] / med["levels"],
        }
    rows["full_decode_ms"] = statistics.median(time_ms(lambda: decode_image(data), reps))
    return rows


def loader_rates(data: bytes, n: int) -> dict[str, float]:
    from raykit.converters import convert
    from raykit.loaders import ImageLoader

    with tempfile.TemporaryDirectory() as tmp:
        capture = Path(tmp) / "capture"
        (capture / "images").mkdir(parents=True)
        frames = []
        for i in range(n):
            (capture / "images" / f"{i:03d}.jpg").write_bytes(data)
            pose = np.eye(4)
            pose[:3, 3] = [np.cos(i), np.sin(i), 0.2]
            frames.append({"file_path": f"images/{i:03d}.jpg", "transform_matrix": pose.tolist()})
        meta = {"fl_x": 1500.0, "fl_y": 1500.0, "cx": 960.0, "cy": 540.0, "w": 1920, "h": 1080}
        meta["frames"] = frames
        (capture / "transforms.json").write_text(json.dumps(meta))
        store = convert(capture, Path(tmp) / "s.zarr", layout="images", progress=False)
        rates = {}
        for k in (1, 2, 4, 8):
            with ImageLoader(store, "train", cache_bytes=0, downscale=k, shuffle=False) as loader:
                t0 = time.perf_counter()
                count = sum(len(batch) for batch in loader)
                rates[f"1/{k}"] = count / (time.perf_counter() - t0)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--n", type=int, default=16, help="photos in the loader's store")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "levels.json")
    args = parser.parse_args()
    images = {"synthetic_1080p": encoded(photo(1080, 1920), "JPEG", quality=90)}
    real = real_1080p()
    if real is not None:
        images["plant_1080p"] = real
    result: dict[str, Any] = {"command": command_line(), "machine": describe()}
    for name, data in images.items():
        result[name] = per_image(data, args.reps)
        print(name, json.dumps(result[name], indent=1))
    result["loader_images_per_s"] = loader_rates(images.get("plant_1080p", images["synthetic_1080p"]), args.n)
    print("loader", result["loader_images_per_s"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
