"""Shuffle quality of a split: how close batches built from whole chunks are to iid samples.

A loader that reads ``k`` random chunks and draws a batch from their rays is compared with an ideal
loader drawing the batch uniformly from the whole split. Two figures per batch: the number of distinct
images, and the total-variation distance between the batch's image histogram and the split's.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from raykit.store.reader import RayStore, open_store

__all__ = ["main", "read_throughput", "shuffle_quality"]


def _batch_stats(image: np.ndarray, share: np.ndarray) -> tuple[int, float]:
    counts = np.bincount(image, minlength=len(share)) / max(len(image), 1)
    return int(np.count_nonzero(counts)), 0.5 * float(np.abs(counts - share).sum())


def shuffle_quality(
    store: RayStore,
    split: str = "train",
    *,
    batch_rays: int = 4096,
    chunks_per_batch: int = 1,
    n_batches: int = 32,
    seed: int = 0,
) -> dict[str, Any]:
    """Mean distinct images and mean TV distance per batch: chunk-built batches vs iid batches.

    Returns:
        ``{"chunked": {"distinct", "tv"}, "iid": {"distinct", "tv"}, "distinct_ratio", ...}``.
    """
    info = store.splits[split]
    table = store.table
    rows = np.flatnonzero(np.array(table.splits) == split)
    share = table.n_pixels[rows] / info.n_rays
    first = int(rows[0])
    rng = np.random.default_rng(seed)
    chunked, iid = [], []
    for _ in range(n_batches):
        picks = rng.choice(info.n_chunks, size=min(chunks_per_batch, info.n_chunks), replace=False)
        pid = np.concatenate([store.read_chunk(split, int(i)).pid for i in picks])
        batch = rng.choice(pid, size=min(batch_rays, len(pid)), replace=False)
        chunked.append(_batch_stats(store.decode_pids(batch)[0] - first, share))
        ideal = rng.choice(info.n_rays, size=len(batch), replace=False) + info.pid_start
        iid.append(_batch_stats(store.decode_pids(ideal.astype(np.uint32))[0] - first, share))
    c, i = np.mean(chunked, axis=0), np.mean(iid, axis=0)
    return {
        "split": split,
        "batch_rays": batch_rays,
        "chunks_per_batch": chunks_per_batch,
        "n_batches": n_batches,
        "n_images": len(rows),
        "chunked": {"distinct": float(c[0]), "tv": float(c[1])},
        "iid": {"distinct": float(i[0]), "tv": float(i[1])},
        "distinct_ratio": float(c[0] / i[0]),
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
    """``python -m raykit.store.stats STORE``: shuffle quality per chunks-per-batch and read throughput."""
    parser = argparse.ArgumentParser(prog="python -m raykit.store.stats", description=__doc__)
    parser.add_argument("store")
    parser.add_argument("--split", default="train")
    parser.add_argument("--batch-rays", type=int, default=4096)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batches", type=int, default=32)
    args = parser.parse_args(argv)
    store = open_store(args.store)
    report = {
        "shuffle": [
            shuffle_quality(
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
