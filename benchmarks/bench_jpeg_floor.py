"""The ceiling of a DCT-scaled JPEG decode's speed-up (issue 44's levels target): how much of a full
decode is entropy (Huffman) decoding, which every scaled decode still does for every coefficient.

Per 1920x1080 JPEG, median ms over ``--reps`` interleaved runs (after a warm-up), all libjpeg-turbo
through simplejpeg (``strict=False`` only for the DC-only case):

* ``full``: a full decode to RGB (``decode_image``);
* ``1/2``, ``1/4``, ``1/8``: ``decode_image_scaled`` (the scaled IDCT; at 1/8 each 8x8 block's IDCT is
  its DC term alone, so a 1/8 decode is entropy decoding plus 1/64 of the colour work: the floor of
  any DCT-scaled decode of that file);
* ``full+area 1/4`` / ``1/8``: the full decode then ``downscale_area`` (the levels target's baseline);
* ``dc-only 1/8`` (progressive files only): the same file cut after its first scan, which holds every
  block's DC coefficient and nothing else (the AC scans follow), decoded at 1/8: what reading only
  the DC coefficients costs. A baseline (sequential) JPEG interleaves DC and AC codes in one Huffman
  stream without markers between blocks, so it cannot skip AC coefficients without decoding them.

Files: the real ``plant_capture`` photo scaled to 1080p (Lanczos) at quality 75, 90 and 95 (baseline,
4:2:0, Pillow), at 90 progressive, and ``bench_decode.py``'s synthetic photo at 90.

    python benchmarks/bench_jpeg_floor.py          # ~20 s on 2 cores

Results: ``benchmarks/results/jpeg_floor.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from bench_decode import encoded, photo  # noqa: E402
from bench_levels import PLANT  # noqa: E402
from machine import command_line, describe  # noqa: E402

from raykit.imagedecode import decode_image, decode_image_scaled, downscale_area  # noqa: E402


def plant_1080p(quality: int, progressive: bool = False) -> bytes:
    from PIL import Image

    with Image.open(PLANT) as img:
        big = img.convert("RGB").resize((1920, 1080), Image.LANCZOS)
    out = io.BytesIO()
    big.save(out, "JPEG", quality=quality, progressive=progressive)
    return out.getvalue()


def first_scan_only(data: bytes) -> bytes:
    """A progressive JPEG cut after its first scan (the DC coefficients) and closed with EOI."""
    first = data.index(b"\xff\xda")
    second = data.index(b"\xff\xda", first + 2)
    head = data[:second]
    table = head.rfind(b"\xff\xc4")  # a DHT for the next scan may sit between the two scans
    return (head[:table] if table > first else head) + b"\xff\xd9"


def dc_only(data: bytes) -> Any:
    import simplejpeg

    return simplejpeg.decode_jpeg(
        data, colorspace="RGB", min_factor=8, min_height=135, min_width=240, strict=False
    )


def per_file(data: bytes, progressive: bool, reps: int) -> dict[str, Any]:
    cases = {
        "full": lambda: decode_image(data),
        "1/2": lambda: decode_image_scaled(data, 2),
        "1/4": lambda: decode_image_scaled(data, 4),
        "1/8": lambda: decode_image_scaled(data, 8),
        "full+area 1/4": lambda: downscale_area(decode_image(data), 4),
        "full+area 1/8": lambda: downscale_area(decode_image(data), 8),
    }
    if progressive:
        cut = first_scan_only(data)
        assert dc_only(cut).shape == (135, 240, 3)
        cases["dc-only 1/8"] = lambda: dc_only(cut)
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    ms = {name: statistics.median(t) for name, t in times.items()}
    floor = ms["1/8"]
    row: dict[str, Any] = {"kb": len(data) / 1024, "ms": ms}
    row["scaled_vs_full"] = {k: ms["full"] / ms[k] for k in ("1/2", "1/4", "1/8")}
    row["floor_share_of_full"] = floor / ms["full"]  # the most a scaled decode can leave out
    row["target_ratio"] = {k: ms[f"full+area {k}"] / ms[k] for k in ("1/4", "1/8")}
    row["ceiling_ratio"] = {k: ms[f"full+area {k}"] / floor for k in ("1/4", "1/8")}
    if progressive:
        row["dc_only_ratio"] = {k: ms[f"full+area {k}"] / ms["dc-only 1/8"] for k in ("1/8",)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "jpeg_floor.json")
    args = parser.parse_args()
    files = {f"plant q{q}": (plant_1080p(q), False) for q in (75, 90, 95)}
    files["plant q90 progressive"] = (plant_1080p(90, progressive=True), True)
    files["synthetic q90"] = (encoded(photo(1080, 1920), "JPEG", quality=90), False)
    result: dict[str, Any] = {"command": command_line(), "machine_before": describe()}
    for name, (data, progressive) in files.items():
        result[name] = per_file(data, progressive, args.reps)
        row = result[name]
        print(name, f"{row['kb']:.0f} KB", {k: round(v, 2) for k, v in row["ms"].items()},
              "ceiling", {k: round(v, 2) for k, v in row["ceiling_ratio"].items()}, flush=True)  # fmt: skip
    result["machine_after"] = describe()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
