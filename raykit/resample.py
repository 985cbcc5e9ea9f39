"""Resolution levels of images, masks and depth maps: pure pixel resampling, no decoding (that is
``raykit.imagedecode``'s, which re-exports these).

Level ``k`` of an (H, W) image is (H // k, W // k): the top-left (H // k * k, W // k * k) pixels, each
k x k block made one pixel (pixel corners stay on corners, as ``Camera.scaled`` and
``raykit convert --downscale`` assume). Colour: the exact box average (``downscale_area``); masks and
depth maps: the source pixel under each output pixel's centre (``downscale_nearest``). Each has a
loop-per-pixel twin the tests compare it with.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "downscale_area",
    "downscale_area_reference",
    "downscale_nearest",
    "level_size",
    "nearest_indices",
    "reference_downscale_nearest",
]


def level_size(height: int, width: int, factor: int) -> tuple[int, int]:
    """``(H // factor, W // factor)``: the size of level ``factor``."""
    return height // factor, width // factor


def nearest_indices(size: int, out: int, span: int | None = None) -> np.ndarray:
    """(out,) int64 source indices of ``out`` output pixels along an axis of ``size`` source pixels.

    The output pixels tile the first ``span`` source pixels (default ``size``); output pixel ``o``'s
    centre lies at the continuous coordinate ``(o + 0.5) * span / out`` and takes the source pixel that
    contains it, ``floor((2 o + 1) span / (2 out))`` (a centre on a pixel border takes the later
    pixel). With ``span = out * k`` (level ``k``) that is ``o * k + k // 2``.
    """
    span = size if span is None else span
    if out < 1 or not 1 <= span <= size:
        raise ValueError(
            f"nearest downscale: expected 1 <= out and 1 <= span <= size, got {out}, {span}, {size}"
        )
    return (2 * np.arange(out, dtype=np.int64) + 1) * span // (2 * out)


def downscale_nearest(values: np.ndarray, factor: int, size: tuple[int, int] | None = None) -> np.ndarray:
    """(H, W, ...) -> (h, w, ...): each output pixel the source pixel under its centre.

    ``size`` None: level ``factor`` (``level_size``: ``(H // factor, W // factor)``, the top-left
    ``factor``-multiple of the image); else the output ``(h, w)`` spanning the whole image (the
    ``mipnerf360`` conversion rule's size). Masks and depth maps (``raykit.image_geometry``).
    """
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1:
        raise ValueError(f"downscale: expected a positive integer factor, got {factor!r}")
    height, width = values.shape[:2]
    if size is None:
        if factor == 1:
            return values
        h, w = level_size(height, width, factor)
        rows, cols = nearest_indices(height, h, h * factor), nearest_indices(width, w, w * factor)
    else:
        h, w = size
        rows, cols = nearest_indices(height, h), nearest_indices(width, w)
    return np.ascontiguousarray(values[rows[:, None], cols[None, :]])


def reference_downscale_nearest(
    values: np.ndarray, factor: int, size: tuple[int, int] | None = None
) -> np.ndarray:
    """Loop-per-output-pixel twin of :func:`downscale_nearest` (exact rational pixel centres)."""
    from fractions import Fraction

    height, width = values.shape[:2]
    if size is None:
        h, w = height // factor, width // factor
        span_h, span_w = h * factor, w * factor
    else:
        (h, w), span_h, span_w = size, height, width
    out = np.zeros((h, w, *values.shape[2:]), dtype=values.dtype)
    for oy in range(h):
        for ox in range(w):
            y = int((oy + Fraction(1, 2)) * Fraction(span_h, h))  # the floor of a positive number
            x = int((ox + Fraction(1, 2)) * Fraction(span_w, w))
            out[oy, ox] = values[y, x]
    return out


def downscale_area(image: np.ndarray, factor: int) -> np.ndarray:
    """Exact box-filter downscale of the top-left ``factor``-multiple of ``image``.

    Args:
        image: (H, W, C) uint8, C = 3 or 4 (straight alpha).
        factor: positive integer; ``H // factor`` x ``W // factor`` blocks are averaged (rows and
            columns beyond a multiple of ``factor`` are left out).

    Returns:
        (H // factor, W // factor, C) uint8, rounded half up; RGBA averaged with premultiplied alpha.
    """
    if factor == 1:
        return image
    height, width, channels = image.shape
    h, w = height // factor, width // factor
    n = factor * factor
    if channels == 3:  # block sums in two passes, in uint32 while they fit (3-8x int64 on 1080p)
        total = np.uint32 if 2 * 255 * n + n < 2**32 else np.int64
        rows = image[: h * factor, : w * factor].reshape(h, factor, w * factor, 3).sum(axis=1, dtype=total)
        sums = rows.reshape(h, w, factor, 3).sum(axis=2, dtype=total)
        return ((2 * sums + n) // (2 * n)).astype(np.uint8)
    blocks = image[: h * factor, : w * factor].reshape(h, factor, w, factor, channels).astype(np.int64)
    alpha = blocks[..., 3:]
    alpha_sum = alpha.sum(axis=(1, 3))
    weighted = (blocks[..., :3] * alpha).sum(axis=(1, 3))
    plain = blocks[..., :3].sum(axis=(1, 3))
    safe = np.maximum(alpha_sum, 1)
    rgb = np.where(alpha_sum > 0, (2 * weighted + safe) // (2 * safe), (2 * plain + n) // (2 * n))
    out_alpha = (2 * alpha_sum + n) // (2 * n)
    return np.concatenate([rgb, out_alpha], axis=-1).astype(np.uint8)


def downscale_area_reference(image: np.ndarray, factor: int) -> np.ndarray:
    """Loop-per-output-pixel twin of :func:`downscale_area` (tests compare the two)."""
    height, width, channels = image.shape
    out = np.zeros((height // factor, width // factor, channels), dtype=np.uint8)
    n = factor * factor
    for oy in range(height // factor):
        for ox in range(width // factor):
            block = image[oy * factor : (oy + 1) * factor, ox * factor : (ox + 1) * factor]
            pixels = [[int(v) for v in px] for row in block for px in row]
            total_a = sum(p[3] for p in pixels) if channels == 4 else 0
            for c in range(min(channels, 3)):
                if channels == 4 and total_a > 0:
                    num = sum(p[c] * p[3] for p in pixels)
                    out[oy, ox, c] = (2 * num + total_a) // (2 * total_a)
                else:
                    out[oy, ox, c] = (2 * sum(p[c] for p in pixels) + n) // (2 * n)
            if channels == 4:
                out[oy, ox, 3] = (2 * total_a + n) // (2 * n)
    return out
