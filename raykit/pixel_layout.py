"""Global pixel ids of a set of images: the frozen layout that decodes them.

A store numbers every pixel of its images once: ``pid = pixel_offset[image] + y * W + x``.
:class:`PixelLayout` holds the images' sizes and first ids and decodes pids back into
``(image, x, y)`` on a device, by one of three methods fixed when it is built (``decoding``):

* ``"uniform"``: every image has the same size and ids are packed without gaps: two divisions;
* ``"blocks"``: a table of blocks of ``2**shift`` ids, no longer than the shortest image, so that each
  block meets at most two images (one gather and a comparison);
* ``"search"``: a binary search over the images' first ids (any layout; used when the block table
  would be too large).

Vocabulary: ``N`` pids, ``I`` images.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raykit.errors import CameraError

__all__ = ["PixelLayout", "ThreadScratch", "floor_div", "index_float"]

Tensor = torch.Tensor

# Pixel-id decoding uses a block table while it stays this small (else a binary search).
_MAX_BLOCKS = 1 << 22


def index_float(device: torch.device) -> torch.dtype:
    """The float dtype index arithmetic goes through on ``device`` (float64; float32 on MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def floor_div(a: Tensor, b: Tensor | int, fdt: torch.dtype) -> Tensor:
    """``a // b`` for non-negative int64 ``a``, via float64 where available (faster on CPU).

    For ``a < 2**53`` the correctly rounded quotient ``a / b`` truncates to the exact integer quotient.
    """
    if fdt == torch.float64:
        return (a.to(fdt) / b).to(torch.int64)
    return torch.div(a, b, rounding_mode="floor")


class ThreadScratch:
    """Reusable per-thread buffers for temporaries that never leave a call (CPU only).

    Reusing a hot path's temporaries keeps the allocator from fragmenting under several generating
    threads (a loader's resident memory stays near its live data); on other devices a fresh tensor is
    returned (their caching allocators already reuse memory). One object per owner (a generator);
    the buffers of a thread go with the thread.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._local = threading.local()

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """A ``shape`` tensor of ``dtype`` named ``name`` (its contents are left over: overwrite them)."""
        if self.device.type != "cpu":
            return torch.empty(shape, dtype=dtype, device=self.device)
        buffers: dict[tuple[str, torch.dtype], Tensor] = self._local.__dict__.setdefault("buffers", {})
        numel = math.prod(shape)
        buffer = buffers.get((name, dtype))
        if buffer is None or buffer.numel() < numel:
            buffer = buffers[name, dtype] = torch.empty(numel, dtype=dtype)
        return buffer[:numel].view(shape)


@dataclass(frozen=True, eq=False)
class PixelLayout:
    """The pids of ``I`` images and how to decode them on ``device`` (build with :meth:`build`).

    Attributes:
        widths, heights: (I,) int64 image sizes.
        pixel_offset: (I + 1,) int64 first pid of every image, then the end of the last one.
        device: where pids are decoded.
        decoding: ``"uniform"``, ``"blocks"`` or ``"search"`` (see the module docstring).
    """

    widths: np.ndarray
    heights: np.ndarray
    pixel_offset: np.ndarray
    device: torch.device
    decoding: str
    uniform: tuple[int, int] | None  # (W, W * H) of the uniform layout
    block_shift: int
    _tables: dict[str, Tensor]  # device tensors: offsets, first, widths, widths_float, blocks, block_next

    @classmethod
    def build(
        cls, widths: Any, heights: Any, pixel_offset: Any = None, device: torch.device | str = "cpu"
    ) -> PixelLayout:
        """The layout of images of ``widths`` x ``heights`` (I,) with first ids ``pixel_offset``
        ((I,) or (I + 1,); default: the running sum of ``W * H``).
        """
        device = torch.device(device)
        w, h = np.asarray(widths, np.int64).reshape(-1), np.asarray(heights, np.int64).reshape(-1)
        offsets = _pixel_offsets(w * h, pixel_offset)
        uniform = _uniform(w, h, offsets)
        shift, blocks = (0, None) if uniform is not None else _block_table(offsets)
        decoding = "uniform" if uniform is not None else ("search" if blocks is None else "blocks")
        offsets_t = torch.as_tensor(offsets, device=device)
        widths_t = torch.as_tensor(w, device=device)
        fdt = index_float(device)
        tables = {
            "offsets": offsets_t,
            "first": offsets_t[:-1].contiguous(),
            "widths": widths_t,
            "widths_float": widths_t.to(fdt) if fdt == torch.float64 else widths_t,
            "heights": torch.as_tensor(h, device=device),
        }
        if blocks is not None:
            tables["blocks"] = torch.as_tensor(blocks, device=device)
            tables["block_next"] = offsets_t.index_select(0, tables["blocks"] + 1)
        return cls(w, h, offsets, device, decoding, uniform, shift, tables)

    @property
    def n_images(self) -> int:
        return len(self.widths)

    @property
    def n_pids(self) -> int:
        """One past the last image's last id."""
        return int(self.pixel_offset[-1])

    @property
    def widths_t(self) -> Tensor:
        """(I,) int64 widths on the device."""
        return self._tables["widths"]

    def decode(self, pid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(N,) int64 pids on the device -> (N,) int64 ``(image, x, y, local)``, ``local = y * W + x``."""
        fdt, t = index_float(self.device), self._tables
        if self.uniform is not None:
            w, wh = self.uniform
            image = floor_div(pid, wh, fdt)
            local = pid - image * wh
            y = floor_div(local, w, fdt)
            return image, local - y * w, y, local
        if "blocks" in t:
            block = pid >> self.block_shift
            # The block's first image, plus one where the id lies past that image's end.
            past = pid >= t["block_next"].index_select(0, block)
            image = t["blocks"].index_select(0, block) + past.to(torch.int64)
        else:
            image = torch.searchsorted(t["offsets"], pid, right=True) - 1
        local = pid - t["first"].index_select(0, image)
        y = floor_div(local, t["widths_float"].index_select(0, image), fdt)
        return image, local - y * t["widths"].index_select(0, image), y, local

    def decode_uniform(
        self, pid: Tensor, scratch: ThreadScratch, image: Tensor | None = None, pixel: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """:meth:`decode` of the uniform layout in float64 with few temporaries (the loader's path):
        (N,) integer pids (any integer dtype, uint32 included) ->
        ``(image (N,) int64, pixel (N, 2) int64, x (N,) float64, y (N,) float64)``, written into
        ``image`` and ``pixel`` when given; ``x`` and ``y`` live in ``scratch``.

        Exact: every value is an integer below 2**53, and a correctly rounded quotient of such
        integers truncates to the integer quotient.
        """
        if self.uniform is None:
            raise ValueError("PixelLayout.decode_uniform: the layout is not uniform")
        w, wh = self.uniform
        n, f64 = pid.shape[0], torch.float64
        value = scratch.get("value", (n,), f64).copy_(pid)
        # One kernel each for the truncated quotients (a division then ``trunc_`` costs 10x more on CPU).
        image_f = torch.div(value, wh, rounding_mode="trunc", out=scratch.get("image", (n,), f64))
        value.sub_(image_f, alpha=wh)  # the pixel's index within its image
        y = torch.div(value, w, rounding_mode="trunc", out=scratch.get("y", (n,), f64))
        x = value.sub_(y, alpha=w)
        if pixel is None:
            pixel = torch.empty((n, 2), dtype=torch.int64, device=pid.device)
        pixel[:, 0].copy_(x)
        pixel[:, 1].copy_(y)
        if image is None:
            return image_f.to(torch.int64), pixel, x, y
        return image.copy_(image_f), pixel, x, y

    def check_pids(self, pid: Tensor) -> None:
        """Raise ``CameraError`` unless every (N,) pid lies in ``[0, n_pids)`` (a device sync)."""
        if pid.numel() and (int(pid.min()) < 0 or int(pid.max()) >= self.n_pids):
            raise CameraError(f"RayGenerator: pixel id outside [0, {self.n_pids})")

    def check_pixels(self, image: Tensor, pixel: Tensor) -> None:
        """Raise ``CameraError`` unless every (N,) image index and (N, 2) pixel is inside (a sync)."""
        if image.numel() == 0:
            return
        if int(image.min()) < 0 or int(image.max()) >= self.n_images:
            raise CameraError(f"RayGenerator: image index outside [0, {self.n_images})")
        w, h = self._tables["widths"][image], self._tables["heights"][image]
        if bool(((pixel < 0).any(-1) | (pixel[:, 0] >= w) | (pixel[:, 1] >= h)).any()):
            raise CameraError("RayGenerator: pixel outside its image")


def _pixel_offsets(counts: np.ndarray, pixel_offset: Any) -> np.ndarray:
    n_images = len(counts)
    if pixel_offset is None:
        return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    offsets = np.asarray(pixel_offset, dtype=np.int64).reshape(-1)
    if len(offsets) == n_images:
        offsets = np.concatenate((offsets, [offsets[-1] + counts[-1]] if n_images else [0]))
    if len(offsets) != n_images + 1 or np.any(offsets[1:] - offsets[:-1] < counts):
        raise CameraError("RayGenerator: pixel_offset must give each image at least W * H ids, in order")
    return offsets


def _uniform(widths: np.ndarray, heights: np.ndarray, offsets: np.ndarray) -> tuple[int, int] | None:
    """``(W, W * H)`` when every image has the same size and ids are packed without gaps."""
    n = len(widths)
    if n == 0 or len(set(widths.tolist())) > 1 or len(set(heights.tolist())) > 1:
        return None
    w, wh = int(widths[0]), int(widths[0] * heights[0])
    return (w, wh) if np.array_equal(offsets, np.arange(n + 1, dtype=np.int64) * wh) else None


def _block_table(offsets: np.ndarray) -> tuple[int, np.ndarray | None]:
    counts = offsets[1:] - offsets[:-1]
    if len(counts) == 0 or counts.min() <= 0:
        return 0, None
    # Blocks of 2**shift ids, no longer than the shortest image: each block meets at most two images.
    shift = int(np.floor(np.log2(counts.min())))
    n_blocks = (int(offsets[-1]) >> shift) + 1
    if n_blocks > _MAX_BLOCKS:
        return 0, None
    starts = np.arange(n_blocks, dtype=np.int64) << shift
    first = np.searchsorted(offsets, starts, side="right") - 1
    return shift, np.clip(first, 0, len(counts) - 1)
