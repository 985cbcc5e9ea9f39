"""Video frames as a converter's images: :class:`VideoFrame`, a picklable ``load()`` of one decoded
frame, and :func:`probe_video` (frame count and size, nothing decoded).

Decoding is streaming and bounded: each process keeps one decoder per video (PyAV), which moves
forward only. A conversion asks for frames in time-major order (every camera's frame ``f`` before any
camera's ``f + 1``), so each video's frames arrive in order and every frame is decoded once; the few
frames decoded ahead for another thread (at most :data:`AHEAD` per video) wait in a small buffer.
Asking for a frame behind the decoder reopens the video (a rerun, or listing decode problems after a
failure: correct, slower). A video's decoder is closed once its last wanted frame is decoded.
Frames are ``uint8 (H, W, 3)`` RGB (``rgb24``, whatever the stream's pixel format).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from raykit.errors import SourceError
from raykit.poses import video_stream

__all__ = ["AHEAD", "VideoFrame", "VideoInfo", "close_videos", "probe_video"]

AHEAD = 16
"""Frames decoded ahead of their asker that a video's decoder holds at most (oldest dropped first)."""


@dataclass(frozen=True)
class VideoInfo:
    """A video's frame count (``frames``) and frame size."""

    frames: int
    width: int
    height: int


def probe_video(path: Path) -> VideoInfo:
    """The frame count (the container's, else its packets counted: nothing decoded) and size.

    Raises:
        SourceError: missing, not a video, or no video stream.
    """
    with video_stream(path) as (container, stream):
        frames = int(stream.frames or 0)
        if frames == 0:
            frames = sum(1 for packet in container.demux(stream) if packet.size)
        return VideoInfo(frames, int(stream.codec_context.width), int(stream.codec_context.height))


@dataclass(frozen=True)
class VideoFrame:
    """Frame ``index`` of the video at ``path``, decoded when called; ``wanted`` = ``(start, stop,
    step)`` are the frames the conversion reads from that video (kept when decoded ahead; the decoder
    closes after the last)."""

    path: str
    index: int
    wanted: tuple[int, int, int]
    channels: ClassVar[int] = 3  # rgb24: the store writer knows a frame's stored size before decoding it

    def __call__(self) -> np.ndarray:
        with _LOCK:
            reader = _READERS.setdefault(self.path, _Reader(self.path))
        return reader.frame(self.index, range(*self.wanted))


class _Reader:
    """One video's forward-only decoder and its frames decoded ahead."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.container: Any = None
        self.frames: Any = None
        self.next = 0  # index of the next frame the decoder yields
        self.ahead: OrderedDict[int, np.ndarray] = OrderedDict()

    def frame(self, index: int, wanted: range) -> np.ndarray:
        with self.lock:
            try:
                found = self.ahead.pop(index, None)
                if found is None:
                    found = self._decode_to(index, wanted)
            except BaseException:  # a video that fails is not read further: drop what it holds
                self._close()
                self.ahead.clear()
                raise
            finally:
                if self.container is None and not self.ahead:
                    with _LOCK:
                        if _READERS.get(self.path) is self:
                            del _READERS[self.path]
            return found

    def _decode_to(self, index: int, wanted: range) -> np.ndarray:
        import av

        if self.container is None or index < self.next:
            self._close()
            try:
                self.container = av.open(self.path)
                stream = self.container.streams.video[0]
                stream.thread_type = "AUTO"
                self.frames = self.container.decode(stream)
            except (av.FFmpegError, IndexError) as exc:
                raise SourceError(f"{self.path}: cannot decode video ({exc})") from None
            self.next = 0
        last = wanted[-1] if len(wanted) else index
        while True:
            try:
                frame = next(self.frames)
            except StopIteration:
                raise SourceError(
                    f"{self.path}: video ends after {self.next} frames; the conversion reads frames up "
                    f"to {last}"
                ) from None
            except av.FFmpegError as exc:
                raise SourceError(f"{self.path}: cannot decode video ({exc})") from None
            k, self.next = self.next, self.next + 1
            if k == index:
                pixels: np.ndarray = frame.to_ndarray(format="rgb24")
                if k >= last:
                    self._close()
                return pixels
            if k > index - AHEAD and k in wanted:
                self.ahead[k] = frame.to_ndarray(format="rgb24")
                while len(self.ahead) > AHEAD:
                    self.ahead.popitem(last=False)

    def _close(self) -> None:
        if self.container is not None:
            self.container.close()
        self.container, self.frames = None, None


_LOCK = threading.Lock()
_READERS: dict[str, _Reader] = {}


def close_videos() -> None:
    """Close this process's video decoders and drop their buffered frames (after a failed write)."""
    with _LOCK:
        readers = list(_READERS.values())
        _READERS.clear()
    for reader in readers:
        with reader.lock:
            reader._close()
            reader.ahead.clear()
