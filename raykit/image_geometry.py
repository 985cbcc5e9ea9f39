"""Whole-image camera operations: crops and undistortion to a pinhole camera.

A crop keeps the camera model and moves the principal point; undistortion resamples an image of any
model to a pinhole camera through a *remap table* (for every output pixel, the continuous source
coordinates its ray has in the input image), computed once per camera. Conventions as in
``raykit.cameras``: continuous COLMAP image coordinates, pixel ``(x, y)``'s centre at
``(x + 0.5, y + 0.5)``; images are ``(H, W, C)``.

The fast path (:class:`RemapTable`: four precomputed taps and weights per output pixel, one gather)
has a reference twin, :func:`reference_remap`, built on ``torch.nn.functional.grid_sample``.
Per-image components (masks, depth maps) are resampled by the nearest sample instead
(:meth:`RemapTable.apply_nearest`): a mask stays a mask and a depth is always one the map holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raykit.cameras import Camera, pixel_grid, project, unproject
from raykit.conventions import PIXEL_CENTER, pixel_centers
from raykit.errors import CameraError
from raykit.imagedecode import downscale_nearest, nearest_indices, reference_downscale_nearest

__all__ = [
    "RemapTable",
    "crop_camera",
    "downscale_depth",
    "downscale_mask",
    "nearest_indices",
    "pinhole_camera",
    "reference_downscale_nearest",
    "reference_remap",
    "reference_remap_nearest",
    "undistortion_coordinates",
]


def crop_camera(camera: Camera, x0: int, y0: int, width: int, height: int) -> Camera:
    """``camera`` for the window of ``width x height`` pixels whose top-left pixel is ``(x0, y0)``.

    Distortion acts on normalised coordinates, so only the principal point moves (by ``-x0, -y0``).
    """
    if not (x0 >= 0 and y0 >= 0 and width >= 1 and height >= 1):
        raise CameraError(f"{camera._who()}: crop ({x0}, {y0}, {width}x{height}) is not a window")
    if x0 + width > camera.width or y0 + height > camera.height:
        raise CameraError(
            f"{camera._who()}: crop ({x0}, {y0}, {width}x{height}) leaves the "
            f"{camera.width}x{camera.height} image"
        )
    ix, iy = camera.spec.pp_idx
    params = list(camera.params)
    params[ix] -= x0
    params[iy] -= y0
    return Camera(camera.model, width, height, tuple(params), camera.camera_id, camera.label)


def pinhole_camera(camera: Camera) -> Camera:
    """The ``PINHOLE`` camera (same size, focal lengths and principal point) an undistorted ``camera``
    image is resampled to; a fisheye input keeps the part of its field of view that pinhole covers."""
    (fx, fy), (cx, cy) = camera.focal, camera.principal_point
    return Camera("PINHOLE", camera.width, camera.height, (fx, fy, cx, cy), camera.camera_id, camera.label)


def undistortion_coordinates(camera: Camera, pinhole: Camera) -> torch.Tensor:
    """(H, W, 2) float64 continuous coordinates, in ``camera``'s image, of each ``pinhole`` pixel's ray
    (NaN where ``camera`` cannot see it)."""
    centres = pixel_centers(pixel_grid(pinhole.width, pinhole.height)).to(torch.float64)
    return project(camera, unproject(pinhole, centres))


@dataclass(frozen=True, eq=False)
class RemapTable:
    """Bilinear resampling of ``(H_in, W_in, C)`` images to ``(H, W, C)``, precomputed.

    Attributes:
        taps: (4, H * W) int32 flat indices into the input's pixels (0 where the tap is outside).
        weights: (4, H * W) float32 bilinear weights (0 for taps outside the input).
        out_shape: ``(H, W)``; in_shape: ``(H_in, W_in)``.
        nearest: (H * W,) int32 flat index of each output pixel's nearest input pixel (the sample
            position rounded half to even, as ``grid_sample``'s ``"nearest"``), -1 outside the input;
            None for a table made without it.
    """

    taps: np.ndarray
    weights: np.ndarray
    out_shape: tuple[int, int]
    in_shape: tuple[int, int]
    nearest: np.ndarray | None = None

    @classmethod
    def from_coordinates(cls, coords: torch.Tensor, in_shape: tuple[int, int]) -> RemapTable:
        """The table sampling the input at ``coords`` (H, W, 2) continuous image coordinates."""
        h_in, w_in = in_shape
        pos = coords.to(torch.float64).reshape(-1, 2).numpy() - PIXEL_CENTER  # pixel-index space
        finite = np.asarray(np.isfinite(pos).all(axis=-1))
        pos = np.where(finite[:, None], pos, -10.0)
        base = np.floor(pos)
        frac = pos - base
        taps, weights = [], []
        for dy in (0, 1):
            for dx in (0, 1):
                x, y = base[:, 0] + dx, base[:, 1] + dy
                w = (frac[:, 0] if dx else 1 - frac[:, 0]) * (frac[:, 1] if dy else 1 - frac[:, 1])
                inside = (x >= 0) & (x < w_in) & (y >= 0) & (y < h_in) & finite
                taps.append(np.where(inside, y * w_in + x, 0).astype(np.int32))
                weights.append(np.where(inside, w, 0.0).astype(np.float32))
        out_shape = (int(coords.shape[0]), int(coords.shape[1]))
        near = np.rint(pos)
        inside = (near[:, 0] >= 0) & (near[:, 0] < w_in) & (near[:, 1] >= 0) & (near[:, 1] < h_in) & finite
        nearest = np.where(inside, near[:, 1] * w_in + near[:, 0], -1).astype(np.int32)
        return cls(np.stack(taps), np.stack(weights), out_shape, (h_in, w_in), nearest)

    @classmethod
    def undistort(cls, camera: Camera) -> tuple[RemapTable, Camera]:
        """The table resampling ``camera``'s images to :func:`pinhole_camera`, and that camera."""
        pinhole = pinhole_camera(camera)
        coords = undistortion_coordinates(camera, pinhole)
        return cls.from_coordinates(coords, (camera.height, camera.width)), pinhole

    def _flat(self, image: np.ndarray) -> np.ndarray:
        """``image``'s pixels as (H_in * W_in, C) rows, its size checked."""
        h_in, w_in = self.in_shape
        if image.shape[:2] != (h_in, w_in):
            raise CameraError(f"remap: expected a {w_in}x{h_in} image, got {image.shape[1]}x{image.shape[0]}")
        return np.ascontiguousarray(image).reshape(h_in * w_in, -1)

    def apply(self, image: np.ndarray) -> np.ndarray:
        """``image`` (H_in, W_in, C) uint8 resampled to (H, W, C) uint8 (rounded; zero outside)."""
        flat = self._flat(image)
        shape = (self.taps.shape[1], flat.shape[1])
        out = np.full(shape, 0.5, dtype=np.float32)  # +0.5: rounding
        tap, term = np.empty(shape, dtype=np.uint8), np.empty(shape, dtype=np.float32)
        for k in range(4):  # one tap at a time, in place: a (H * W, C) gather, not a (H * W, 4, C) one
            np.take(flat, self.taps[k], axis=0, out=tap)
            np.multiply(tap, self.weights[k][:, None], out=term)
            out += term
        np.clip(out, 0, 255, out=out)
        return out.astype(np.uint8).reshape(*self.out_shape, flat.shape[1])

    def apply_nearest(self, image: np.ndarray) -> np.ndarray:
        """``image`` (H_in, W_in) or (H_in, W_in, C) of any dtype resampled to (H, W[, C]) by the nearest
        input pixel, 0 outside the input: how masks and depth maps are undistorted (no value is made
        up: every output is an input value or 0, "unknown" for a depth, "not used" for a mask)."""
        flat = self._flat(image)
        if self.nearest is None:
            raise CameraError("remap: this table was made without nearest taps (RemapTable.from_coordinates)")
        out = np.take(flat, np.maximum(self.nearest, 0), axis=0)
        out[self.nearest < 0] = 0
        return out.reshape(*self.out_shape, *image.shape[2:])

    @property
    def nbytes(self) -> int:
        extra = 0 if self.nearest is None else self.nearest.nbytes
        return int(self.taps.nbytes + self.weights.nbytes + extra)


