"""Colour-codec study: bytes per ray and single-core encode/decode speed of candidate codecs for the
colour field, on the rendered benchmark scene and on its photo-like variant.

Format 3 stores colours only (pids are derived from the train order), so the colour codec decides
the store's size. Reads 15 train chunks (65,536 rays each) of

* the rendered scene's store (``benchmarks/data/loader-realistic-0/store.zarr``, made by
  ``bench_loader.py``; RGBA, flat shading), and
* the photo-like variant (``benchmarks/data/convert-realistic-0-photo2``, made by
  ``bench_convert.py``: RGB composited over white with sensor-like noise), converted once here to
  ``benchmarks/data/codecs-photo2/store.zarr``,

and compresses their colours with the codecs considered for the Zarr backend. Encode and decode are
timed over three passes, one thread; ``raw`` is a plain copy (what reading uncompressed colours costs).

    python benchmarks/bench_codecs.py [RENDERED_STORE [PHOTO_STORE]]
    python benchmarks/bench_codecs.py --store STORE --chunks 48 --out benchmarks/results/codecs_scale.json

Results go to ``benchmarks/results/codecs_format3.json`` (``codecs.json`` holds the study of format 2,
with stored pids). ``--store`` studies one rays-layout store (e.g. ``bench_scale.py``'s 1080p JPEG
capture converted with ``raykit convert``) instead. Each study also reports the zeroth-order entropy of
the sampled colours (per channel, and of whole pixels): shuffled rays carry no spatial context, so no
codec that sees them one ray at a time stores them in fewer bytes per ray than the joint entropy (the
plug-in estimate from a sample is biased low, so the true bound is at least the figure).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from machine import command_line, describe, portable
from numcodecs import LZ4, Blosc, Zstd

from raykit.store import open_store

ROOT = Path(__file__).resolve().parent


class Raw:
    """No compression: the bytes as they are (a copy to decode)."""

    def encode(self, a: np.ndarray) -> bytes:
        return a.tobytes()

    def decode(self, data: bytes, out: np.ndarray) -> np.ndarray:
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
        return out


def measure(codec: Any, arrays: list[np.ndarray], passes: int = 3) -> dict[str, float]:
    """Bytes per ray and M rays/s to encode and to decode ``arrays`` with ``codec``."""
    n = sum(len(a) for a in arrays)
    encoded = [codec.encode(a) for a in arrays]
    start = time.perf_counter()
    for _ in range(passes):
        encoded = [codec.encode(a) for a in arrays]
    encode_s = (time.perf_counter() - start) / passes
    start = time.perf_counter()
    for _ in range(passes):
        for data, a in zip(encoded, arrays, strict=True):
            codec.decode(data, out=np.empty_like(a))
    decode_s = (time.perf_counter() - start) / passes
    for data, a in zip(encoded, arrays, strict=True):
        back = codec.decode(data, out=np.empty_like(a))
        assert np.array_equal(np.asarray(back).reshape(a.shape), a)
    return {
        "bytes_per_ray": sum(len(e) for e in encoded) / n,
        "ratio": sum(a.nbytes for a in arrays) / sum(len(e) for e in encoded),
        "encode_mrays_per_s": n / encode_s / 1e6,
        "decode_mrays_per_s": n / decode_s / 1e6,
    }


def codecs(channels: int) -> dict[str, Any]:
    block = 1 << 18

    def planar(cname: str, level: int) -> Blosc:  # byte shuffle over whole pixels: one plane per channel
        return Blosc(cname, level, Blosc.SHUFFLE, blocksize=block, typesize=channels)

    return {
        "raw": Raw(),
        "blosc-lz4-9-noshuffle-256k (default)": Blosc("lz4", 9, Blosc.NOSHUFFLE, blocksize=block),
        "lz4": LZ4(),
        "zstd-1": Zstd(level=1),
        "zstd-3": Zstd(level=3),
        "zstd-9": Zstd(level=9),
        f"blosc-lz4-5-shuffle-ts{channels}": planar("lz4", 5),
        f"blosc-zstd-1-shuffle-ts{channels}": planar("zstd", 1),
        f"blosc-zstd-3-shuffle-ts{channels}": planar("zstd", 3),
        "blosc-zstd-1-bitshuffle": Blosc("zstd", 1, Blosc.BITSHUFFLE, blocksize=block),
        "blosc-lz4-9-bitshuffle": Blosc("lz4", 9, Blosc.BITSHUFFLE, blocksize=block),
    }


def entropy_bits(values: np.ndarray) -> float:
    """(n,) integer symbols -> their plug-in zeroth-order entropy in bits per symbol."""
    _, counts = np.unique(values, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def entropy_bound(colours: np.ndarray) -> dict[str, Any]:
    """(n, C) uint8 colours -> bytes per ray at their entropy: channels coded apart, and whole pixels."""
    per_channel = [entropy_bits(colours[:, c]) for c in range(colours.shape[1])]
    packed = np.zeros(len(colours), dtype=np.int64)
    for c in range(colours.shape[1]):
        packed = (packed << 8) | colours[:, c]
    return {
        "channel_bits": per_channel,
        "channels_bytes_per_ray": sum(per_channel) / 8,
        "pixel_bytes_per_ray": entropy_bits(packed) / 8,
        "samples": len(colours),
    }


def photo_store(capture: Path) -> Path:
    from raykit.converters import convert

    path = ROOT / "data" / "codecs-photo2" / "store.zarr"
    if not (path / "manifest.json").exists():
        convert(capture, path, threads=2)
    return path


def study(store_path: str, n: int = 15) -> dict[str, Any]:
    store = open_store(store_path)
    n_chunks = store.splits["train"].n_chunks
    chunks = [store.read_chunk("train", i) for i in range(0, n_chunks, max(1, n_chunks // n))][:n]
    colours = [np.ascontiguousarray(c.rgba) for c in chunks]
    channels = colours[0].shape[1]
    return {
        "store": portable(store_path),
        "channels": channels,
        "rays": int(sum(len(c) for c in colours)),
        "colour": {name: measure(codec, colours) for name, codec in codecs(channels).items()},
        "entropy": entropy_bound(np.concatenate(colours)),
    }


def print_study(scene: str, study_result: dict[str, Any]) -> None:
    for name, r in study_result["colour"].items():
        rates = f"encode {r['encode_mrays_per_s']:6.0f}  decode {r['decode_mrays_per_s']:6.0f} M rays/s"
        print(f"{scene:10s} {name:38s} {r['bytes_per_ray']:5.2f} B/ray  {rates}")
    e = study_result["entropy"]
    print(f"{scene:10s} entropy: channels apart {e['channels_bytes_per_ray']:.3f}, whole pixels "
          f"{e['pixel_bytes_per_ray']:.3f} B/ray ({e['samples']} rays)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "rendered", nargs="?", default=str(ROOT / "data" / "loader-realistic-0" / "store.zarr")
    )
    parser.add_argument("photo", nargs="?", default=None)
    parser.add_argument("--store", help="study this one rays-layout store instead")
    parser.add_argument("--chunks", type=int, default=15, help="train chunks sampled per store")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "codecs_format3.json")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    result: dict[str, Any] = {"benchmark": "codecs", "command": command_line()}
    if args.store:
        scenes = {"store": study(args.store, args.chunks)}
    else:
        photo = args.photo or str(photo_store(ROOT / "data" / "convert-realistic-0-photo2"))
        scenes = {"rendered": study(args.rendered, args.chunks), "photo_like": study(photo, args.chunks)}
    result.update(scenes)
    result["machine"] = {**describe(), "loadavg_1m_at_start_and_end": [load_start, os.getloadavg()[0]]}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for scene, found in scenes.items():
        print_study(scene, found)


if __name__ == "__main__":
    main()
