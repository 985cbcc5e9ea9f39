"""DyNeRF's temporal importance weights of one camera's frames: ISG and IST, computed camera by camera.

For one camera's frames ``I_t`` (``t = 0 .. T-1``, RGB in [0, 1]) at a reduced resolution (level
``factor`` of ``raykit.resample``: each ``factor`` x ``factor`` block averaged):

- **ISG** (global median): with ``M`` the per-pixel temporal median (the lower one, the
  ``(T - 1) // 2``-th smallest value, as ``torch.median`` gives), each frame's pixel weighs the mean over
  RGB of ``d² / (d² + gamma²)``, ``d = I_t - M``.
- **IST** (temporal difference): the largest ``|I_t - I_{t±s}|`` over RGB and shifts ``s = 1 .. shift``
  (shifts past either end of the sequence left out), clamped below by ``alpha``.

Both are float16 ``(T, h, w)`` arrays, frame ``t`` of the camera at ``[t]``. :func:`temporal_weights`
reads the frames once, in order, and holds only that camera's reduced frames: ``T * h * w * 3`` bytes
of frames, ``T * h * w * 4`` bytes of the two results and a row band's temporaries (its float64 ISG
terms at most ``BAND_BYTES``, about twice that in all), plus the one full-size frame being reduced,
whatever the number of cameras (300 frames at 676x507: 0.72 GB, a peak RSS of 0.80 GiB measured).
The median is exact (a partition per row band), and IST's window of ``2 shift + 1`` frames is a running
maximum and minimum (van Herk / Gil-Werman): ``max_u |I_t - I_u| = max(I_t - min_u I_u, max_u I_u -
I_t)`` over the window, in integers, so IST equals the definition exactly.

K-Planes (``dynerf_ist_weight``) differs in three ways, each a departure from DyNeRF's definition that
this module does not copy: it pads the sequence's ends with black frames (so the first and last
``shift`` frames compare with zeros), averages IST over RGB instead of taking its maximum, and applies
``alpha = 0.1`` to differences on the 0-255 scale.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from raykit.errors import ConfigError, SourceError
from raykit.ranges import Range, range_problems
from raykit.resample import downscale_area

__all__ = ["BAND_BYTES", "TemporalWeights", "TemporalWeightsConfig", "temporal_weights"]

BAND_BYTES = 32 * 2**20  # the float64 temporaries of one row band


@dataclass(frozen=True)
class TemporalWeightsConfig:
    """ISG's and IST's options (DyNeRF's and K-Planes' values).

    Attributes:
        gamma: ISG's scale of a difference from the median (colours in [0, 1]).
        shift: IST's largest frame shift ``S`` (frames ``t - S .. t + S``).
        alpha: IST's floor (colours in [0, 1]).
        factor: the weights' resolution level: each ``factor`` x ``factor`` block of a frame averaged
            (``raykit.resample.downscale_area``), so frames of (H, W) give weights of
            (H // factor, W // factor).
    """

    gamma: float = 2e-2
    shift: int = 25
    alpha: float = 0.1
    factor: int = 4

    def __post_init__(self) -> None:
        problems = range_problems({
            "gamma": (self.gamma, Range(0, 1, low_open=True)),
            "shift": (self.shift, Range(1, 10**6, integer=True)),
            "alpha": (self.alpha, Range(0, 1, low_open=True)),
            "factor": (self.factor, Range(1, 64, integer=True)),
        })  # fmt: skip
        if problems:
            raise ConfigError("temporal weights: " + "; ".join(problems))


class TemporalWeights(NamedTuple):
    """One camera's weights: ``isg``, ``ist`` (T, h, w) float16; ``median`` (h, w, 3) uint8."""

    isg: np.ndarray
    ist: np.ndarray
    median: np.ndarray


def temporal_weights(frames: Iterable[np.ndarray], config: TemporalWeightsConfig | None = None
                     ) -> TemporalWeights:  # fmt: skip
    """ISG and IST weights of one camera's frames, read once and in order.

    Args:
        frames: the camera's T frames in time order, each (H, W, 3) uint8 of one size (a generator
            decoding a video is read once; each frame is reduced as it arrives).
        config: the options (default :class:`TemporalWeightsConfig`'s).

    Returns:
        ``TemporalWeights``: ``isg`` and ``ist`` (T, H // factor, W // factor) float16, ``median``.

    Raises:
        SourceError: no frames, or a frame not (H, W, 3) uint8 of the first frame's size.
    """
    config = TemporalWeightsConfig() if config is None else config
    reduced = _reduced_frames(frames, config.factor)
    n, (h, w) = len(reduced), reduced[0].shape[:2]
    isg, ist = np.empty((n, h, w), np.float16), np.empty((n, h, w), np.float16)
    median = np.empty((h, w, 3), np.uint8)
    lut = _isg_table(config.gamma)
    ist_table = np.maximum(np.arange(256) / 255.0, config.alpha).astype(np.float16)  # exact: k / 255
    rows = max(1, BAND_BYTES // (8 * n * w * 3))
    for y0 in range(0, h, rows):
        band = np.stack([frame[y0 : y0 + rows] for frame in reduced])  # (T, b, w, 3) uint8
        median[y0 : y0 + rows] = np.partition(band, (n - 1) // 2, axis=0)[(n - 1) // 2]
        diff = np.maximum(band, median[y0 : y0 + rows])
        diff -= np.minimum(band, median[y0 : y0 + rows])  # |I_t - M| in uint8
        terms = lut[diff]  # (T, b, w, 3) float64
        isg[:, y0 : y0 + rows] = (terms[..., 0] + terms[..., 1] + terms[..., 2]) / 3
        del diff, terms
        high = _window_extreme(band, config.shift, np.maximum, 0)
        low = _window_extreme(band, config.shift, np.minimum, 255)
        spread = np.maximum(band - low, high - band)  # (T, b, w, 3) uint8, exact
        spread = np.maximum(np.maximum(spread[..., 0], spread[..., 1]), spread[..., 2])
        ist[:, y0 : y0 + rows] = ist_table[spread]
    return TemporalWeights(isg, ist, median)


def _reduced_frames(frames: Iterable[np.ndarray], factor: int) -> list[np.ndarray]:
    """The frames, each checked and reduced to level ``factor``."""
    reduced: list[np.ndarray] = []
    shape: tuple[int, ...] | None = None
    for t, frame in enumerate(frames):
        frame = np.asarray(frame)
        shape = frame.shape if shape is None else shape
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3 or frame.shape != shape:
            raise SourceError(f"frame {t}: expected (H, W, 3) uint8 of shape {shape}, got {frame.shape} "
                              f"{frame.dtype}")  # fmt: skip
        if frame.shape[0] < factor or frame.shape[1] < factor:
            raise SourceError(f"frame {t}: {frame.shape[1]}x{frame.shape[0]} is under the level {factor}")
        reduced.append(np.ascontiguousarray(downscale_area(frame, factor)))
    if not reduced:
        raise SourceError("temporal weights: expected at least one frame, got none")
    return reduced


def _isg_table(gamma: float) -> np.ndarray:
    """(256,) float64: ISG's term ``d² / (d² + gamma²)`` of a difference of ``k / 255``, ``k = 0 .. 255``."""
    d2 = (np.arange(256) / 255.0) ** 2
    return np.asarray(d2 / (d2 + gamma**2))


def _window_extreme(x: np.ndarray, radius: int, op: np.ufunc, identity: int) -> np.ndarray:
    """(T, ...) -> (T, ...): ``op`` (maximum or minimum) over frames ``t - radius .. t + radius`` of ``x``
    (those inside the sequence), by prefix and suffix extremes over blocks of ``2 radius + 1`` frames."""
    n, size = len(x), 2 * radius + 1
    length = -(-(n + 2 * radius) // size) * size
    padded = np.full((length, *x.shape[1:]), identity, x.dtype)  # frame t at t + radius
    padded[radius : radius + n] = x
    prefix = padded.reshape(length // size, size, -1)  # (blocks, 2 radius + 1, pixels)
    suffix = prefix.copy()
    for i in range(1, size):  # a loop over the block's frames: ufunc.accumulate is 10x slower here
        op(prefix[:, i - 1], prefix[:, i], out=prefix[:, i])
        op(suffix[:, size - i], suffix[:, size - i - 1], out=suffix[:, size - i - 1])
    prefix, suffix = prefix.reshape(padded.shape), suffix.reshape(padded.shape)
    return np.asarray(op(suffix[:n], prefix[2 * radius : 2 * radius + n]))
