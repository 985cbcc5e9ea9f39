"""Chunk-read throughput of the worker kinds a loader could use: the calling thread, threads, processes.

Issue 12 asked whether loader workers could be threads (which need no ``if __name__ == "__main__":``
guard) instead of spawned processes. This reads every train chunk of a store (decode and checksum
included, as ``RayLoader``'s workers do) with each kind and reports M rays/s; process start-up is
excluded (``wait_for_workers`` does the same). It converts the built-in ``small`` scene with zstd
colours into a temporary directory unless a store is given.

    python benchmarks/bench_worker_kinds.py [STORE]

Results go to ``benchmarks/results/worker_kinds.json``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
_SOURCE: Any = None


def _init(url: str) -> None:
    global _SOURCE
    from raykit.loaders.source import StoreSource
    from raykit.store import open_store

    _SOURCE = StoreSource(open_store(url), "train")


def _read(index: int) -> int:
    return len(_SOURCE.read_chunk(index).pid)


def _pass(pool: Executor | None, n_chunks: int) -> float:
    start = time.perf_counter()
    reads = map(_read, range(n_chunks)) if pool is None else pool.map(_read, range(n_chunks))
    rays = sum(reads)
    return rays / (time.perf_counter() - start) / 1e6


def measure(url: str, passes: int = 3) -> dict[str, Any]:
    from raykit.store import open_store

    n_chunks = open_store(url).splits["train"].n_chunks
    _init(url)
    results: dict[str, Any] = {"calling_thread": max(_pass(None, n_chunks) for _ in range(passes))}
    for workers in (2, 4):
        with ThreadPoolExecutor(workers, initializer=_init, initargs=(url,)) as threads:
            _pass(threads, n_chunks)  # warm
            results[f"threads_{workers}"] = max(_pass(threads, n_chunks) for _ in range(passes))
        with ProcessPoolExecutor(
            workers, mp_context=get_context("spawn"), initializer=_init, initargs=(url,)
        ) as procs:
            _pass(procs, n_chunks)  # start-up and warm
            results[f"processes_{workers}"] = max(_pass(procs, n_chunks) for _ in range(passes))
    return {"mrays_per_s": results, "n_chunks": n_chunks}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = sys.argv[1] if len(sys.argv) > 1 else None
        if url is None:
            from raykit.converters import convert
            from raykit.testing import render_scene, write_blender

            capture = write_blender(render_scene("small"), Path(tmp) / "capture")
            url = str(Path(tmp) / "store.zarr")
            convert(capture, url, rgba_codec="zstd")
        load_before = os.getloadavg()
        result = measure(url)
        result.update(
            {
                "store": "built-in small scene, zarr, zstd colours" if len(sys.argv) < 2 else "given",
                "cpu_count": os.cpu_count(),
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                "command": "python benchmarks/bench_worker_kinds.py",
            }
        )
    out = ROOT / "results" / "worker_kinds.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
