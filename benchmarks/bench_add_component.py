"""Adding masks to an images-layout store writes only the masks (issue 45).

A capture of ``--photos`` synthetic photos (default 2,000 JPEGs of ``--size`` 320x240, quality 90,
seeded noise over a gradient, in an instant-ngp ``transforms.json``) is converted with ``--layout
images`` (every JPEG passes through), one store per backend; then ``raykit.store.add_component`` adds
a 1-bit mask per photo (PNG files of a seeded ellipse) in this process. Measured per backend:

* bytes written while adding: this process's ``wchar`` (bytes handed to ``write``) and ``write_bytes``
  (bytes sent to storage) from ``/proc/self/io``, and the store's file bytes before and after (new
  files plus the manifest's growth);
* against the masks' own bytes: their stored arrays (``ComponentInfo.stored_bytes``: one ``.npy`` of
  ``H x ceil(W / 8)`` packed bytes a photo) and the bare packed bits (``H x ceil(W / 8)`` a photo);
* that every file of the store but ``manifest.json`` is byte-identical afterwards and the content
  (pixel) fingerprint is unchanged, while the store fingerprint is not.

Target: bytes written <= 1.1x the masks' own (stored) bytes, pixel fingerprint unchanged.

    python benchmarks/bench_add_component.py                      # 2,000 photos of 320x240
    python benchmarks/bench_add_component.py --photos 200 --out out/add.json   # a quick look

Results go to ``benchmarks/results/add_component.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from machine import command_line, describe, write_report
from PIL import Image

ROOT = Path(__file__).resolve().parent


def io_counters() -> dict[str, int]:
    """This process's ``/proc/self/io`` counters."""
    with open("/proc/self/io") as handle:
        return {k: int(v) for k, v in (line.split(": ") for line in handle.read().splitlines())}


def make_capture(root: Path, photos: int, width: int, height: int) -> Path:
    """``root/transforms.json``, ``root/images/p_{i:05d}.jpg`` and ``root/masks/p_{i:05d}.png``."""
    rng = np.random.default_rng(45)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], -1)
    frames = []
    for i in range(photos):
        noise = rng.normal(0, 6, (height, width, 3))
        pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / "images" / f"p_{i:05d}.jpg", quality=90)
        cx, cy, rx, ry = rng.uniform(0.3, 0.7) * width, rng.uniform(0.3, 0.7) * height, width / 4, height / 3
        mask = (((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 <= 1).astype(np.uint8) * 255
        Image.fromarray(mask).save(root / "masks" / f"p_{i:05d}.png")
        angle = 2 * np.pi * i / photos
        c2w = np.eye(4)
        c2w[:3, 3] = [4 * np.cos(angle), 4 * np.sin(angle), 1.0]
        frames.append({"file_path": f"images/p_{i:05d}.jpg", "transform_matrix": c2w.tolist()})
    f = width / 2
    meta = {"fl_x": f, "fl_y": f, "cx": width / 2, "cy": height / 2, "w": width, "h": height}
    (root / "transforms.json").write_text(json.dumps({**meta, "frames": frames}))
    return root


def file_digests(root: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def measure(capture: Path, work: Path, backend: str) -> dict[str, Any]:
    from raykit.converters import convert
    from raykit.converters.components import add_component_files

    t0 = time.perf_counter()
    options = {"layout": "images", "backend": backend, "near": 0.5, "far": 8.0, "progress": False}
    store = convert(capture, work / backend, **options)
    convert_s = time.perf_counter() - t0
    before = file_digests(work / backend)
    io0 = io_counters()
    t0 = time.perf_counter()
    added = add_component_files(work / backend, "masks", capture / "masks")
    add_s = time.perf_counter() - t0
    io1 = io_counters()
    after = file_digests(work / backend)
    info = added.components["mask"]
    table = added.table
    packed = sum(int(h) * ((int(w) + 7) // 8) for h, w in zip(table.height, table.width, strict=True))
    new_files = sum(size for rel, (size, _) in after.items() if rel not in before)
    manifest_growth = after["manifest.json"][0] - before["manifest.json"][0]
    changed = sorted(rel for rel in before if after[rel] != before[rel])
    wchar = io1["wchar"] - io0["wchar"]
    return {
        "backend": backend,
        "photos": len(table.names),
        "convert_seconds": round(convert_s, 2),
        "add_seconds": round(add_s, 2),
        "mask_stored_bytes": info.stored_bytes,
        "mask_packed_bits_bytes": packed,
        "wchar_bytes": wchar,
        "write_bytes": io1["write_bytes"] - io0["write_bytes"],
        "new_file_bytes": new_files,
        "manifest_bytes_after": after["manifest.json"][0],
        "manifest_growth_bytes": manifest_growth,
        "written_over_stored": round(wchar / info.stored_bytes, 4),
        "written_over_packed_bits": round(wchar / packed, 4),
        "files_changed_besides_new": changed,
        "pixel_fingerprint_unchanged": added.fingerprint == store.fingerprint,
        "store_fingerprint_changed": added.store_fingerprint != store.store_fingerprint,
        "target_met": wchar <= 1.1 * info.stored_bytes and added.fingerprint == store.fingerprint
        and changed == ["manifest.json"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--size", default="320x240", help="WIDTHxHEIGHT of every photo and mask")
    parser.add_argument("--backends", default="zarr,wds")
    parser.add_argument("--out", default=str(ROOT / "results" / "add_component.json"))
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    work = Path(tempfile.mkdtemp(prefix="raykit-add-component-"))
    try:
        t0 = time.perf_counter()
        capture = make_capture(work / "capture", args.photos, width, height)
        capture_s = time.perf_counter() - t0
        results = [measure(capture, work, backend) for backend in args.backends.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "command": command_line(),
        "machine": describe(),
        "photo_size": f"{width}x{height}",
        "capture_seconds": round(capture_s, 2),
        "results": results,
    }
    for r in results:
        print(
            f"{r['backend']}: {r['photos']} photos, masks {r['mask_stored_bytes']:,} bytes stored, "
            f"{r['wchar_bytes']:,} bytes written ({r['written_over_stored']:.3f}x stored, "
            f"{r['written_over_packed_bits']:.3f}x packed bits), pixel fingerprint unchanged: "
            f"{r['pixel_fingerprint_unchanged']}, changed files: {r['files_changed_besides_new']}"
        )
    write_report(args.out, report)


if __name__ == "__main__":
    main()
