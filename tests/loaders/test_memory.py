"""Peak memory stays near the cache budget plus a constant, whatever the store size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raykit.store import SceneInfo, write_store

from .conftest import make_records

PROBE = Path(__file__).with_name("rss_probe.py")
MB = 1 << 20


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """8 M rays (24-32 MB decoded: format 3 caches colours only, 3-4 bytes per ray), 16 K rays per chunk."""
    path = tmp_path_factory.mktemp("big") / "store"
    return write_store(
        path, make_records(32, 0, 500, 500), scene=SceneInfo(), chunk_rays=16384, shard_chunks=8
    )


def _probe(url: str, cache_bytes: int) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, str(PROBE), url, str(cache_bytes)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


def test_peak_rss_is_bounded_by_the_cache_budget(big_store: Any) -> None:
    decoded = big_store.splits["train"].n_rays * big_store.rgba_channels  # the cached bytes (no pids)
    budget = 2 * MB
    bounded = _probe(big_store.url, budget)
    assert bounded["cache_bytes"] <= budget
    growth = bounded["peak"] - bounded["baseline"]
    assert growth <= budget + 12 * MB, f"grew {growth / MB:.1f} MB on a {decoded / MB:.0f} MB store"
    # The constant: mixing windows, generated groups (gen_threads x group_rays, kept small by the probe),
    # prefetched batches (views of their group), decoder buffers, allocator slack.
    # Control: with a budget that holds the whole split, memory does grow by about the split's size,
    # so the probe is sensitive enough to see an unbounded loader.
    unbounded = _probe(big_store.url, 4 * decoded)
    assert unbounded["peak"] - unbounded["baseline"] >= 0.8 * decoded > budget + 12 * MB
