"""The pieces of a loader's per-ray component work (issue 45), each timed alone.

* ``gather``: an images-layout batch's component values gathered by pixel id from a flat table of
  ``--pixels`` pixels (4096 rays a batch, drawn from 32 images of 640 k pixels, as an 800x800 window
  draws): one ``np.take`` per component (uint8 mask + float32 depth) against one of an aligned 8-byte
  record (``raykit.loaders.components.record_dtype``), from memory and from a scratch file; us a batch.
* ``staging`` (with ``--store``, a rays-layout store with masks and depth): every train image's
  components decoded and put in rank order (``StagedComponents``), in memory and into a scratch file,
  on one thread; seconds.
* ``merge``: an epoch of that split's chunks' values merged from the staged arrays
  (``SplitOrder.merged``), per component; seconds.

Medians of ``--rounds``; JSON to ``--out``.

    python benchmarks/bench_component_gather.py --store STORE --out benchmarks/results/component_gather.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

BATCH, WINDOW, IMAGE = 4096, 32, 640_000


def gather(pixels: int, rounds: int) -> dict[str, float]:
    """us a batch: a take per component against one record take, from memory and a scratch file."""
    from raykit.loaders.components import scratch_array

    rng = np.random.default_rng(0)
    mask = rng.integers(0, 2, pixels, dtype=np.uint8)
    depth = rng.random(pixels, dtype=np.float32)
    record = np.dtype([("mask", np.uint8), ("depth", np.float32)], align=True)
    held = {"memory": np.zeros(pixels, record), "scratch": scratch_array(pixels, record)}
    for table in held.values():
        table["mask"], table["depth"] = mask, depth
    images = rng.choice(pixels // IMAGE, WINDOW, replace=False)
    draws = [(rng.choice(images, BATCH), rng.integers(0, IMAGE, BATCH)) for _ in range(500)]
    batches = [(image * IMAGE + pixel).astype(np.intp) for image, pixel in draws]

    def per_component() -> None:
        for index in batches:
            np.take(mask, index)
            np.take(depth, index)

    def per_record(table: np.ndarray) -> None:
        words = table.view(np.uint64)
        for index in batches:
            records = np.take(words, index).view(record)
            np.ascontiguousarray(records["mask"]), np.ascontiguousarray(records["depth"])

    cases = {
        "take_per_component_us": per_component,
        "take_record_memory_us": lambda: per_record(held["memory"]),
        "take_record_scratch_us": lambda: per_record(held["scratch"]),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) / len(batches) * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def staging_and_merge(store_path: str, rounds: int) -> dict[str, float]:
    """Seconds: staging the train split's components (memory, scratch) and merging an epoch's chunks."""
    from raykit.loaders import component_gather as components
    from raykit.store import open_store

    components.DECODE_THREADS = 1  # one thread: the work, not the machine's load
    store = open_store(store_path)
    names = tuple(n for n in ("mask", "depth") if n in store.components)
    rows = store.split_rows("train")
    order = store.split_order("train")
    out: dict[str, list[float]] = {"staging_memory_s": [], "staging_scratch_s": []}
    staged: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        for kind, budget in (("memory", 1 << 40), ("scratch", 0)):
            gather = components.ComponentGather(store, names, rows, budget)
            start = time.perf_counter()
            staged = components.StagedComponents(gather)._stage(order)
            out[f"staging_{kind}_s"].append(time.perf_counter() - start)
    chunk = store.spec.chunk_rays
    for name, array in staged.items():
        key = f"merge_epoch_{name}_s"
        out[key] = []
        for _ in range(rounds):
            start = time.perf_counter()
            for lo in range(0, order.n_rays, chunk):
                order.merged(array, lo, min(order.n_rays, lo + chunk))
            out[key].append(time.perf_counter() - start)
    result: dict[str, float] = {name: statistics.median(values) for name, values in out.items()}
    result["n_rays"] = order.n_rays
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=None, help="a rays-layout store with masks and depth")
    parser.add_argument("--pixels", type=int, default=105 * IMAGE, help="pixels of the flat table")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from machine import command_line, describe

    report: dict[str, Any] = {"command": command_line(), "machine": describe(), "rounds": args.rounds}
    report["gather"] = gather(args.pixels, args.rounds)
    if args.store:
        report["staging"] = staging_and_merge(args.store, args.rounds)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