def _grid_sample(image: np.ndarray, coords: torch.Tensor, mode: str) -> torch.Tensor:
    """(H, W, C) float64: ``image`` (H_in, W_in[, C]) sampled at ``coords`` (H, W, 2) continuous image
    coordinates (NaN: outside) by ``grid_sample`` with ``mode``, zeros outside."""
    h_in, w_in = image.shape[:2]
    planes = np.ascontiguousarray(image.reshape(h_in, w_in, -1))
    src = torch.from_numpy(planes).permute(2, 0, 1)[None].to(torch.float64)
    # grid_sample with align_corners=False puts -1 and +1 at the image's outer pixel edges, i.e. at
    # continuous coordinates 0 and W (H): the COLMAP convention itself.
    size = torch.tensor([w_in, h_in], dtype=torch.float64)
    grid = torch.nan_to_num(coords.to(torch.float64) / size * 2 - 1, nan=-10.0)[None]
    out = torch.nn.functional.grid_sample(src, grid, mode=mode, padding_mode="zeros", align_corners=False)
    return out[0].permute(1, 2, 0)


def reference_remap(image: np.ndarray, coords: torch.Tensor) -> np.ndarray:
    """Reference twin of :meth:`RemapTable.apply`: ``image`` (H_in, W_in, C) uint8, bilinear."""
    return (_grid_sample(image, coords, "bilinear") + 0.5).clamp(0, 255).to(torch.uint8).numpy()


