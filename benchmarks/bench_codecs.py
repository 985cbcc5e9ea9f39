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

Results go to ``benchmarks/results/codecs_format3.json`` (``codecs.json`` holds the study of format 2,
with stored pids).
"""

from __future__ import annotations

import json
import os
import sys
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
    }


def photo_store(capture: Path) -> Path:
    from raykit.converters import convert

    path = ROOT / "data" / "codecs-photo2" / "store.zarr"
    if not (path / "manifest.json").exists():
        convert(capture, path, threads=2)
    return path


def study(store_path: str) -> dict[str, Any]:
    store = open_store(store_path)
    n_chunks = store.splits["train"].n_chunks
    chunks = [store.read_chunk("train", i) for i in range(0, n_chunks, max(1, n_chunks // 15))][:15]
    colours = [np.ascontiguousarray(c.rgba) for c in chunks]
    channels = colours[0].shape[1]
    return {
        "store": portable(store_path),
        "channels": channels,
        "rays": int(sum(len(c) for c in colours)),
        "colour": {name: measure(codec, colours) for name, codec in codecs(channels).items()},
    }


def main() -> None:
    rendered = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "data" / "loader-realistic-0" / "store.zarr")
    photo = (
        sys.argv[2] if len(sys.argv) > 2 else str(photo_store(ROOT / "data" / "convert-realistic-0-photo2"))
    )
    load_start = os.getloadavg()[0]
    result = {
        "benchmark": "codecs",
        "command": command_line(),
        "rendered": study(rendered),
        "photo_like": study(photo),
        "machine": {**describe(), "loadavg_1m_at_start_and_end": [load_start, os.getloadavg()[0]]},
    }
    out = ROOT / "results" / "codecs_format3.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for scene in ("rendered", "photo_like"):
        for name, r in result[scene]["colour"].items():
            rates = f"encode {r['encode_mrays_per_s']:6.0f}  decode {r['decode_mrays_per_s']:6.0f} M rays/s"
            print(f"{scene:10s} {name:38s} {r['bytes_per_ray']:5.2f} B/ray  {rates}")


if __name__ == "__main__":
    main()
