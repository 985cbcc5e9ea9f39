"""Video input: frames sampled with PyAV, then poses with sequential matching.

The videos are encoded here with PyAV's MPEG-4 Part 2 encoder (shipped in its wheels), at a high
quality so that the frames stay close to the rendered images.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from raykit.colmap_io import read_model
from raykit.conventions import c2w_from_colmap
from raykit.errors import ConfigError, SourceError
from raykit.poses.align import pose_errors
from raykit.poses.estimate import PoseOptions, estimate_poses
from raykit.poses.video import extract_frames, frame_name, video_frames
from raykit.testing.photos import orbit_poses, render_photos


def write_video(path: Path, frames: list[np.ndarray], rate: int) -> Path:
    """(H, W, 3) uint8 frames -> an MPEG-4 video at ``rate`` frames per second."""
    height, width = frames[0].shape[:2]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.qmax = 3
        for image in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())
    return path


def test_frames_are_sampled_at_the_requested_rate(tmp_path: Path) -> None:
    levels = [int(v) for v in np.linspace(10, 245, 40)]  # 4 s at 10 fps, one grey level per frame
    frames = [np.full((64, 96, 3), level, dtype=np.uint8) for level in levels]
    video = write_video(tmp_path / "grey.mp4", frames, rate=10)
    out = tmp_path / "frames"
    out.mkdir()
    ticks: list[int] = []
    names = extract_frames(video, out, fps=2.0, progress=ticks.append)
    assert names == [frame_name(i) for i in range(1, 9)] and len(ticks) == 8
    for k, name in enumerate(names):  # frame k is the one at time k / 2 s: source frame 5 k
        got = np.asarray(Image.open(out / name), dtype=float)
        assert got.shape == (64, 96, 3)
        assert abs(got.mean() - levels[5 * k]) < 3.0, (name, got.mean(), levels[5 * k])
    every = list(video_frames(video, fps=100.0))  # faster than the video: every frame once
    assert len(every) == 40


def test_video_poses_use_sequential_matching(tmp_path: Path) -> None:
    c2w = orbit_poses(24, (30.0,), arc_deg=180.0)  # a camera path: half a turn in 7.8 degree steps
    shoot = render_photos(24, 240, c2w=c2w)
    video = write_video(tmp_path / "orbit.mp4", list(shoot.images), rate=8)
    out = tmp_path / "out"
    summary = estimate_poses(video, out, PoseOptions(threads=2, fps=8.0))
    assert summary.matcher == "sequential" and "frames" in summary.seconds
    names = [frame_name(i) for i in range(1, 25)]
    assert sorted(summary.registered) == names
    by_name = {image.name: image for image in read_model(out / "sparse" / "0").images.values()}
    est = np.stack([c2w_from_colmap(np.array(by_name[n].qvec), np.array(by_name[n].tvec)) for n in names])
    rot_deg, centre_err, extent = pose_errors(est, c2w)
    assert np.median(rot_deg) <= 2.0 and np.median(centre_err) <= 0.02 * extent
    assert (out / "images").is_dir() and not (out / "images").is_symlink()

    again = estimate_poses(video, out, PoseOptions(threads=2, fps=8.0))
    assert again.seconds == {} and again.skipped[0] == "frames"


def test_bad_videos(tmp_path: Path) -> None:
    fake = tmp_path / "fake.mp4"
    fake.write_text("not a video")
    with pytest.raises(SourceError, match=r"fake\.mp4: cannot decode video"):
        estimate_poses(fake, tmp_path / "out")
    assert not (tmp_path / "out" / "sparse").exists()
    with pytest.raises(SourceError, match="expected a video file"):
        estimate_poses(tmp_path, tmp_path / "out2", source="video")
    with pytest.raises(ConfigError, match="fps"):
        list(video_frames(fake, fps=-1.0))
