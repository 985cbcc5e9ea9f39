"""Ray batches and the loader's hot path: (image, pixel) -> world-frame rays.

:class:`RayGenerator` is a thin composition of three parts: the frozen pixel-id layout of its images
(:class:`raykit.pixel_layout.PixelLayout`: pid decoding), the direction functions of its cameras'
kind, chosen once (:mod:`raykit.ray_directions`: pinhole, direction tables or unprojection), and one
packed per-image table on the device (direction columns, origin, near, far). A batch then costs one
gather per ray plus a few element-wise ops, whatever the model. :func:`reference_rays` is the simple
twin (a loop over images calling :func:`raykit.cameras.pixels_to_rays`, sharing no state with the
generator) that tests compare against.

Vocabulary: ``N`` rays, ``I`` images, ``C`` cameras. ``RayBatch`` and ``Rays`` live in
``raykit.ray_batch`` and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from raykit.cameras import Camera, pixels_to_rays
from raykit.errors import CameraError
from raykit.pixel_layout import PixelLayout, ThreadScratch, index_float
from raykit.ray_batch import RayBatch, Rays, unit_colours
from raykit.ray_directions import Pixels, directions_for

__all__ = [
    "UNKNOWN_FAR",
    "RayBatch",
    "RayGenerator",
    "Rays",
    "materialized_rays",
    "reference_rays",
    "table_ray_generator",
    "unit_colours",
]

Tensor = torch.Tensor


GENERATE_BLOCK = 1 << 15  # rays generated per block on the CPU (RayGenerator.batch_from_pids)


def _image_inputs(
    n_cameras: int, camera_index: Any, c2w: Any, near: Any, far: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The per-image inputs of a generator (and its twin), checked: (I,) int64 camera indices, (I, 4, 4)
    float64 poses and (I,) finite float64 near and far bounds (a scalar applies to every image)."""
    cam_idx = np.asarray(camera_index, dtype=np.int64).reshape(-1)
    n_images = len(cam_idx)
    poses = np.asarray(c2w.cpu() if isinstance(c2w, Tensor) else c2w, dtype=np.float64)
    if poses.shape != (n_images, 4, 4):
        raise CameraError(f"RayGenerator: expected c2w of shape ({n_images}, 4, 4), got {poses.shape}")
    if n_images and (cam_idx.min() < 0 or cam_idx.max() >= n_cameras):
        raise CameraError(f"RayGenerator: camera_index outside [0, {n_cameras})")
    bounds = []
    for name, values in (("near", near), ("far", far)):
        arr = np.broadcast_to(np.asarray(values, dtype=np.float64), (n_images,))
        if not np.isfinite(arr).all():
            raise CameraError(f"RayGenerator: {name} must be finite")
        bounds.append(arr)
    return cam_idx, poses, bounds[0], bounds[1]