def reference_remap_nearest(image: np.ndarray, coords: torch.Tensor) -> np.ndarray:
    """Reference twin of :meth:`RemapTable.apply_nearest`: ``image`` (H_in, W_in[, C]) of any dtype
    (float64 inside: exact for uint8, float16 and float32 values)."""
    result = _grid_sample(image, coords, "nearest").numpy().astype(image.dtype)
    return result.reshape(*result.shape[:2], *image.shape[2:])


# Per-image components (masks, depth maps): downscaled by the sample under each output pixel's centre
# (``raykit.imagedecode.downscale_nearest``, torch-free so that the store reads them without torch).


def downscale_mask(mask: np.ndarray, factor: int, size: tuple[int, int] | None = None) -> np.ndarray:
    """Downscale a mask (H, W) uint8 (0 = pixel not used) by the nearest sample (masks never blend).

    Args:
        size: None: level ``factor``, ``(H // factor, W // factor)`` from the top-left
            ``factor``-multiple of the image (``RayStore.read_image(downscale=...)``, the loaders'
            levels, ``raykit convert --downscale`` with the ``exact`` rule); else the output
            ``(h, w)`` spanning the whole image (the ``mipnerf360`` rule's
            ``round_half_up(H / factor)`` x ``round_half_up(W / factor)``).

    Each output pixel is the source pixel under its centre (:func:`raykit.imagedecode.nearest_indices`).
    """
    return downscale_nearest(np.asarray(mask), factor, size)


def downscale_depth(depth: np.ndarray, factor: int, size: tuple[int, int] | None = None) -> np.ndarray:
    """Downscale a depth map without inventing depths: each output pixel takes the depth of the source
    pixel under its centre, the same sample as :func:`downscale_mask` (an average across an object's
    edge would be a depth no surface has); 0 (unknown) stays 0. ``factor``, ``size``: as
    :func:`downscale_mask`."""
    return downscale_nearest(np.asarray(depth, dtype=np.float32), factor, size)
