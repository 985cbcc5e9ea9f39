"""Peak-memory probe (run as a script: ``python rss_probe.py URL CACHE_BYTES``); prints JSON.

Reports the peak resident set size after the loader produced its first batch (``baseline``) and after
two full epochs (``peak``), in bytes.
"""

from __future__ import annotations

import json
import resource
import sys

import torch

from raykit.loaders import RayLoader
from raykit.store import open_store


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(url: str, cache_bytes: int) -> None:
    torch.set_num_threads(1)
    loader = RayLoader(open_store(url), "train", batch_size=4096, seed=0, cache_bytes=cache_bytes,
                       mix_chunks=2, group_rays=16384, prefetch=2)
    batches = loader.forever()
    next(batches)
    baseline = _peak_rss()
    for _ in range(2 * len(loader)):
        next(batches)
    stats = loader.cache_stats()
    print(json.dumps({"baseline": baseline, "peak": _peak_rss(), "cache_bytes": stats.bytes,
                      "misses": stats.misses}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
