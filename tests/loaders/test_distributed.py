"""Two real torch.distributed (gloo) ranks: disjoint, balanced shares with equal batch counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

WORLD = 2
RANK_SCRIPT = Path(__file__).with_name("dist_rank.py")


@pytest.fixture(scope="module")
def rank_results(stores: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run both ranks once (one epoch with drop_last False, then True); their outputs' directory."""
    out = tmp_path_factory.mktemp("ranks")
    url = stores["zarr"].url
    procs = [
        subprocess.Popen([sys.executable, str(RANK_SCRIPT), str(r), str(WORLD), url, str(out)])
        for r in range(WORLD)
    ]
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0] * WORLD
    return out


@pytest.mark.parametrize("drop_last", [False, True])
def test_two_gloo_ranks_partition_the_split(
    stores: dict[str, Any], rank_results: Path, drop_last: bool
) -> None:
    store = stores["zarr"]
    results = [np.load(rank_results / f"rank{r}_{int(drop_last)}.npz") for r in range(WORLD)]
    assert all(int(r["world"][0]) == WORLD for r in results)  # taken from torch.distributed
    assert all(list(r["counts"]) == list(results[0]["counts"]) for r in results)
    assert len(set(results[0]["counts"].tolist())) == 1  # equal batch counts on every rank
    assert len(results[0]["sizes"]) == len(results[1]["sizes"]) == results[0]["counts"][0]
    union = np.concatenate([r["pids"] for r in results])
    assert len(np.unique(union)) == len(union)  # no ray twice
    split = store.read("train", 0, store.splits["train"].n_rays).pid
    if drop_last:
        assert all((r["sizes"] == 96).all() for r in results)
        assert np.isin(union, split).all()
    else:
        np.testing.assert_array_equal(np.sort(union), np.sort(split))  # the union is the split
    shares = [len(r["pids"]) for r in results]
    assert max(shares) - min(shares) <= 1


def test_two_gloo_ranks_share_one_loss_map_and_draw_their_own_streams(
    stores: dict[str, Any], tmp_path: Path
) -> None:
    script = Path(__file__).with_name("dist_loss_rank.py")
    url = stores["zarr"].url
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(WORLD), url, str(tmp_path)])
             for r in range(WORLD)]  # fmt: skip
    assert [p.wait(timeout=120) for p in procs] == [0] * WORLD
    results = [np.load(tmp_path / f"loss{r}.npz") for r in range(WORLD)]
    assert all(int(r["rebuilds"][0]) >= 3 for r in results)
    np.testing.assert_array_equal(results[0]["est"], results[1]["est"])  # one map, reduced
    assert not np.array_equal(results[0]["pids"], results[1]["pids"])  # each rank its own stream
