"""``raykit scene make`` through its register() hook."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from raykit.colmap_io import read_model
from raykit.testing.cli import register


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raykit")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_scene_make_blender(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["scene", "make", str(tmp_path / "b"), "--size", "tiny", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "12 views" in out and "blender" in out
    assert (tmp_path / "b" / "transforms_train.json").is_file() and (
        tmp_path / "b" / "test" / "r_1.png"
    ).is_file()


def test_scene_make_colmap_text_opencv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["scene", "make", str(tmp_path / "c"), "--format", "colmap-text", "--camera-model", "OPENCV"]
    assert _run(argv) == 0
    assert "OPENCV" in capsys.readouterr().out
    assert (tmp_path / "c" / "sparse" / "0" / "cameras.txt").is_file()
    assert read_model(tmp_path / "c" / "sparse" / "0").cameras[1].model == "OPENCV"


def test_scene_make_dnerf_writes_the_dynamic_scene(tmp_path: Path, dnerf: dict) -> None:
    """The same files as the test kit's D-NeRF capture (the ``dnerf`` fixture, seed 0)."""
    assert _run(["scene", "make", str(tmp_path / "d"), "--format", "dnerf"]) == 0
    for split in ("train", "val", "test"):
        name = f"transforms_{split}.json"
        assert (tmp_path / "d" / name).read_bytes() == (dnerf["capture"] / name).read_bytes()
    assert (tmp_path / "d" / "train" / "c1_t5.png").read_bytes() == (
        dnerf["capture"] / "train" / "c1_t5.png"
    ).read_bytes()


def test_scene_make_rejects_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        _run(["scene", "make", str(tmp_path), "--format", "ply"])
