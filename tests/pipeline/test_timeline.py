"""``raykit.pipeline.timeline`` on hand-made frames: PSNR against scene time per sampler and camera, and
the test camera's video (H.264 MP4, or a looping GIF where the encoder is missing), decoded back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from PIL import Image

from raykit.pipeline.timeline import plot_psnr_over_time, video_camera, write_camera_video

TIMES = [0.5, 0.0, 1.0]  # in no order: the plot and the video put them in time order


def _runs(tmp_path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Path]]:
    truth, runs, dirs = {}, {}, {}
    for s, sampler in enumerate(("occupancy", "stratified")):
        dirs[sampler] = tmp_path / sampler
        dirs[sampler].mkdir()
        frames = []
        for i, t in enumerate(TIMES):
            for camera in ("cam00", "cam02"):
                name, file = f"{i}/{camera}", f"{len(frames):03d}_{camera}_t{t:.4f}.png"
                truth[name] = np.full((10, 12, 3), int(250 * t), np.uint8)
                Image.fromarray(np.full((10, 12, 3), 40 * s + 20 * i, np.uint8)).save(dirs[sampler] / file)
                frames.append({"name": name, "camera": camera, "time": t, "psnr": 20 + s + t, "file": file})
        runs[sampler] = {"frames": frames, "field": "kplanes", "ray_sampling": {"name": "uniform"}}
    return runs, truth, dirs


def test_psnr_is_plotted_against_scene_time_per_sampler_and_camera(tmp_path: Path) -> None:
    runs, _, _ = _runs(tmp_path)
    for run in runs.values():  # a frame without a PSNR (identical images) is left out
        run["frames"].append({"name": "x", "camera": "cam02", "time": 0.25, "psnr": None, "file": "x.png"})
    lines = plot_psnr_over_time(runs, tmp_path / "plot.png")
    assert list(lines) == [
        f"{s}, {c} (field kplanes, ray sampling uniform)"
        for s in ("occupancy", "stratified")
        for c in ("cam00", "cam02")
    ]
    assert lines["stratified, cam02 (field kplanes, ray sampling uniform)"] == [
        (0.0, 21.0),
        (0.5, 21.5),
        (1.0, 22.0),
    ]
    assert Image.open(tmp_path / "plot.png").size == (600, 360)
    assert plot_psnr_over_time({"static": {"frames": []}}, tmp_path / "none.png") == {}
    assert not (tmp_path / "none.png").exists() and video_camera({"static": {}}) is None


@pytest.mark.parametrize(("codec", "suffix"), [("libx264", ".mp4"), ("no-such-encoder", ".gif")])
def test_the_test_camera_video_decodes_to_its_frames(tmp_path: Path, codec: str, suffix: str) -> None:
    runs, truth, dirs = _runs(tmp_path)
    video = write_camera_video(runs, truth, tmp_path / "figures", dirs, "clip", codec)
    assert video is not None and Path(video["path"]).name == "clip" + suffix
    assert video["camera"] == "cam00" and video["times"] == [0.0, 0.5, 1.0]
    assert video["columns"] == ["truth", "occupancy", "stratified"]
    with av.open(video["path"]) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 3 and frames[0].shape == (130, 468, 3)  # 10 rows scaled 13x, 3 tiles of 12
    tiles = [frames[1][65, 156 * k + 78].astype(int) for k in range(3)]  # time 0.5: frame i = 0
    assert [int(np.mean(t)) for t in tiles] == pytest.approx([125, 0, 40], abs=4)
