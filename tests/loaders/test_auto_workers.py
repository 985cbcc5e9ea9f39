"""``num_workers="auto"``: the choice follows the cores, the layout and where the store is, and says why."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from raykit.errors import ConfigError
from raykit.loaders import LoaderConfig, MemorySource, RayLoader
from raykit.loaders.auto import MAX_AUTO_WORKERS, MIN_AUTO_CHUNKS, choose_workers, usable_cores

MANY = MIN_AUTO_CHUNKS * 4


@pytest.mark.parametrize("layout", ["rays", "images"])
def test_two_cores_never_get_workers(layout: str) -> None:
    # On 2 cores 2 workers were slower than none (BENCHMARKS.md, issue 26): the generation threads
    # and the consumer already take them.
    for url in ("/data/store", "s3://bucket/store"):
        n, why = choose_workers(url, MANY, layout, gen_threads=2, cores=2)
        assert n == 0 and "2 usable cores" in why


def test_workers_where_they_pay_and_never_more_than_the_spare_cores() -> None:
    assert choose_workers("/data/store", MANY, "images", 2, 16) == (
        MAX_AUTO_WORKERS,
        f"auto: {MAX_AUTO_WORKERS} workers: image decoding on 13 cores beyond the generation threads "
        "and the consumer",
    )
    assert choose_workers("/data/store", MANY, "images", 2, 5)[0] == 2
    assert choose_workers("s3://bucket/store", MANY, "rays", 2, 8)[0] == MAX_AUTO_WORKERS
    n, why = choose_workers("/data/store", MANY, "rays", 2, 16)  # local chunks decode fast
    assert n == 0 and "10-25x" in why
    n, why = choose_workers("/data/store", MIN_AUTO_CHUNKS - 1, "images", 2, 16)
    assert n == 0 and "fewer than" in why
    assert choose_workers(None, MANY, "rays", 2, 16)[0] == 0


def test_the_loader_records_its_choice(stores: dict[str, Any]) -> None:
    loader = RayLoader(stores["zarr"], batch_size=64)
    assert loader.config.num_workers == "auto" and loader.num_workers == 0
    assert loader.workers_reason.startswith("auto: 0 workers")
    assert usable_cores() >= 1
    given = RayLoader(stores["zarr"], batch_size=64, num_workers=1)
    assert (given.num_workers, given.workers_reason) == (1, "given")
    memory = RayLoader(
        MemorySource(np.zeros((64, 4), np.uint8), np.arange(64, dtype=np.uint32), 16), batch_size=16
    )
    assert memory.num_workers == 0 and "not a store" in memory.workers_reason
    with pytest.raises(ConfigError, match=r"num_workers: expected an integer in \[0, \d+\], got 'many'"):
        LoaderConfig(num_workers="many")
