"""Packed pixels: RGB or RGBA ``uint8`` rows <-> one native ``uint32`` per pixel (bytes r, g, b, a).

The writer stages every pixel as one ``uint32`` (alpha 255 for RGB) so that permuting and merging
moves 4-byte words. numpy copies an ``(n, 3)`` <-> ``(n, 4)`` channel slice one 3-byte row at a time;
these are whole-array strided passes (about 10x faster), tested against the plain slicing twins.
"""

from __future__ import annotations

import numpy as np

__all__ = ["pack_rgba", "pack_rgba_reference", "unpack_rgb", "unpack_rgb_reference"]

# The uint32 whose bytes in memory are (0, 0, 0, 255): the alpha byte of a packed pixel, any byte order.
_ALPHA = np.frombuffer(bytes((0, 0, 0, 255)), dtype=np.uint32)[0]


def pack_rgba(flat: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """(n,) uint32 packed pixels of ``flat``: bytes r, g, b, a in memory (alpha 255 for RGB); for RGBA
    without ``out``, a view of ``flat``'s (contiguous) bytes.

    Args:
        flat: (n, 3) or (n, 4) uint8 pixels.
        out: optional (n,) uint32 to write into.
    """
    n, channels = flat.shape
    if channels == 4:  # already packed: a view of the pixels (a copy only into ``out``)
        words = np.ascontiguousarray(flat).view(np.uint32).reshape(n)
        if out is None:
            return words
        np.copyto(out, words)
        return out
    if out is None:
        out = np.empty(n, dtype=np.uint32)
    if n == 0:
        return out
    data = np.ascontiguousarray(flat).reshape(-1)
    # Pixel k's bytes r, g, b and the next pixel's r, read as one (unaligned) word at byte 3k, whose
    # last byte the OR sets to 255. The last pixel has no next byte to read: it is packed on its own.
    words = np.ndarray((n - 1,), dtype=np.uint32, buffer=data, strides=(3,))
    np.bitwise_or(words, _ALPHA, out=out[:-1])
    last = out[-1:].view(np.uint8)
    last[:3] = data[-3:]
    last[3] = 255
    return out


def unpack_rgb(packed: np.ndarray) -> np.ndarray:
    """(n, 3) uint8 colours of (n,) uint32 packed pixels (alpha dropped): one strided pass per channel."""
    n = len(packed)
    source = np.ascontiguousarray(packed).view(np.uint8)
    out = np.empty((n, 3), dtype=np.uint8)
    flat = out.reshape(-1)
    for c in range(3):
        flat[c::3] = source[c::4]
    return out


def pack_rgba_reference(flat: np.ndarray) -> np.ndarray:
    """Twin of :func:`pack_rgba` by channel slicing."""
    rgba = np.full((len(flat), 4), 255, dtype=np.uint8)
    rgba[:, : flat.shape[1]] = flat
    return rgba.view(np.uint32).reshape(-1)


def unpack_rgb_reference(packed: np.ndarray) -> np.ndarray:
    """Twin of :func:`unpack_rgb` by channel slicing."""
    return np.ascontiguousarray(np.ascontiguousarray(packed).view(np.uint8).reshape(-1, 4)[:, :3])
