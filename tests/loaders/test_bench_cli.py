"""``raykit bench`` through its register()/handler, and the shuffle-quality figure."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.profiling import cli
from raykit.profiling.mixing import expected_distinct_images, shuffle_quality


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raykit")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_bench_command_writes_json_and_png(stores: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    args = _parser().parse_args(
        [
            "bench",
            stores["wds"].url,
            "--batch-size",
            "64",
            "--batches",
            "10",
            "--cache-mb",
            "1",
            "--json",
            str(tmp_path / "r.json"),
            "--png",
            str(tmp_path / "r.png"),
        ]
    )
    assert args.func(args) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["backend"] == "wds" and report["settings"]["batch_size"] == 64
    for run in ("cold", "warm"):
        assert report[run]["rays_per_s"] > 0 and report[run]["first_batch_s"] > 0
    assert {"read", "gather", "generate", "h2d"} <= set(report["stages"]) and report["stages"]["h2d"] is None
    assert 0 < report["shuffle_quality"]["ratio"] <= 1.5
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert "end-to-end warm" in capsys.readouterr().out


def test_shuffle_quality_of_uniform_and_sorted_batches() -> None:
    sizes = np.full(20, 500)
    rng = np.random.default_rng(0)
    pixel_image = np.repeat(np.arange(20), 500)
    uniform = [pixel_image[rng.choice(10_000, 256, replace=False)] for _ in range(50)]
    good = shuffle_quality(uniform, sizes)
    assert good["ratio"] == pytest.approx(1.0, abs=0.05) and good["tv_ratio"] == pytest.approx(1.0, abs=0.25)
    sorted_batches = [pixel_image[i * 256 : (i + 1) * 256] for i in range(30)]
    bad = shuffle_quality(sorted_batches, sizes)
    assert bad["ratio"] < 0.2 and bad["tv_ratio"] > 5
    assert expected_distinct_images(np.array([1, 1]), 1) == pytest.approx(1.0)
