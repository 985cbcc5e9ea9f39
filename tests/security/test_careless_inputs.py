"""Careless inputs of issue 60 (medium cases): each one ``raykit: error:`` line and exit status 2, never a
traceback, and no user file lost: ``evaluate --device``, ``train --seed 2**62``, ``add-component
--depth-scale 1e-300``, a flat folder of one split's masks, ``scene make`` into the user's folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import raykit.cli
from raykit.converters import convert
from raykit.ranges import SEED
from raykit.store import open_store
from raykit.testing import render_scene, write_blender, write_nerfstudio


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    status = raykit.cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2, lines
    assert len(lines) == 1 and lines[0].startswith("raykit: error: ") and needle in lines[0], lines


def _digests(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def scene():
    return render_scene("tiny", seed=0)


def test_evaluate_device_is_checked_first(tmp_path: Path, capsys) -> None:
    for name in ("pred", "gt"):
        (tmp_path / name).mkdir()
        Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / name / "r_0.png")
    argv = ["evaluate", str(tmp_path / "pred"), str(tmp_path / "gt"), "--no-lpips"]
    _one_line(capsys, [*argv, "--device", "bogus"], "--device: expected cpu, cuda or cuda:N, got 'bogus'")
    import torch

    if not torch.cuda.is_available():
        _one_line(capsys, [*argv, "--device", "cuda"], "CUDA is not available")


def test_seed_range_is_what_the_trainer_takes(tmp_path: Path, capsys) -> None:
    import torch

    assert SEED.contains(2**32 - 1) and not SEED.contains(2**32) and not SEED.contains(-1)
    top = int(SEED.high or 0)
    torch.Generator().manual_seed(top * 1_000_003 + 999_983)  # the trainer's derived seeds fit
    np.random.RandomState(top)  # and numpy's legacy seeding
    for command in (["train", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "run")],
                    ["run", str(tmp_path), str(tmp_path / "out")]):  # fmt: skip
        _one_line(capsys, [*command, "--seed", str(2**62)], "seed: expected an integer in [0, 4294967295]")
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def ns_store(scene, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a store without components, a nerfstudio capture with masks and depth of the same scene)."""
    root = tmp_path_factory.mktemp("careless")
    plain = write_nerfstudio(scene, root / "plain", masks=False, depth=False, metadata=False)
    full = write_nerfstudio(scene, root / "full", depth_format="npy")
    convert(plain, root / "s", layout="images", progress=False)
    return root / "s", full


def test_depth_scale_that_underflows_is_refused(ns_store: tuple[Path, Path], capsys) -> None:
    store, full = ns_store
    before = _digests(store)
    argv = ["add-component", str(store), "depth", str(full / "depth")]
    for scale in ("1e-300", "1e300", "0", "-1", "nan"):
        _one_line(capsys, [*argv, "--depth-scale", scale], "--depth-scale: expected a finite number in")
    _one_line(capsys, [*argv, "--depth-scale", "1e-6", "--dtype", "float16"], "--depth-scale")
    assert _digests(store) == before


def test_depth_values_lost_to_the_scale_are_refused(tmp_path: Path) -> None:
    from raykit.converters.components import read_component_file
    from raykit.errors import SourceError

    np.save(tmp_path / "d.npy", np.array([[0.0, 1e-20], [2.0, 3.0]], dtype=np.float64))
    with pytest.raises(SourceError, match=r"d\.npy: depth 1e-20 times the scale 1e-30"):
        read_component_file(tmp_path / "d.npy", "depth", 1e-30)
    kept = read_component_file(tmp_path / "d.npy", "depth", 1.0)  # 1e-20 fits float32
    assert kept[0, 1] > 0


def test_flat_masks_of_one_split_are_not_given_to_another(scene, tmp_path: Path, capsys) -> None:
    """Blender names images ``train/r_0.png`` and ``test/r_0.png``: a flat folder's ``r_0.png`` could be
    either's mask, so it is refused; masks in ``SPLIT/`` folders match by split and name."""
    write_blender(scene, tmp_path / "cap")
    store = convert(tmp_path / "cap", tmp_path / "s.zarr", progress=False)
    names = store.table.names
    assert "train/r_0.png" in names and "test/r_0.png" in names
    flat, split = tmp_path / "flat", tmp_path / "bysplit"
    flat.mkdir()
    for row, name in enumerate(names):
        h, w = int(store.table.height[row]), int(store.table.width[row])
        value = 255 if name.startswith("train/") else 0
        if name.startswith("train/"):
            Image.fromarray(np.full((h, w), value, np.uint8)).save(flat / Path(name).name)
        (split / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((h, w), value, np.uint8)).save(split / name)
    before = _digests(tmp_path / "s.zarr")
    _one_line(capsys, ["add-component", str(tmp_path / "s.zarr"), "masks", str(flat)], "other splits share")
    assert _digests(tmp_path / "s.zarr") == before
    assert raykit.cli.main(["add-component", str(tmp_path / "s.zarr"), "masks", str(split)]) == 0
    added = open_store(tmp_path / "s.zarr")
    assert added.read_component("mask", "train/r_0.png").min() == 255
    assert added.read_component("mask", "test/r_0.png").max() == 0


def test_scene_make_never_overwrites_the_users_files(tmp_path: Path, capsys) -> None:
    mine = tmp_path / "capture"
    mine.mkdir()
    (mine / "transforms_train.json").write_text('{"the user": "file"}')
    _one_line(
        capsys, ["scene", "make", str(mine)], "transforms_train.json: a file `raykit scene make` did not"
    )
    assert [p.name for p in mine.iterdir()] == ["transforms_train.json"]
    assert (mine / "transforms_train.json").read_text() == '{"the user": "file"}'
    ours = tmp_path / "scene"
    assert raykit.cli.main(["scene", "make", str(ours)]) == 0
    assert raykit.cli.main(["scene", "make", str(ours), "--seed", "1"]) == 0  # its own files: rewritten
    capsys.readouterr()
    (ours / "train" / "r_0.png").write_bytes(b"edited by the user")
    _one_line(
        capsys, ["scene", "make", str(ours)], "r_0.png: a file `raykit scene make` did not write (or changed"
    )
    assert (ours / "train" / "r_0.png").read_bytes() == b"edited by the user"
    shutil.rmtree(ours)
    os.symlink(tmp_path / "capture" / "transforms_train.json", tmp_path / "alink")
    _one_line(capsys, ["scene", "make", str(tmp_path / "alink")], "alink: not a folder")