class RayGenerator:
    """Vectorised (image, pixel) -> world-frame rays for a fixed set of images (see the module).

    Args:
        cameras: (C) cameras.
        camera_index: (I,) int camera row of each image.
        c2w: (I, 4, 4) camera-to-world poses (OpenCV camera frame), numpy or torch.
        near, far: (I,) or scalar bounds per image.
        pixel_offset: (I,) or (I + 1,) int first global pixel id of each image; default: the running
            sum of ``W * H`` in image order (``pid = pixel_offset[image] + y * W + x``).
        lut_max_bytes: memory limit of the concatenated direction table. Above it (e.g. thousands of
            distorted per-image cameras) rays are unprojected per batch instead (``mode ==
            "unproject"``): exact, but slower.

    Attributes:
        mode: ``"pinhole"`` (analytic), ``"lut"`` (one table gather) or ``"unproject"``.
        pixels: the :class:`~raykit.pixel_layout.PixelLayout` of the images' pids.
        directions: the camera kind's direction functions.
    """

    def __init__(
        self,
        cameras: Sequence[Camera],
        camera_index: Any,
        c2w: Any,
        near: Any,
        far: Any,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        pixel_offset: Any = None,
        lut_max_bytes: int = 2 << 30,
    ) -> None:
        self.cameras = tuple(cameras)
        self.device, self.dtype = torch.device(device), dtype
        cam_idx, poses, self.near, self.far = _image_inputs(len(self.cameras), camera_index, c2w, near, far)
        self.camera_index, self.c2w = cam_idx, poses
        sizes = np.array([(c.width, c.height) for c in self.cameras], dtype=np.int64).reshape(-1, 2)
        self.pixels = PixelLayout.build(sizes[cam_idx, 0], sizes[cam_idx, 1], pixel_offset, self.device)
        self.directions = directions_for(self.cameras, cam_idx, dtype, self.device, lut_max_bytes)
        # The per-image parts gathered per ray: the 9 direction columns, (9, I) so that a gather along
        # dim 1 gives a contiguous row per column; origins as (I, 3) rows; near and far as (I,).
        columns = self.directions.columns(poses[:, :3, :3]).T
        self._columns, self._origins, self._near, self._far = (
            torch.tensor(np.ascontiguousarray(a), device=self.device).to(dtype)
            for a in (columns, poses[:, :3, 3], self.near, self.far)
        )
        self._scratch = ThreadScratch(self.device)

    # ---- derived views (one source each) -----------------------------------------------------
    @property
    def mode(self) -> str:
        return self.directions.mode

    @property
    def uses_lut(self) -> bool:
        return self.mode == "lut"

    @property
    def n_images(self) -> int:
        return len(self.camera_index)

    @property
    def widths(self) -> np.ndarray:
        """(I,) int64 image widths."""
        return self.pixels.widths

    @property
    def heights(self) -> np.ndarray:
        """(I,) int64 image heights."""
        return self.pixels.heights

    @property
    def pixel_offset(self) -> np.ndarray:
        """(I + 1,) int64 first pid of every image, then the end of the last."""
        return self.pixels.pixel_offset

    @property
    def pid_decoding(self) -> str:
        """How :meth:`decode_pids` finds a pid's image: ``"uniform"`` (images of one size packed
        without gaps: a division), ``"blocks"`` (a block table, at most two images per block) or
        ``"search"`` (a binary search over the images' first ids)."""
        return self.pixels.decoding

    # ---- generation --------------------------------------------------------------------------
    def generate(self, image: Tensor, pixel: Tensor, check: bool = False) -> Rays:
        """World-frame rays through the centres of the given pixels.

        Args:
            image: (N,) int image indices (rows of ``c2w``).
            pixel: (N, 2) int pixels ``(x, y)``.
            check: validate indices first (costs a device sync); off in the hot path.

        Returns:
            :class:`Rays` ``(origins (N, 3), directions (N, 3) unit, z_scale (N,), near (N,), far (N,))``,
            all contiguous.
        """
        image = image.to(self.device, torch.int64, non_blocking=True)
        pixel = pixel.to(self.device, torch.int64, non_blocking=True)
        if check:
            self.pixels.check_pixels(image, pixel)
        return self._generate(image, pixel[:, 0], pixel[:, 1])

    def _generate(
        self, image: Tensor, x: Tensor, y: Tensor, local: Tensor | None = None, out: Rays | None = None
    ) -> Rays:
        """:meth:`generate` for validated (N,) int64 ``image``, ``x``, ``y`` (and ``y * W + x``).

        ``out``: tensors to write the rays into (pinhole mode only).
        """
        # One gather of the direction columns: (9, N), each row contiguous for fast element-wise math.
        n = image.shape[0]
        cols = torch.index_select(self._columns, 1, image, out=self._scratch.get("cols", (9, n), self.dtype))
        z_out = out.z_scale if out is not None else None
        world, z_scale = self.directions.world(cols, Pixels(image, x, y, local), self._scratch, z_out)
        if out is not None:
            torch.index_select(self._origins, 0, image, out=out.origins)
            torch.index_select(self._near, 0, image, out=out.near)
            torch.index_select(self._far, 0, image, out=out.far)
            out.directions.T.copy_(world)
            return out
        origins = self._origins.index_select(0, image)
        near, far = self._near.index_select(0, image), self._far.index_select(0, image)
        return Rays(origins, _rows_to_points(world), z_scale, near, far)

    def batch_from_pids(
        self, pid: Tensor, rgba: Tensor, extra: Mapping[str, Tensor] | None = None
    ) -> RayBatch:
        """(N,) pixel ids (int64, or uint32 as stored) and (N, 3|4) uint8 colours -> the ``RayBatch``
        of those rays on the device; ``extra`` (stored fields, on the device) is carried as it is.

        The loader's path; equal to ``RayBatch.from_rays(rgba, *self.generate_from_pids(pid))``. On the
        CPU with same-size pinhole images every float field is a contiguous view of one allocation
        and ``image``/``pixel`` of another: two allocations of the same sizes per batch, which keeps
        the memory of a loader generating on several threads from fragmenting.
        """
        uniform = self.pixels.uniform is not None
        if not (
            self.device.type == "cpu" and self.dtype == torch.float32 and uniform and self.mode == "pinhole"
        ):
            image, pixel, rays = self.generate_from_pids(pid)
            return RayBatch.from_rays(rgba.to(self.device), image, pixel, rays, extra)
        n, c = pid.shape[0], rgba.shape[1]
        floats = torch.empty((9 + c) * n, dtype=torch.float32)
        ints = torch.empty(3 * n, dtype=torch.int64)
        origins, directions = floats[: 3 * n].view(n, 3), floats[3 * n : 6 * n].view(n, 3)
        colour = floats[6 * n : (6 + c) * n].view(n, c)
        near, far, z_scale = floats[(6 + c) * n :].view(3, n).unbind(0)
        image, pixel = ints[:n], ints[n:].view(n, 2)
        pid = pid.to(self.device)
        # In blocks of GENERATE_BLOCK rays: the temporaries (about 90 bytes per ray, in per-thread
        # scratch) stay small and in cache whatever the group size; each block writes its rows.
        for lo in range(0, n, GENERATE_BLOCK):
            hi = min(n, lo + GENERATE_BLOCK)
            block_image = image[lo:hi]
            _, _, x, y = self.pixels.decode_uniform(pid[lo:hi], self._scratch, block_image, pixel[lo:hi])
            rows = Rays(origins[lo:hi], directions[lo:hi], z_scale[lo:hi], near[lo:hi], far[lo:hi])
            self._generate(block_image, x, y, out=rows)
        colour.copy_(rgba).div_(255.0)
        alpha = colour[:, 3] if c == 4 else None
        return RayBatch(
            origins, directions, colour[:, :3], alpha, image, pixel, near, far, z_scale, dict(extra or {})
        )

    def decode_pids(self, pid: Tensor) -> tuple[Tensor, Tensor]:
        """(N,) global pixel ids -> ``(image (N,) int64, pixel (N, 2) int64)`` on the device."""
        image, x, y, _ = self.pixels.decode(pid.to(self.device).to(torch.int64))
        return image, torch.stack((x, y), dim=-1)

    def generate_from_pids(self, pid: Tensor, check: bool = False) -> tuple[Tensor, Tensor, Rays]:
        """(N,) global pixel ids -> ``(image (N,), pixel (N, 2), rays)``; see :meth:`generate`."""
        pid = pid.to(self.device).to(torch.int64)
        if check:
            self.pixels.check_pids(pid)
        if (
            self.pixels.uniform is not None
            and self.mode == "pinhole"
            and index_float(self.device) == torch.float64
        ):
            image, pixel, xf, yf = self.pixels.decode_uniform(pid, self._scratch)
            if check:
                self.pixels.check_pixels(image, pixel)
            return image, pixel, self._generate(image, xf, yf)
        image, x, y, local = self.pixels.decode(pid)
        pixel = torch.stack((x, y), dim=-1)
        if check:
            self.pixels.check_pixels(image, pixel)
        return image, pixel, self._generate(image, x, y, local)


