"""Peak-memory probe (run as a script: ``python rss_probe.py URL CACHE_BYTES``); prints JSON.

Reports the resident set size after the loader produced its first batch (``baseline``) and the largest
one sampled after every batch of two full epochs (``peak``), in bytes.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from raykit.loaders import RayLoader
from raykit.store import open_store


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(url: str, cache_bytes: int) -> None:
    torch.set_num_threads(1)
    loader = RayLoader(
        open_store(url),
        "train",
        batch_size=4096,
        seed=0,
        cache_bytes=cache_bytes,
        mix_chunks=2,
        group_rays=8192,
        prefetch=2,
        gen_threads=1,
    )
    batches = loader.forever()
    next(batches)
    baseline = peak = _rss()
    for _ in range(2 * len(loader)):
        next(batches)
        peak = max(peak, _rss())
    stats = loader.cache_stats()
    print(
        json.dumps({"baseline": baseline, "peak": peak, "cache_bytes": stats.bytes, "misses": stats.misses})
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
