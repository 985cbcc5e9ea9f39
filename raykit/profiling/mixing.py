"""How well batches are mixed: one figure, ``shuffle_quality``, for the loader and for a store's chunks.

A batch is compared with rays drawn uniformly at random from the whole split by two figures: the
number of distinct images it holds (over its expectation for a uniform draw), and the total-variation
distance between its image histogram and the split's (over the same for uniform draws).
``chunk_shuffle_quality`` applies it to batches built from ``k`` random whole chunks of a store, which
tells how many chunks a loader must mix (``docs/format.md``).

``python -m raykit.profiling.mixing STORE``: shuffle quality per chunks-per-batch and read throughput.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from raykit.store import RayStore, open_store

__all__ = ["chunk_shuffle_quality", "expected_distinct_images", "main", "read_throughput", "shuffle_quality"]


def expected_distinct_images(n_pixels: np.ndarray, batch_size: int) -> float:
    """Expected distinct images among ``batch_size`` rays drawn uniformly from images of (I,) sizes."""
    p = n_pixels / n_pixels.sum()
    return float(np.sum(1.0 - np.power(1.0 - p, batch_size)))


def _tv_distance(counts: np.ndarray, p: np.ndarray) -> float:
    return float(0.5 * np.abs(counts / counts.sum() - p).sum())


def shuffle_quality(image_ids: list[np.ndarray], n_pixels: np.ndarray, seed: int = 0) -> dict[str, float]:
    """How well batches are mixed, against rays drawn uniformly at random from the split.

    Args:
        image_ids: batches of (B,) image indices in ``[0, I)``, all of the same size.
        n_pixels: (I,) rays per image.
        seed: seed of the uniform draws the histogram distance is compared with.

    Returns:
        ``distinct_images``: mean distinct images per batch; ``uniform_expected``: its expectation for
        a uniform draw; ``ratio``: the first over the second (1.0 is ideal, lower is worse); ``tv``:
        mean total-variation distance between a batch's image histogram and the split's;
        ``tv_uniform``: the same for uniform draws; ``tv_ratio``: ``tv / tv_uniform`` (1.0 is ideal,
        higher is worse).
    """
    p = n_pixels / n_pixels.sum()
    distinct = np.array([len(np.unique(ids)) for ids in image_ids], dtype=np.float64)
    expected = expected_distinct_images(n_pixels, len(image_ids[0]))
    tv = np.mean([_tv_distance(np.bincount(ids, minlength=len(p)), p) for ids in image_ids])
    rng = np.random.default_rng(seed)
    tv_uniform = np.mean([_tv_distance(rng.multinomial(len(image_ids[0]), p), p) for _ in range(64)])
    return {
        "distinct_images": float(distinct.mean()),
        "uniform_expected": expected,
        "ratio": float(distinct.mean() / expected),
        "tv": float(tv),
        "tv_uniform": float(tv_uniform),
        "tv_ratio": float(tv / tv_uniform),
    }


def chunk_shuffle_quality(
    store: RayStore,
    split: str = "train",
    *,
    batch_rays: int = 4096,
    chunks_per_batch: int = 1,
    n_batches: int = 32,
    seed: int = 0,
) -> dict[str, Any]:
    """``shuffle_quality`` of batches of ``batch_rays`` rays drawn from ``chunks_per_batch`` random
    whole chunks of ``split`` (seeded), with the settings it was measured with."""
    info = store.splits[split]
    rows = store.split_rows(split)
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(n_batches):
        picks = rng.choice(info.n_chunks, size=min(chunks_per_batch, info.n_chunks), replace=False)
        pid = np.concatenate([store.read_chunk(split, int(i)).pid for i in picks])
        batch = rng.choice(pid, size=min(batch_rays, len(pid)), replace=False)
        batches.append(store.decode_pids(batch)[0] - int(rows[0]))
    return {
        "split": split,
        "batch_rays": batch_rays,
        "chunks_per_batch": chunks_per_batch,
        "n_batches": n_batches,
        "n_images": len(rows),
        **shuffle_quality(batches, store.table.n_pixels[rows], seed),
    }


def read_throughput(
    store: RayStore, split: str = "train", n_chunks: int = 16, seed: int = 0
) -> dict[str, float]:
    """Random-order ``read_chunk`` throughput (checksums included) over up to ``n_chunks`` chunks.

    One chunk is read first, untimed, so opening arrays and first-use file checks are not counted.
    """
    info = store.splits[split]
    order = np.random.default_rng(seed).permutation(info.n_chunks)[:n_chunks]
    store.read_chunk(split, int(order[-1]))
    start = time.perf_counter()
    rays = sum(len(store.read_chunk(split, int(i))) for i in order)
    seconds = time.perf_counter() - start
    return {"chunks": len(order), "rays": rays, "seconds": seconds, "rays_per_s": rays / seconds}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m raykit.profiling.mixing STORE``: shuffle quality per chunks-per-batch, read rate."""
    parser = argparse.ArgumentParser(prog="python -m raykit.profiling.mixing", description=__doc__)
    parser.add_argument("store")
    parser.add_argument("--split", default="train")
    parser.add_argument("--batch-rays", type=int, default=4096)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batches", type=int, default=32)
    args = parser.parse_args(argv)
    store = open_store(args.store)
    report = {
        "shuffle": [
            chunk_shuffle_quality(
                store, args.split, batch_rays=args.batch_rays, chunks_per_batch=k, n_batches=args.batches
            )
            for k in args.chunks
        ],
        "read": read_throughput(store, args.split),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
