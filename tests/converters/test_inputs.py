"""The input rules of ``docs/inputs.md``: contained paths, every problem listed, EXIF ``auto``, fallbacks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import raykit.cli
from raykit.converters import convert
from raykit.errors import SourceError
from raykit.store import open_store

MODULE = "raykit.converters.cli"


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run ``raykit ...`` in-process; returns (status, stderr lines)."""
    if MODULE not in raykit.cli.COMMAND_MODULES:
        monkeypatch.setattr(raykit.cli, "COMMAND_MODULES", (*raykit.cli.COMMAND_MODULES, MODULE))

    def run(*argv: object) -> tuple[int, list[str]]:
        status = raykit.cli.main([str(a) for a in argv])
        return status, capsys.readouterr().err.strip().splitlines()

    return run


def _nothing_written(dst: Path) -> bool:
    return not dst.exists() and not dst.with_name(dst.name + ".partial").exists()


# ---- 1. image paths stay inside the capture ---------------------------------------------------------


def test_transforms_paths_outside_the_capture_are_listed(tmp_path: Path, make, cli) -> None:
    make.write_image(tmp_path / "elsewhere" / "x.png", make.random_image(9, 4, 6))
    root = tmp_path / "cap"
    frames = [make.ngp_frame(root, i, (6, 4)) for i in range(4)]
    frames[0]["file_path"] = "../elsewhere/x.png"
    other = make.write_image(tmp_path / "elsewhere" / "y.png", make.random_image(8, 4, 6))
    frames[1]["file_path"] = str(other)  # absolute
    frames[2]["file_path"] = "/etc/passwd"
    (root / "images" / "f_3.png").unlink()
    (root / "images" / "f_3.png").symlink_to(
        make.write_image(tmp_path / "elsewhere" / "z.png", make.random_image(7, 4, 6))
    )  # a symlink leaving the folder
    make.ngp(root, frames, fl_x=5.0)
    dst = tmp_path / "out.zarr"
    status, lines = cli("convert", root, dst, "--no-progress")
    assert status == 2 and len(lines) == 4, lines
    assert all("outside the capture folder" in line and "--allow-outside" in line for line in lines)
    assert [line.split("frame ")[1][0] for line in lines] == ["0", "1", "2", "3"]
    assert _nothing_written(dst)
    # An explicit --allow-outside lets the sibling folder in, and nothing else.
    status, lines = cli("convert", root, dst, "--no-progress", "--allow-outside", tmp_path / "elsewhere")
    assert status == 2 and len(lines) == 1 and "/etc/passwd" in lines[0]
    del frames[2]
    make.ngp(root, frames, fl_x=5.0)
    assert cli("convert", root, dst, "--no-progress", "--allow-outside", tmp_path / "elsewhere")[0] == 0
    assert open_store(dst).splits["train"].n_images + open_store(dst).splits["test"].n_images == 3


def test_blender_and_colmap_names_with_dotdot_are_refused(tmp_path: Path, make) -> None:
    src = make.blender(tmp_path / "bl", counts={"train": 2})
    make.write_image(tmp_path / "r_9.png", make.random_image(1, 6, 8, 4))
    meta = json.loads((src / "transforms_train.json").read_text())
    meta["frames"][1]["file_path"] = "./../r_9"
    (src / "transforms_train.json").write_text(json.dumps(meta))
    with pytest.raises(SourceError) as info:
        convert(src, tmp_path / "a.zarr")
    assert len(info.value.problems) == 1 and "'./../r_9'" in info.value.problems[0]

    rec = make.colmap(tmp_path / "col", ["PINHOLE"], seed=3, binary=False)
    image_id = sorted(rec.images)[0]
    name = rec.images[image_id].name
    model = tmp_path / "col" / "sparse" / "0"
    text = (model / "images.txt").read_text().replace(f" {name}\n", f" ../{name}\n")
    (model / "images.txt").write_text(text)
    os.replace(tmp_path / "col" / "images" / name, tmp_path / "col" / name)
    with pytest.raises(SourceError) as info:
        convert(tmp_path / "col", tmp_path / "b.zarr")
    assert len(info.value.problems) == 1 and f"'../{name}'" in info.value.problems[0]
    assert "outside the capture folder" in info.value.problems[0]
    store = convert(tmp_path / "col", tmp_path / "b.zarr", allow_outside=[tmp_path / "col"])
    assert f"../{name}" in store.table.names
