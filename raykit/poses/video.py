"""Frames of a video as photos for pose estimation, decoded with PyAV (FFmpeg's libraries).

:func:`extract_frames` keeps about ``fps`` frames per second of video: for target times ``k / fps``
(``k = 0, 1, ...``, measured from the first frame) it keeps the first decoded frame at or after each
target. Frames are written as ``frame_00001.jpg``, ``frame_00002.jpg``, ... (JPEG quality 95,
atomically), names that :func:`raykit.poses.photos.looks_like_frames` recognises so the matcher
goes sequential. Pixels are used as decoded; a rotation tag in the container is not applied.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import ConfigError, SourceError
from raykit.fileio import atomic_write_bytes

__all__ = ["VIDEO_EXTENSIONS", "extract_frames", "frame_name", "video_frames", "video_stream"]

VIDEO_EXTENSIONS = (".mp4", ".mov", ".m4v", ".mkv", ".avi", ".webm")
JPEG_QUALITY = 95


def frame_name(index: int) -> str:
    """Name of the ``index``-th kept frame (1-based)."""
    return f"frame_{index:05d}.jpg"


@contextlib.contextmanager
def video_stream(path: Path) -> Iterator[tuple[Any, Any]]:
    """``(container, stream)``: ``path`` opened with PyAV and its first video stream, closed after the
    block; FFmpeg's errors inside the block become one line naming the file.

    Raises:
        SourceError: the file is missing, not a video, has no video stream or fails to decode.
    """
    import av  # PyAV: imported here so that importing raykit does not load FFmpeg

    if not path.is_file():
        raise SourceError(f"{path}: video file not found")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise SourceError(f"{path}: no video stream")
            yield container, container.streams.video[0]
    except av.FFmpegError as exc:
        raise SourceError(f"{path}: cannot decode video ({exc})") from None


def video_frames(video: Path, fps: float) -> Iterator[np.ndarray]:
    """Yield (H, W, 3) uint8 RGB frames of ``video`` sampled at about ``fps`` frames per second."""
    if not (isinstance(fps, int | float) and math.isfinite(fps) and fps > 0):
        raise ConfigError(f"fps: expected a positive number, got {fps!r}")
    with video_stream(video) as (container, stream):
        stream.thread_type = "AUTO"
        start: float | None = None
        k = 0
        for frame in container.decode(stream):
            t = frame.time if frame.time is not None else 0.0
            start = t if start is None else start
            if t - start + 1e-6 >= k / fps:
                yield frame.to_ndarray(format="rgb24")
                k = math.floor((t - start) * fps + 1e-6) + 1


def extract_frames(
    video: Path, out_dir: Path, fps: float, progress: Callable[[int], None] | None = None
) -> list[str]:
    """Write the frames of ``video`` sampled at ``fps`` into ``out_dir``; return their names in order.

    Args:
        progress: called with 1 after each frame written.
    """
    from PIL import Image

    names = []
    for index, rgb in enumerate(video_frames(video, fps), start=1):
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, format="JPEG", quality=JPEG_QUALITY)
        atomic_write_bytes(out_dir / frame_name(index), buf.getvalue())
        names.append(frame_name(index))
        if progress is not None:
            progress(1)
    if not names:
        raise SourceError(f"{video}: no frames decoded")
    return names
