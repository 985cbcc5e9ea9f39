"""Numbers at the boundaries (docs/reliability.md, "Bad input"): command-line options, loader arguments
and run files are checked against their expected ranges (:mod:`raykit.ranges`) before anything starts
or is written; each bad value is one ``raykit: error:`` line naming the option and the problem."""

from __future__ import annotations

import json
import math
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

import raykit.cli
from raykit.errors import ConfigError
from raykit.loaders import ImageLoader, RayLoader
from raykit.ranges import Range, image_size_problem, max_workers, range_problems

from .conftest import build_store


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small store, a folder, and two runs' eval.json files (one with a PSNR that is a string)."""
    root = tmp_path_factory.mktemp("bad_numbers")
    build_store(root / "s.zarr")
    (root / "adir").mkdir()
    for name, psnr in (("run_a", 20.5), ("run_b", "abc")):
        (root / name).mkdir()
        (root / name / "eval.json").write_text(json.dumps({"splits": {"test": {"psnr": psnr, "ssim": 0.5}}}))
    return root


def _fails(work: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    """``raykit argv`` exits 2 with one error line holding ``needle``, no traceback, nothing written."""
    args = [a.format(w=work) for a in argv]
    before = sorted(p.name for p in work.rglob("*"))
    try:
        status = raykit.cli.main(args)
    except BaseException:
        pytest.fail(f"raykit {' '.join(args)} raised:\n{traceback.format_exc()}")
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("raykit: error: "), lines
    assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in captured.err + captured.out
    assert sorted(p.name for p in work.rglob("*")) == before  # no run folder, no report, no temp file


_TRAIN = ["train", "{w}/s.zarr", "--out", "{w}/run", "--steps", "2"]
CLI_CASES = [
    ([*_TRAIN, "--max-seconds", "nan"], "--max-seconds: expected a finite number > 0, got nan"),
    ([*_TRAIN, "--max-seconds", "inf"], "--max-seconds: expected a finite number > 0, got inf"),
    ([*_TRAIN, "--lr", "nan"], "--lr: expected a finite number > 0, got nan"),
    ([*_TRAIN, "--aabb", "nan,0,0,1,1,1"], "--aabb: expected XMIN,YMIN,ZMIN,XMAX,YMAX,ZMAX (finite numbers)"),
    ([*_TRAIN, "--num-workers", "1000000"], f"--num-workers: expected an integer in [0, {max_workers()}]"),
    (
        [*_TRAIN, "--eval-splits", "nope"],
        "--eval-splits: {w}/s.zarr has no split 'nope' (it has train, test)",
    ),
    ([*_TRAIN, "--train-split", "nope"], "--train-split: {w}/s.zarr has no split 'nope'"),
    (["bench", "{w}/s.zarr", "--split", "nope"], "--split: {w}/s.zarr has no split 'nope'"),
    (["bench", "{w}/s.zarr", "--cache-mb", "nan"], "--cache-mb: expected a finite number >= 0, got nan"),
    (["bench", "{w}/s.zarr", "--batches", "0"], "--batches: expected an integer >= 1, got 0"),
    (["bench", "{w}/s.zarr", "--json", "{w}/adir"], "--json {w}/adir: a directory is there"),
    (["bench", "{w}/s.zarr", "--png", "{w}/nowhere/x.png"], "--png {w}/nowhere/x.png: its folder"),
    (
        ["compare", "{w}/run_a", "{w}/run_b"],
        "run_b/eval.json: splits.test.psnr: expected a finite number, got 'abc'",
    ),
]


@pytest.mark.parametrize(
    ("argv", "needle"), CLI_CASES, ids=[" ".join(a).replace("{w}/", "") for a, _ in CLI_CASES]
)
def test_bad_option_is_one_line_and_writes_nothing(
    work: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    _fails(work, capsys, argv, needle.format(w=work))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_one_line(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(
        work,
        capsys,
        ["bench", "{w}/s.zarr", "--device", "cuda"],
        "--device: expected cpu (CUDA is not available",
    )
    for loader in (RayLoader, ImageLoader):
        with pytest.raises(ConfigError, match=r"device: expected cpu \(CUDA is not available"):
            loader(str(work / "s.zarr"), "train", device="cuda")


@pytest.mark.parametrize("loader", [RayLoader, ImageLoader])
@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"seed": None}, "loader: seed: expected an integer >= 0, got None"),
        ({"batch_size": None}, "loader: batch_size: expected an integer >= 1, got None"),
        ({"batch_size": float("nan")}, "loader: batch_size: expected an integer >= 1, got nan (float)"),
        (
            {"num_workers": 10**6},
            f"loader: num_workers: expected an integer in [0, {max_workers()}], got 1000000",
        ),
        ({"device": "tpu"}, "loader: device: expected cpu, cuda or cuda:N, got 'tpu'"),
    ],
)
def test_bad_loader_argument_is_a_config_error_before_any_worker(
    work: Path, loader: Any, kwargs: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        loader(str(work / "s.zarr"), "train", **kwargs)
    assert needle in str(info.value)


def test_range_is_the_one_check() -> None:
    """Integers are not bools or floats; numbers are finite; bounds open or closed as declared; a
    100,000-digit number is shown short."""
    count = Range(1, integer=True)
    assert (
        count.contains(3) and not count.contains(True) and not count.contains(3.0) and not count.contains(0)
    )
    assert count.problem("n", None) == "n: expected an integer >= 1, got None"
    assert Range(1, integer=True, optional=True).contains(None)
    angle = Range(0, math.pi, low_open=True, high_open=True)
    assert angle.contains(1.0) and not angle.contains(math.pi) and not angle.contains(0.0)
    assert angle.describe() == "a finite number in (0, 3.14159)"
    for value in (float("nan"), float("inf"), "1", [1]):
        assert not Range().contains(value)
    huge = 10**100_000
    assert not Range(0, 8, integer=True).contains(huge) and Range(0, integer=True).contains(huge)
    line = Range(0, 8, integer=True).problem("num_workers", huge)
    assert line is not None and len(line) < 150 and "an integer of about 100001 digits" in line
    assert "(502 characters) (str)" in str(Range().problem("x", "7" * 500))
    assert range_problems({"a": (1, count), "b": (0, count)}) == ["b: expected an integer >= 1, got 0"]
    assert image_size_problem(640, 480) is None
    assert "width: expected an integer in [1, 65535], got 200000" in str(image_size_problem(200000, 200000))
    assert "expected at most 178,956,970 pixels" in str(image_size_problem(50000, 50000))
