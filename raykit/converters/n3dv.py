"""Neural 3D Video (DyNeRF) captures: ``poses_bounds.npy`` beside one ``camNN.mp4`` per camera.

``poses_bounds.npy`` is LLFF's ``(N, 17)`` array (:mod:`raykit.converters.llff`: a ``3 x 5`` pose
with ``(H, W, focal)``, then near and far), one row per video in the order of ``NN`` (numerically).
Every video must have the same frame count and size. Frames are decoded with PyAV
(:mod:`raykit.converters.video`), streaming: no frame is written to disk before the store.

Each view is one frame of one camera, named ``FFFFF/camNN`` (``FFFFF`` the frame's index in its
video): the store's table order (split, then name) is time-major, the order its frames are decoded in;
it carries ``camera_index = NN``, ``frame_index`` and
``time = frame_index / (frames - 1)``: normalised over the **whole** video, whatever frame range is
converted, so a frame keeps its time in every conversion of the capture (and the times of a range are
not stretched to [0, 1]). Options: the frame range ``[frame_start, frame_stop)`` and ``frame_stride``;
``test_camera`` (default ``cam00``, DyNeRF's held-out camera): all its frames are ``test``, every
other camera's ``train``; ``drop_cameras``: cameras left out, only when named (DyNeRF's
``coffee_martini`` has an unsynchronised ``cam13``: it is kept unless the user drops it).

Frames whose size differs from the ``(H, W)`` of ``hwf`` by a uniform scale are used as they are,
with the focal length scaled by ``w / W`` (as LLFF does for downscaled images; a warning says so);
any other size is refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raykit.cameras import Camera
from raykit.conventions import opengl_to_opencv_c2w
from raykit.converters.base import Capture, Problems, SourceView, check_rigid
from raykit.converters.llff import llff_c2w, load_poses_bounds
from raykit.converters.video import VideoFrame, VideoInfo, probe_video
from raykit.errors import ConfigError, SourceError

__all__ = ["N3DV_DEFAULTS", "is_n3dv", "parse_n3dv"]

N3DV_DEFAULTS: dict[str, Any] = {
    "frame_start": 0,
    "frame_stop": None,
    "frame_stride": 1,
    "test_camera": "cam00",
    "drop_cameras": "",
}
"""The video options' defaults (``ConvertConfig``'s fields of the same names)."""

_VIDEO = re.compile(r"cam(\d+)\.mp4")


def _videos(src: Path) -> list[tuple[int, Path]]:
    """``(NN, path)`` of every ``camNN.mp4`` in ``src``, by ``NN``."""
    found = [(int(m.group(1)), p) for p in src.iterdir() if (m := _VIDEO.fullmatch(p.name)) and p.is_file()]
    return sorted(found)


def is_n3dv(src: Path) -> bool:
    """A folder with ``poses_bounds.npy`` and ``camNN.mp4`` videos."""
    return src.is_dir() and (src / "poses_bounds.npy").is_file() and bool(_videos(src))


def _frames(info: VideoInfo, start: int, stop: int | None, stride: int) -> range:
    if start < 0 or stride < 1 or (stop is not None and stop <= start):
        raise ConfigError(
            f"frames: expected 0 <= frame_start < frame_stop and frame_stride >= 1, got start {start}, "
            f"stop {stop}, stride {stride}"
        )
    return range(start, info.frames if stop is None else stop, stride)


def _camera(hwf: np.ndarray, info: VideoInfo, label: str, problems: Problems) -> Camera | None:
    height, width, focal = (float(v) for v in hwf)
    w, h = info.width, info.height
    sx, sy = w / width, h / height
    if abs(sx - sy) > 0.01 * max(sx, sy):
        problems.add(
            f"{label}: frames are {w}x{h}, not a uniform rescale of the {width:g}x{height:g} "
            "poses_bounds.npy gives"
        )
        return None
    return Camera("PINHOLE", w, h, (focal * sx, focal * sy, w / 2, h / 2), label=label)


def parse_n3dv(
    src: Path,
    *,
    frame_start: int = N3DV_DEFAULTS["frame_start"],
    frame_stop: int | None = N3DV_DEFAULTS["frame_stop"],
    frame_stride: int = N3DV_DEFAULTS["frame_stride"],
    test_camera: str = N3DV_DEFAULTS["test_camera"],
    drop_cameras: str | Sequence[str] = N3DV_DEFAULTS["drop_cameras"],
) -> Capture:
    """Parse ``src/poses_bounds.npy`` and its ``camNN.mp4`` videos (frame counts and sizes from the
    containers; frames decoded when written).

    Raises:
        SourceError: every problem found, one line each.
        ConfigError: a frame range that is empty, or a test or dropped camera the capture lacks.
    """
    path = src / "poses_bounds.npy"
    data = load_poses_bounds(path)
    videos = _videos(src)
    if len(data) != len(videos):
        raise SourceError(f"{path}: {len(data)} rows but {len(videos)} camNN.mp4 videos in {src}")
    names = [p.stem for _, p in videos]
    drops = (
        [d.strip() for d in drop_cameras.split(",")] if isinstance(drop_cameras, str) else list(drop_cameras)
    )
    drops = [d for d in drops if d]
    for option, asked in [("test_camera", [test_camera]), ("drop_cameras", drops)]:
        for name in asked:
            if name not in names:
                raise ConfigError(f"{option}: {src} has no {name}.mp4 (its cameras: {', '.join(names)})")
    if test_camera in drops:
        raise ConfigError(f"drop_cameras: {test_camera} is the test camera; pick another test_camera")
    problems, infos = Problems(), []
    for _, video in videos:
        try:
            infos.append(probe_video(video))
        except SourceError as exc:
            problems.capture(exc)
    problems.raise_if_any()
    first, first_info = videos[0][1], infos[0]
    for (_, video), info in zip(videos, infos, strict=True):
        if info.frames != first_info.frames:
            problems.add(f"{video}: {info.frames} frames, but {first.name} has {first_info.frames}")
        if (info.width, info.height) != (first_info.width, first_info.height):
            problems.add(
                f"{video}: frames are {info.width}x{info.height}, but {first.name}'s are "
                f"{first_info.width}x{first_info.height}"
            )
    frames = _frames(first_info, frame_start, frame_stop, frame_stride)
    if frames.stop > first_info.frames:
        problems.add(f"{first}: {first_info.frames} frames, fewer than the {frames.stop} asked (frame_stop)")
    problems.raise_if_any()
    wanted = (frames.start, frames.stop, frames.step)
    scaled: list[tuple[Path, np.ndarray]] = []
    rigs = []
    for row, ((number, video), info) in enumerate(zip(videos, infos, strict=True)):
        if video.stem in drops:
            continue
        where = f"{path}: row {row} ({video.name})"
        pose, bounds = data[row, :15].reshape(3, 5), data[row, 15:]
        c2w_gl, bad = check_rigid(llff_c2w(pose), where)
        if bad or c2w_gl is None:
            problems.add(bad or where)
        if not np.all(np.isfinite(bounds)) or not 0 < bounds[0] < bounds[1]:
            problems.add(f"{where}: expected bounds 0 < near < far, got {bounds.tolist()}")
        camera = _camera(pose[:, 4], info, where, problems)
        if camera is None or c2w_gl is None:
            continue
        if (camera.width, camera.height) != (round(pose[1, 4]), round(pose[0, 4])):
            scaled.append((video, pose[:, 4]))
        rigs.append((number, video, camera, opengl_to_opencv_c2w(c2w_gl), bounds))
    problems.raise_if_any()
    assumed = []
    if scaled:
        (video, (height, width, _)), size = scaled[0], f"{first_info.width}x{first_info.height}"
        line = (
            f"{video}: frames are {size}, {path.name}'s hwf says {width:g}x{height:g} ({len(scaled)} of "
            f"{len(rigs)} cameras): focal scaled by {first_info.width / width:g} (frame width / W), as LLFF "
            "does"
        )
        assumed.append(("intrinsics", line))
    last = max(first_info.frames - 1, 1)
    views = [
        SourceView(
            f"{f:05d}/{video.stem}",
            camera,
            c2w,
            video,
            "test" if video.stem == test_camera else "train",
            float(bounds[0]),
            float(bounds[1]),
            frame=VideoFrame(str(video), f, wanted),
            time=f / last,
            camera_index=number,
            frame_index=f,
        )
        for f in frames
        for number, video, camera, c2w, bounds in rigs
    ]
    params = {"frames": first_info.frames, "frame_range": list(wanted), "test_camera": test_camera,
              "dropped_cameras": drops}  # fmt: skip
    return Capture("n3dv", views, params=params, assumed=assumed)
