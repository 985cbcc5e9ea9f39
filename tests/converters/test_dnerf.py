"""D-NeRF and nerfstudio captures with ``time`` (issue 58): per-frame intrinsics honoured, each view's
time kept as a camera-table column in both layouts and backends, ``raykit info``'s time line, static
stores without the columns, and one line per bad time."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from raykit.cli import main
from raykit.converters import convert
from raykit.errors import SourceError
from raykit.loaders import image_rays
from raykit.store import open_store

LEGO = Path(__file__).resolve().parents[1] / "data" / "lego_tiny"
FORMS = ("rays", "images", "rays_wds", "images_wds")


def _frames(capture: Path) -> dict[str, tuple[dict[str, Any], float]]:
    """Image name -> (its frame, the file's ``camera_angle_x``), read straight from the JSON files."""
    out = {}
    for split in ("train", "val", "test"):
        meta = json.loads((capture / f"transforms_{split}.json").read_text())
        for frame in meta["frames"]:
            out[frame["file_path"].removeprefix("./") + ".png"] = (frame, meta["camera_angle_x"])
    return out


def _frame_rays(
    frame: dict[str, Any], angle_x: float, width: int, height: int
) -> tuple[np.ndarray, np.ndarray]:
    """Every pixel's (origin, unit direction) (H * W, 3) from the frame's own numbers alone: its
    ``fl_x``/``fl_y``/``cx``/``cy`` (else Blender's ``camera_angle_x`` and the image centre), pixel
    centres at +0.5, OpenGL camera axes (x right, y up, looking down -z)."""
    fx = frame.get("fl_x", 0.5 * width / math.tan(0.5 * angle_x))
    fy = frame.get("fl_y", fx)
    cx, cy = frame.get("cx", width / 2), frame.get("cy", height / 2)
    ys, xs = np.mgrid[0:height, 0:width].reshape(2, -1) + 0.5
    camera = np.stack([(xs - cx) / fx, -(ys - cy) / fy, -np.ones_like(xs)], axis=1)
    c2w = np.asarray(frame["transform_matrix"])
    world = camera @ c2w[:3, :3].T
    return np.tile(c2w[:3, 3], (len(world), 1)), world / np.linalg.norm(world, axis=1, keepdims=True)


def test_rays_follow_each_frames_own_intrinsics(dnerf: dict[str, Any]) -> None:
    store = open_store(dnerf["rays"])
    frames = _frames(dnerf["capture"])
    own = [name for name, (frame, _) in frames.items() if "fl_x" in frame]
    assert own and len(own) < len(frames)  # some frames carry intrinsics, others use camera_angle_x
    for name, (frame, angle_x) in frames.items():
        h, w, _ = store.image_shape(name)
        assert (w, h) == (frame.get("w", 32), frame.get("h", 32))
        origins, directions = _frame_rays(frame, angle_x, w, h)
        batch = image_rays(store, name)
        torch.testing.assert_close(batch.origins.double(), torch.from_numpy(origins), atol=1e-5, rtol=0)
        torch.testing.assert_close(batch.directions.double(), torch.from_numpy(directions), atol=1e-5, rtol=0)
        assert batch.times is not None and torch.all(batch.times == np.float32(frame["time"]))


@pytest.mark.parametrize("form", FORMS)
def test_time_is_a_column_of_the_camera_table(dnerf: dict[str, Any], form: str) -> None:
    store = open_store(dnerf[form])
    frames = _frames(dnerf["capture"])
    assert store.table.time is not None and store.table.rig_camera is None and store.table.frame_index is None
    assert store.table.time.tolist() == [frames[name][0]["time"] for name in store.table.names]
    assert "time" not in store.frame_metadata(store.table.names[0])  # the field, not metadata


def test_static_stores_have_no_time_columns(tmp_path: Path) -> None:
    """A capture without time writes the camera table it always did (no column), and reads no time."""
    store = convert(LEGO, tmp_path / "lego.zarr")
    assert pq.read_schema(tmp_path / "lego.zarr" / "cameras.parquet").names[-1] == "source_sha256"
    assert store.table.time is None and store.table.rig_camera is None
    assert image_rays(store, store.table.names[0]).times is None


def test_info_shows_the_time_span(dnerf: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(dnerf["images"])]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("time"))
    assert line.split(None, 1)[1] == (
        "0 to 1 (6 instants); 4 cameras (by pose): 6 frames per camera, 4 cameras per instant"
    )
    assert main(["info", str(dnerf["rays"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["time"]["n_instants"] == 6


def test_nerfstudio_time_is_any_finite_number(dnerf: dict[str, Any], tmp_path: Path) -> None:
    capture = tmp_path / "ns"
    shutil.copytree(dnerf["capture"], capture)
    meta = json.loads((capture / "transforms_train.json").read_text())
    for i, frame in enumerate(meta["frames"]):
        frame["time"] = 10.0 * i - 3.5
    meta["camera_model"] = "PINHOLE"
    (capture / "transforms.json").write_text(json.dumps(meta))
    store = convert(capture / "transforms.json", tmp_path / "ns.zarr")
    times = dict(zip(store.table.names, store.table.time.tolist(), strict=True))
    assert sorted(times.values()) == [10.0 * i - 3.5 for i in range(len(meta["frames"]))]


def _bad(dnerf: dict[str, Any], tmp_path: Path, change: Any) -> list[str]:
    capture = tmp_path / "bad"
    shutil.copytree(dnerf["capture"], capture)
    path = capture / "transforms_train.json"
    meta = json.loads(path.read_text())
    change(meta["frames"])
    path.write_text(json.dumps(meta))
    with pytest.raises(SourceError) as info:
        convert(capture, tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()
    return info.value.problems


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (math.nan, "time: expected a finite number in [0, 1], got nan"),
        (math.inf, "time: expected a finite number in [0, 1], got inf"),
        (1.5, "time: expected a finite number in [0, 1], got 1.5"),
        ("0.5", "time: expected a finite number in [0, 1], got '0.5' (str)"),
    ],
)
def test_bad_time_is_one_line_naming_the_file_and_frame(
    dnerf: dict[str, Any], tmp_path: Path, value: Any, expected: str
) -> None:
    problems = _bad(dnerf, tmp_path, lambda frames: frames[2].update(time=value))
    assert problems == [f"{tmp_path / 'bad' / 'transforms_train.json'}: frame 2 (./train/c2_t0): {expected}"]


def test_time_on_some_frames_only_is_one_line(dnerf: dict[str, Any], tmp_path: Path) -> None:
    problems = _bad(dnerf, tmp_path, lambda frames: frames[4].pop("time"))
    assert problems == [
        f"{tmp_path / 'bad'}: 23 of 24 frames have a time ('train/c1_t1.png' has none); "
        "expected every frame or none"
    ]


def test_writer_refuses_bad_or_partial_times(tmp_path: Path) -> None:
    import dataclasses
    import functools

    from raykit.cameras import Camera
    from raykit.errors import ConfigError
    from raykit.store import ImageRecord, SceneInfo, write_store

    camera = Camera("PINHOLE", 4, 4, (4.0, 4.0, 2.0, 2.0))
    load = functools.partial(np.zeros, (4, 4, 3), np.uint8)
    records = [
        ImageRecord(f"im{i}", "train", camera, np.eye(4), 0.1, 5.0, "", load, time=i / 2, camera_index=0)
        for i in range(3)
    ]
    store = write_store(tmp_path / "ok", records, scene=SceneInfo())
    assert store.table.time.tolist() == [0.0, 0.5, 1.0] and store.table.rig_camera.tolist() == [0, 0, 0]
    bad = [dataclasses.replace(records[0], time=math.inf), dataclasses.replace(records[1], frame_index=-1)]
    with pytest.raises(ConfigError) as info:
        write_store(
            tmp_path / "bad", [*bad, dataclasses.replace(records[2], frame_index=None)], scene=SceneInfo()
        )
    assert str(info.value) == (
        "write_store: invalid image records: image 'im0': time: expected a finite number, got inf; "
        "image 'im1': frame_index: expected an integer in [0, 2147483647], got -1; "
        "1 of 3 images have a frame_index (image 'im0' has none); expected every image or none"
    )
    assert not (tmp_path / "bad").exists()
