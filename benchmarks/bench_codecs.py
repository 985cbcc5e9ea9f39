"""Codec study: bytes per ray and single-core encode/decode speed of candidate codecs on real chunks.

Reads 15 train chunks of the loader benchmark's store (``benchmarks/data/loader-realistic-0``, made by
``bench_loader.py``; any store can be given) and compresses their ``pid`` and ``rgba`` arrays with the
codecs considered for the Zarr backend (docs/format.md, "Bytes per ray on disk"). Encode and decode
are timed over three passes, one thread.

    python benchmarks/bench_codecs.py [STORE]

Results go to ``benchmarks/results/codecs.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from machine import command_line, portable
from numcodecs import LZ4, Blosc, Zstd

from raykit.store import open_store

ROOT = Path(__file__).resolve().parent


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
    return {
        "bytes_per_ray": sum(len(e) for e in encoded) / n,
        "encode_mrays_per_s": n / encode_s / 1e6,
        "decode_mrays_per_s": n / decode_s / 1e6,
    }


def main() -> None:
    default = ROOT / "data" / "loader-realistic-0" / "store.zarr"
    store_path = sys.argv[1] if len(sys.argv) > 1 else str(default)
    store = open_store(store_path)
    n_chunks = store.splits["train"].n_chunks
    chunks = [store.read_chunk("train", i) for i in range(0, n_chunks, max(1, n_chunks // 15))][:15]
    pids, rgbas = [c.pid for c in chunks], [c.rgba for c in chunks]
    shuffle = {"shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE, "noshuffle": Blosc.NOSHUFFLE}
    pid_codecs = {
        f"blosc-{cname}-{level}-{sh}": Blosc(cname, level, shuffle[sh], blocksize=0)
        for cname, level, sh in [
            ("zstd", 4, "shuffle"), ("zstd", 1, "shuffle"), ("lz4", 5, "shuffle"), ("lz4", 5, "bitshuffle"),
            ("zstd", 1, "bitshuffle"),
        ]
    }  # fmt: skip
    rgba_codecs = {
        "zstd-3": Zstd(level=3), "zstd-1": Zstd(level=1), "lz4": LZ4(),
        "blosc-lz4-1-noshuffle": Blosc("lz4", 1, Blosc.NOSHUFFLE, blocksize=0),
        "blosc-lz4-9-noshuffle-256k": Blosc("lz4", 9, Blosc.NOSHUFFLE, blocksize=1 << 18),  # the default
    }  # fmt: skip
    result = {
        "benchmark": "codecs",
        "command": command_line(),
        "store": portable(store_path),
        "rays": int(sum(len(p) for p in pids)),
        "pid": {name: measure(codec, pids) for name, codec in pid_codecs.items()},
        "rgba": {name: measure(codec, rgbas) for name, codec in rgba_codecs.items()},
    }
    out = ROOT / "results" / "codecs.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for field in ("pid", "rgba"):
        for name, r in result[field].items():
            rates = f"encode {r['encode_mrays_per_s']:6.0f}  decode {r['decode_mrays_per_s']:6.0f} M rays/s"
            print(f"{field:5s} {name:28s} {r['bytes_per_ray']:5.2f} B/ray  {rates}")


if __name__ == "__main__":
    main()
