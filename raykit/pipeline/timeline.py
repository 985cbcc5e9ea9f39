"""A dynamic capture in the run's report: test PSNR against scene time, and a test camera over time.

A run on a store with times records each test frame (``train_summary``'s ``frames``: name, camera,
time, PSNR, render file, from ``eval.json``). :func:`plot_psnr_over_time` draws PSNR against the frames'
scene times, one line per sampler and test camera, labelled with the run's field and its ray sampling
over time (``run.json``). :func:`write_camera_video` writes the test camera with the most frames as a
short MP4 (H.264, yuv420p: what browsers play inline), ground truth beside each sampler's render, in
time order; where FFmpeg has no H.264 encoder, an animated GIF (Pillow) instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from raykit.fileio import atomic_path
from raykit.report import pyplot, save_figure

__all__ = [
    "camera_video",
    "over_white",
    "plot_psnr_over_time",
    "timed_runs",
    "video_camera",
    "write_camera_video",
]

H264 = "libx264"  # FFmpeg's H.264 encoder: an MP4 of it (yuv420p) plays inline in every browser
VIDEO_TILE = 128  # pixels: each tile of the video is scaled up (nearest) to at least this height
MAX_FPS = 8


def timed_runs(runs: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """``{sampler: its test frames}`` of the runs whose store has times (none: a static capture)."""
    return {s: r["frames"] for s, r in runs.items() if r.get("frames")}


def _label(key: str, camera: str | None, run: Mapping[str, Any]) -> str:
    """A line's legend: the run's key (a sampler), the rig camera if any, and the run's field and ray
    sampling over time as ``run.json`` records them."""
    sampling = run.get("ray_sampling") or {}
    field = run.get("field")
    schedule = [f"field {field}"] if field and field != key else []
    schedule.append(f"ray sampling {sampling.get('name', 'uniform')}")
    schedule += [f"{k} {v}" for k, v in sampling.items() if k != "name" and isinstance(v, str | int | float)]
    return f"{key}{f', {camera}' if camera else ''} ({', '.join(schedule)})"


def plot_psnr_over_time(runs: Mapping[str, Any], path: Path) -> dict[str, list[tuple[float, float]]]:
    """Test PSNR against scene time, one line per sampler and test camera, into ``path`` (PNG); the
    lines drawn (``{legend label: [(time, PSNR)] in time order}``), empty when no run has timed frames
    (then nothing is written)."""
    lines = {}
    for sampler, frames in timed_runs(runs).items():
        for camera in _cameras(frames):
            mine = [f for f in frames if f["camera"] == camera and f["psnr"] is not None]
            points = sorted((f["time"], f["psnr"]) for f in mine)
            if points:
                lines[_label(sampler, camera, runs[sampler])] = points
    if not lines:
        return lines
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, points in lines.items():
        ax.plot(*zip(*points, strict=True), marker="o", label=label)
    ax.set(xlabel="scene time", ylabel="test PSNR (dB)", title="Test PSNR against scene time")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return lines


def _cameras(frames: list[dict[str, Any]]) -> list[str | None]:
    """The frames' rig cameras (None: a capture without rig cameras, D-NeRF's), sorted."""
    return sorted({f["camera"] for f in frames}, key=lambda c: (c is not None, c or ""))


def _camera(camera: str | None) -> str:
    return camera if camera is not None else "the test views in time order"


def video_camera(runs: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]] | None:
    """The test camera with the most frames in the first timed run (its label: ``camNN``, or ``the
    test views in time order`` of a capture without rig cameras) and its frames in time order."""
    timed = timed_runs(runs)
    if not timed:
        return None
    frames = next(iter(timed.values()))
    camera = max(_cameras(frames), key=lambda c: sum(f["camera"] == c for f in frames))
    chosen = sorted((f for f in frames if f["camera"] == camera), key=lambda f: f["time"])
    return _camera(camera), chosen


def _sheet(tiles: list[np.ndarray]) -> np.ndarray:
    """(H, W, 3) uint8 tiles side by side, scaled up (nearest) to ``VIDEO_TILE`` rows, even sizes."""
    height = tiles[0].shape[0]
    row = np.concatenate([t if t.shape[0] == height else np.full_like(tiles[0], 255) for t in tiles], axis=1)
    scale = max(1, -(-VIDEO_TILE // height))
    row = row.repeat(scale, axis=0).repeat(scale, axis=1)
    return np.ascontiguousarray(row[: row.shape[0] // 2 * 2, : row.shape[1] // 2 * 2])


def write_camera_video(
    runs: Mapping[str, Any],
    truth: Mapping[str, np.ndarray],
    folder: Path,
    render_dir: Mapping[str, Path],
    name: str = "test_camera",
    codec: str = H264,
) -> dict[str, Any] | None:
    """The test camera over time (:func:`video_camera`) as ``folder/NAME.mp4`` (``codec``; where FFmpeg
    has no such encoder, ``folder/NAME.gif``):
    each frame the ground truth (``truth[name]``, (H, W, 3) uint8 over white) beside each timed run's
    render (``render_dir[sampler] / file``). Returns ``{"path", "camera", "times", "columns", "fps"}``,
    or None for a static capture."""
    found = video_camera(runs)
    if found is None:
        return None
    camera, frames = found
    timed = timed_runs(runs)
    sheets = []
    for frame in frames:
        tiles = [truth[frame["name"]]]
        for sampler, own in timed.items():
            match = [f for f in own if f["name"] == frame["name"]]
            file = render_dir[sampler] / match[0]["file"] if match else None
            tiles.append(_rgb(file) if file is not None and file.is_file() else np.full_like(tiles[0], 255))
        sheets.append(_sheet(tiles))
    fps = max(1, min(MAX_FPS, len(sheets) // 2))
    path = _encode(folder / name, sheets, fps, codec)
    times = [f["time"] for f in frames]
    return {"path": str(path), "camera": camera, "times": times, "columns": ["truth", *timed], "fps": fps}


def _rgb(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def _encode(stem: Path, sheets: list[np.ndarray], fps: int, codec: str) -> Path:
    """``stem.mp4`` (``codec``, yuv420p) through PyAV, else ``stem.gif`` (Pillow, looping); its path."""
    import av

    stem.parent.mkdir(parents=True, exist_ok=True)
    path = stem.with_suffix(".mp4")
    try:
        with atomic_path(path) as tmp, av.open(str(tmp), "w", format="mp4") as container:
            stream = container.add_stream(codec, rate=fps, options={"crf": "18"})
            if not isinstance(stream, av.VideoStream):
                raise ValueError(f"{codec}: not a video encoder")
            stream.pix_fmt = "yuv420p"
            stream.height, stream.width = sheets[0].shape[:2]
            for pixels in sheets:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
            container.mux(stream.encode())
        return path
    except (av.FFmpegError, ValueError):  # no such encoder in this FFmpeg build
        path.unlink(missing_ok=True)
    path = stem.with_suffix(".gif")
    images = [Image.fromarray(s) for s in sheets]
    with atomic_path(path) as tmp:
        images[0].save(
            tmp, format="GIF", save_all=True, append_images=images[1:], duration=1000 // fps, loop=0
        )
    return path


def camera_video(
    url: str, runs: Mapping[str, Any], folder: Path, render_dir: Mapping[str, Path], name: str = "test_camera"
) -> dict[str, Any] | None:
    """:func:`write_camera_video` of ``runs`` (``train_summary``'s; their renders in ``render_dir``) on
    the store at ``url``, its ground truth read from the store; None for a static capture."""
    from raykit.store import open_store

    found = video_camera(runs)
    if found is None:
        return None
    store = open_store(url)
    truth = {f["name"]: over_white(store.read_image(f["name"])) for f in found[1]}
    return write_camera_video(runs, truth, folder, render_dir, name)


def over_white(image: np.ndarray) -> np.ndarray:
    """(H, W, 3|4) uint8 -> (H, W, 3) uint8 composited over white."""
    if image.shape[-1] == 3:
        return image
    alpha = image[..., 3:].astype(np.float32) / 255.0
    return (image[..., :3] * alpha + 255.0 * (1.0 - alpha) + 0.5).astype(np.uint8)
