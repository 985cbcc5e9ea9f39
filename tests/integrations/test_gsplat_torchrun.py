"""The gsplat adapter under a real ``torchrun --nproc-per-node 2`` (gloo, CPU): each rank's share of
every epoch is disjoint from the other's, through the ``Dataset`` and its ``loader()`` alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raykit.converters import convert
from raykit.testing import render_scene, write_colmap

RANK_SCRIPT = Path(__file__).with_name("gsplat_rank.py")
WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    root = tmp_path_factory.mktemp("gsplat_torchrun")
    write_colmap(render_scene("tiny", camera_model="OPENCV"), root / "capture", alpha=False)
    convert(root / "capture", root / "scene.zarr", layout="images")
    out = root / "out"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
               str(RANK_SCRIPT), str(root / "scene.zarr"), str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_each_rank_gets_a_disjoint_share_of_every_epoch(ranks: list[dict]) -> None:
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == WORLD for r in ranks)
    split_rows = ranks[0]["split_rows"]
    n = len(split_rows)
    assert n >= 2 * WORLD
    for epoch in range(2):
        shares = [r["ids"][epoch] for r in ranks]
        assert all(len(share) == len(set(share)) == n // WORLD for share in shares)
        assert not set(shares[0]) & set(shares[1])  # no image seen twice in the epoch
        assert set().union(*shares) <= set(range(n))
        rows = [r["rows"][epoch] for r in ranks]  # the loader(): the same shares, as store rows
        assert all(len(share) == len(set(share)) for share in rows)
        assert not set(rows[0]) & set(rows[1])
        assert [set(share) for share in rows] == [{split_rows[i] for i in share} for share in shares]
    assert [set(r["ids"][0]) for r in ranks] != [set(r["ids"][1]) for r in ranks]  # shares drawn anew