def reference_rays(
    cameras: Sequence[Camera],
    camera_index: Any,
    c2w: Any,
    near: Any,
    far: Any,
    image: Tensor,
    pixel: Tensor,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Rays:
    """The simple twin of :meth:`RayGenerator.generate` (the generator's arguments, then its
    ``generate``'s): a loop over the images calling ``pixels_to_rays``; shares nothing with the fast path."""
    device = torch.device(device)
    cam_idx, poses, near, far = _image_inputs(len(cameras), camera_index, c2w, near, far)
    image, pixel = image.to(device, torch.int64), pixel.to(device, torch.int64)
    n = image.shape[0]
    out = {k: torch.zeros(s, dtype=dtype, device=device) for k, s in _shapes(n).items()}
    for i in torch.unique(image).tolist():
        if not 0 <= i < len(cam_idx):
            raise CameraError(f"RayGenerator: image index outside [0, {len(cam_idx)})")
        mask = image == i
        cam = cameras[int(cam_idx[i])]
        px = pixel[mask]
        if bool(((px < 0).any(-1) | (px[:, 0] >= cam.width) | (px[:, 1] >= cam.height)).any()):
            raise CameraError("RayGenerator: pixel outside its image")
        pose = torch.as_tensor(poses[i], dtype=dtype, device=device)
        o, d, z = pixels_to_rays(cam, pose, px, dtype=dtype)
        out["origins"][mask], out["directions"][mask], out["z_scale"][mask] = o, d, z
        out["near"][mask], out["far"][mask] = float(near[i]), float(far[i])
    return Rays(**out)


def _rows_to_points(rows: Tensor) -> Tensor:
    """(3, N) -> contiguous (N, 3); a strided copy is several times faster than ``.T.contiguous()``."""
    points = torch.empty((rows.shape[1], 3), dtype=rows.dtype, device=rows.device)
    points.T.copy_(rows)
    return points


def _shapes(n: int) -> dict[str, tuple[int, ...]]:
    return {"origins": (n, 3), "directions": (n, 3), "z_scale": (n,), "near": (n,), "far": (n,)}


UNKNOWN_FAR = 1e10  # far bound of images whose far is unknown (neither per image nor per scene)


def table_ray_generator(
    table: Any, device: Any, *, near: float | None = None, far: float | None = None
) -> RayGenerator:
    """A :class:`RayGenerator` for the images of a store's camera table (``raykit.store``'s
    ``CameraTable``: ``cameras``, ``camera_index``, ``c2w``, ``near``, ``far``, ``pixel_offset``).

    Unknown per-image near/far fall back to ``near``/``far`` (the scene's), then to 0 and
    ``UNKNOWN_FAR`` (rays need finite bounds).
    """
    near_arr = np.where(np.isnan(table.near), 0.0 if near is None else near, table.near)
    far_arr = np.where(np.isnan(table.far), UNKNOWN_FAR if far is None else far, table.far)
    return RayGenerator(
        table.cameras,
        torch.from_numpy(table.camera_index),
        torch.from_numpy(table.c2w),
        torch.from_numpy(near_arr),
        torch.from_numpy(far_arr),
        device=device,
        dtype=torch.float32,
        pixel_offset=table.pixel_offset,
    )


def materialized_rays(table: Any, pid: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    """``origins`` and ``directions`` (N, 3) of ``dtype`` of the rays of (N,) pids of a camera table's
    images (a store's ``materialize``; ``table.decode(pid)``: image and pixel)."""
    image, pixel = table.decode(pid)
    generator = table_ray_generator(table, "cpu")
    origins, directions, *_ = generator.generate(torch.from_numpy(image), torch.from_numpy(pixel))
    return {"origins": origins.numpy().astype(dtype), "directions": directions.numpy().astype(dtype)}
