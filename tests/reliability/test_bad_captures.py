"""Bad captures (docs/reliability.md, "Bad input"): degenerate cameras refused against their expected
ranges (and found by ``raykit validate`` in a store), images that declare billions of pixels or hold
huge text chunks, file paths no file system holds, many missing frames, failed pose estimation, stale
locks and a full disk: one line naming the file and the problem each, never a traceback, and nothing
at DST that looks like a result."""

from __future__ import annotations

import dataclasses
import errno
import importlib
import json
import math
import os
import shutil
import struct
import sys
import traceback
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import raykit.cli
import raykit.fileio
from raykit.colmap_io import read_model, write_model
from raykit.errors import SourceError
from raykit.fileio import sha256_file
from raykit.store.files import json_digest
from raykit.testing import render_scene, write_blender, write_colmap
from raykit.trainer.deploy import transforms_views


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def declared_png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` RGB pixels (its pixel data is a few bytes)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(b"\0" * 16)) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def with_ztxt(png: bytes, size: int = 50_000_000) -> bytes:
    """``png`` with a zTXt chunk that inflates to ``size`` bytes, right after the header (50 KB on disk)."""
    return png[:33] + _chunk(b"zTXt", b"comment\0\0" + zlib.compress(b"a" * size)) + png[33:]


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The built-in tiny scene as a Blender, an instant-ngp and a COLMAP capture, and as photos."""
    root = tmp_path_factory.mktemp("bad_captures")
    scene = render_scene("tiny", seed=0)
    blender = write_blender(scene, root / "blender")
    ngp = root / "ngp"
    shutil.copytree(blender, ngp)
    meta = json.loads((ngp / "transforms_train.json").read_text())
    for name in ("transforms_train.json", "transforms_val.json", "transforms_test.json"):
        (ngp / name).unlink()
    (ngp / "transforms.json").write_text(json.dumps({**meta, "aabb_scale": 4}))
    photos = root / "photos"
    photos.mkdir()
    for image in sorted((blender / "train").glob("*.png")):
        shutil.copy(image, photos / image.name)
    return {"blender": blender, "ngp": ngp, "colmap": write_colmap(scene, root / "colmap"), "photos": photos}


def _copy(captures: dict[str, Path], kind: str, dst: Path) -> Path:
    shutil.copytree(captures[kind], dst)
    return dst


def _convert(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], list[str]]:
    """``raykit convert ARGS --no-progress`` in this process: (status, error lines, warning lines)."""
    try:
        status = raykit.cli.main(["convert", *args, "--no-progress"])
    except BaseException:
        pytest.fail(f"raykit convert {' '.join(args)} raised:\n{traceback.format_exc()}")
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "Warning:" not in captured.err, captured.err  # no raw warning
    lines = captured.err.strip().splitlines()
    assert all(line.startswith(("raykit: error: ", "raykit: warning: ")) for line in lines), lines
    errors = [line for line in lines if line.startswith("raykit: error: ")]
    return status, errors, [line for line in lines if line.startswith("raykit: warning: ")]


def _refused(
    capsys: pytest.CaptureFixture[str], src: Path, dst: Path, *needles: str, flags: tuple[str, ...] = ()
) -> str:
    """Convert ``src`` -> ``dst``: status 2, one error line holding every needle, nothing at DST."""
    status, errors, _ = _convert(capsys, str(src), str(dst), *flags)
    assert status == 2 and len(errors) == 1, errors
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(dst.name)], "something left at DST"
    return errors[0]


def _edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(
    ("kind", "changes", "needles"),
    [
        (
            "blender",
            {"camera_angle_x": math.pi},
            ["camera_angle_x: expected a finite number in (0, 3.14159), got 3.14"],
        ),
        (
            "blender",
            {"camera_angle_x": 0.0},
            ["camera_angle_x: expected a finite number in (0, 3.14159), got 0.0"],
        ),
        (
            "blender",
            {"camera_angle_x": 3.1415926},
            ["focal length fx, fy: expected a finite number in [0.048, 4.8e+06] pixels"],
        ),
        ("ngp", {"fl_x": 1e-300, "fl_y": 40.0}, ["focal length fx: expected", "got 1e-300"]),
        (
            "ngp",
            {"aabb_scale": -4},
            ["transforms.json: aabb_scale: expected a finite number in (0, 1e+06], got -4"],
        ),
        (
            "ngp",
            {"aabb_scale": 0},
            ["transforms.json: aabb_scale: expected a finite number in (0, 1e+06], got 0"],
        ),
        ("ngp", {"scale": 0}, ["transforms.json: scale: expected a finite number in (0, 1e+06], got 0"]),
    ],
    ids=["angle-pi", "angle-0", "angle-near-pi", "fl_x-1e-300", "aabb_scale-4", "aabb_scale0", "scale0"],
)
def test_degenerate_transforms_camera_is_refused(
    captures: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    changes: dict,
    needles: list[str],
) -> None:
    src = _copy(captures, kind, tmp_path / "src")
    for path in src.glob("transforms*.json"):
        _edit_json(path, **changes)
    status, errors, _ = _convert(capsys, str(src), str(tmp_path / "dst.zarr"))
    assert status == 2 and 1 <= len(errors) <= 3, errors  # one line per transforms file at most
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    assert "transforms" in errors[0]  # names the file
    assert not (tmp_path / "dst.zarr").exists() and not (tmp_path / "dst.zarr.partial").exists()


@pytest.mark.parametrize("qvec", [(1e308, 1e308, 0.0, 0.0), (1e-300, 0.0, 0.0, 0.0)], ids=["huge", "tiny"])
def test_degenerate_colmap_quaternion_is_refused(
    captures: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], qvec: tuple[float, ...]
) -> None:
    src = _copy(captures, "colmap", tmp_path / "src")
    model = src / "sparse" / "0"
    rec = read_model(model)
    first = min(rec.images)
    rec.images[first] = dataclasses.replace(rec.images[first], qvec=qvec)
    write_model(rec, model)
    _refused(
        capsys,
        src,
        tmp_path / "dst.zarr",
        "images.bin: image",
        "quaternion norm: expected a finite number in [0.5, 2]",
    )


def test_validate_checks_stored_cameras_with_the_same_ranges(
    captures: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store written before the check (its camera table signed again after the edit) is reported by
    ``raykit validate``: the camera's own check, not a copy."""
    store = tmp_path / "s.zarr"
    assert raykit.cli.main(["convert", str(captures["blender"]), str(store), "--no-progress"]) == 0
    table = pq.read_table(store / "cameras.parquet")
    data = table.to_pydict()
    data["params"] = [[1.5e-15, 1.5e-15, *p[2:]] for p in data["params"]]  # camera_angle_x = pi
    pq.write_table(pa.Table.from_pydict(data, schema=table.schema), store / "cameras.parquet")
    manifest = json.loads((store / "manifest.json").read_text())
    entry = {
        "size": (store / "cameras.parquet").stat().st_size,
        "sha256": sha256_file(store / "cameras.parquet"),
    }
    manifest["files"]["cameras.parquet"] = entry
    manifest.pop("manifest_digest")
    manifest["manifest_digest"] = json_digest(manifest)
    (store / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    for flags in ([], ["--deep"]):
        assert raykit.cli.main(["validate", str(store), *flags]) != 0
        out = capsys.readouterr().out
        assert "cameras.parquet: camera 0 (image " in out and "focal length fx, fy: expected" in out, out


def _replace_image(src: Path, kind: str, data: bytes) -> Path:
    """Put ``data`` in place of the first training image of capture ``src``."""
    first = {
        "blender": src / "train",
        "ngp": src / "train",
        "colmap": src / "images" / "train",
        "photos": src,
    }[kind]
    path = sorted(first.glob("*.png"))[0]
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", ["blender", "ngp", "colmap"])
@pytest.mark.parametrize("layout", ["rays", "images"])
@pytest.mark.parametrize("bad", ["declares-50000x50000", "50MB-zTXt"])
def test_hostile_png_is_one_line(
    captures: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
    layout: str,
    bad: str,
) -> None:
    src = _copy(captures, kind, tmp_path / "src")
    first = sorted((src / ("images/train" if kind == "colmap" else "train")).glob("*.png"))[0]
    data = declared_png(50000, 50000) if bad.startswith("declares") else with_ztxt(first.read_bytes())
    path = _replace_image(src, kind, data)
    needle = (
        "image declares 2,500,000,000 pixels; expected at most 178,956,970"
        if bad.startswith("declares")
        else ""
    )
    _refused(capsys, src, tmp_path / "dst.zarr", path.name, needle, flags=("--layout", layout))


@pytest.mark.parametrize("bad", ["declares-50000x50000", "50MB-zTXt"])
def test_hostile_png_among_photos_is_one_line_and_leaves_no_poses(
    captures: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    src = _copy(captures, "photos", tmp_path / "src")
    first = sorted(src.glob("*.png"))[0]
    data = declared_png(50000, 50000) if bad.startswith("declares") else with_ztxt(first.read_bytes())
    path = _replace_image(src, "photos", data)
    _refused(capsys, src, tmp_path / "dst.zarr", path.name, "cannot read photo", flags=("--from", "photos"))


def test_image_over_89_mpx_is_one_warning_line(
    captures: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 9500x9500 PNG (90 Mpx; its pixel data is cut short, so the conversion then fails): one raykit
    warning line, not Pillow's DecompressionBombWarning."""
    src = _copy(captures, "blender", tmp_path / "src")
    path = _replace_image(src, "blender", declared_png(9500, 9500))
    status, errors, warnings = _convert(capsys, str(src), str(tmp_path / "dst.zarr"))
    assert len(warnings) == 1 and "1 image(s) over 89 Mpx" in warnings[0] and path.name in warnings[0], (
        warnings
    )
    assert status == 2 and len(errors) == 1 and path.name in errors[0], errors


@pytest.mark.parametrize(
    ("file_path", "needles"),
    [
        (
            "train/r\x00_0",
            ["frame 0 ('./train/r_0')", "image path 'train/r\\x00_0': expected a path without NUL bytes"],
        ),
        ("a" * 5000, ["frame 0 (aaaa", "(5000 characters)", "expected a path of at most 4096 bytes"]),
    ],
    ids=["NUL", "5000-characters"],
)
def test_unusable_file_path_names_the_file_and_the_frame(
    captures: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    file_path: str,
    needles: list[str],
) -> None:
    src = _copy(captures, "ngp", tmp_path / "src")
    meta = json.loads((src / "transforms.json").read_text())
    meta["frames"][0]["file_path"] = file_path
    (src / "transforms.json").write_text(json.dumps(meta))
    line = _refused(capsys, src, tmp_path / "dst.zarr", "transforms.json: frame 0 (", *needles[1:])
    assert len(line) < 400, line


def test_many_missing_frames_are_summarised(
    captures: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _copy(captures, "ngp", tmp_path / "src")
    meta = json.loads((src / "transforms.json").read_text())
    frame = meta["frames"][0]
    meta["frames"] += [{**frame, "file_path": f"gone/{i}"} for i in range(2000)]
    (src / "transforms.json").write_text(json.dumps(meta))
    status, errors, _ = _convert(capsys, str(src), str(tmp_path / "dst.zarr"))
    assert status == 2 and len(errors) == 11, errors
    assert "frame image 'gone/0' not found" in errors[0]
    assert "1,990 more frame images not found ('gone/10' to 'gone/1999'; 2,000 in all" in errors[-1]


def test_problems_past_twenty_are_summarised_by_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from raykit.cli import _run

    def fail(args: object) -> int:
        raise SourceError([f"problem {i}" for i in range(100_000)])

    status = _run(type("Args", (), {"func": staticmethod(fail)})())
    lines = capsys.readouterr().err.strip().splitlines()
    assert (
        status == 2
        and len(lines) == 21
        and lines[-1] == "raykit: error: ... and 99,980 more problems (fix these first)"
    )


def test_failed_pose_estimation_leaves_no_poses_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("a.jpg", "b.jpg"):
        (photos / name).write_bytes(b"not a photo")
    status, errors, _ = _convert(capsys, str(photos), str(tmp_path / "p.zarr"), "--from", "photos")
    assert status == 2 and errors and all("cannot read photo" in e for e in errors), errors
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"not a video")
    status, errors, _ = _convert(capsys, str(video), str(tmp_path / "v.zarr"), "--from", "video")
    assert status == 2 and len(errors) == 1 and "clip.mp4: cannot decode video" in errors[0], errors
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4", "photos"]  # no DST.poses, no DST


def test_video_without_from_is_told_to_pass_from_video(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"not a video")
    _refused(capsys, video, tmp_path / "v.zarr", "clip.mp4: a video; pass --from video")


def test_stale_lock_is_one_warning_line(
    captures: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "s.zarr"
    owner = {
        "pid": 2**22 + 1,
        "host": os.uname().nodename,
        "started": "2026-01-01T00:00:00Z",
        "command": "raykit",
    }
    (tmp_path / "s.zarr.lock").write_text(json.dumps(owner))  # no process holds its flock: stale
    status, errors, warnings = _convert(capsys, str(captures["blender"]), str(dst))
    assert status == 0 and not errors and len(warnings) == 1, warnings
    assert "stale lock" in warnings[0] and "s.zarr.lock" in warnings[0]


def test_render_cameras_of_200000x200000_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "cameras.json"
    frame = {"file_path": "x", "transform_matrix": np.eye(4).tolist()}
    path.write_text(json.dumps({"camera_angle_x": 0.8, "w": 200000, "h": 200000, "frames": [frame] * 3}))
    with pytest.raises(SourceError) as info:
        list(transforms_views(None, path, torch.device("cpu")))  # type: ignore[arg-type]
    assert info.value.problems == [
        f"{path}: 3 frames (0, 1, 2): w, h: width: expected an integer in [1, 65535], got 200000; "
        "height: expected an integer in [1, 65535], got 200000"
    ]


def test_disk_full_names_the_file_and_the_partial_it_leaves(
    captures: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A write that fails as a full disk does (ENOSPC from ``write``, naming no file): the line names
    the file and the ``DST.partial`` kept for the rerun; no temporary file is left (status 1: the
    machine's fault)."""
    real = raykit.fileio.atomic_write_bytes
    calls: list[str] = []

    def full(path: object, data: object, *, sync: bool = True) -> None:
        calls.append(str(path))
        if len(calls) < 3:
            return real(path, data, sync=sync)  # type: ignore[arg-type]
        with raykit.fileio.atomic_path(path, sync=sync) as tmp:  # type: ignore[arg-type]
            tmp.write_bytes(b"half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    for name in ("raykit.store.write.commit", "raykit.store.write.rays", "raykit.store.write.images"):
        importlib.import_module(name)
    for name, module in list(sys.modules.items()):
        if name.startswith("raykit.") and getattr(module, "atomic_write_bytes", None) is real:
            monkeypatch.setattr(module, "atomic_write_bytes", full)
    dst = tmp_path / "s.zarr"
    status = raykit.cli.main(
        ["convert", str(captures["blender"]), str(dst), "--no-progress", "--workers", "1"]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(lines) == 1, lines
    assert f"[Errno 28] No space left on device: '{dst}.partial/" in lines[0], lines[0]
    assert (
        f"({dst}.partial keeps the work so far: rerun the same command to resume, or delete it)" in lines[0]
    )
    assert not list(tmp_path.rglob("*.tmp")) and not dst.exists()
