"""Camera-frame ray directions of pixel centres, one implementation per camera kind.

:func:`directions_for` chooses the kind once, for a generator's cameras:

* :class:`PinholeDirections` (every camera used is a pinhole): analytic. Each image's three packed
  columns are those of ``R @ inv(K)`` with the half-pixel shift folded into the third, so that the
  world direction of pixel ``(x, y)`` is ``c0 * x + c1 * y + c2``, normalised;
* :class:`LutDirections` (distorted cameras whose direction tables fit ``lut_max_bytes``): one gather
  from the concatenated per-camera tables of :func:`raykit.cameras.direction_lut`;
* :class:`UnprojectDirections` (too many distorted cameras for tables): per-batch unprojection with
  each ray's camera parameters, exact but slower.

Every kind maps ``cols`` (9, N) (each ray's packed columns, gathered by the generator) and the
rays' :class:`Pixels` to ``(world (3, N) unit directions, z_scale (N,))``, where
``z_scale`` is the camera-frame z of the unit direction. Vocabulary: ``N`` rays, ``I`` images,
``C`` cameras.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np
import torch

from raykit.camera_models import CAMERA_MODELS, CameraModel, unproject_model
from raykit.cameras import Camera, direction_lut
from raykit.conventions import PIXEL_CENTER, pixel_centers
from raykit.pixel_layout import ThreadScratch, index_float

__all__ = [
    "Directions",
    "LutDirections",
    "PinholeDirections",
    "Pixels",
    "UnprojectDirections",
    "directions_for",
]

Tensor = torch.Tensor


class Pixels(NamedTuple):
    """The rays' pixels: (N,) int64 ``image``, ``x``, ``y`` (``x``, ``y`` may be float64 holding
    integers), and ``local = y * W + x`` when known."""

    image: Tensor
    x: Tensor
    y: Tensor
    local: Tensor | None = None


class Directions(Protocol):
    """What a camera kind provides to :class:`raykit.rays.RayGenerator`."""

    mode: str

    def columns(self, rotations: np.ndarray) -> np.ndarray:
        """(I, 3, 3) camera-to-world rotations -> (I, 9) packed columns ``c0, c1, c2`` per image."""
        ...

    def world(
        self, cols: Tensor, at: Pixels, scratch: ThreadScratch, z_out: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(world (3, N) unit directions, z_scale (N,))`` of the rays through the pixels ``at``;
        ``z_out`` (N,) receives ``z_scale`` when given."""
        ...


class PinholeDirections:
    """Analytic pinhole directions: ``normalise(c0 * x + c1 * y + c2)`` (see the module docstring)."""

    mode = "pinhole"

    def __init__(self, cameras: Sequence[Camera], camera_index: np.ndarray, dtype: torch.dtype) -> None:
        self.cameras, self.camera_index, self.dtype = cameras, camera_index, dtype

    def columns(self, rotations: np.ndarray) -> np.ndarray:
        cols = np.zeros((len(rotations), 9))
        for row, c in enumerate(self.camera_index):
            (fx, fy), (cx, cy) = self.cameras[c].focal, self.cameras[c].principal_point
            r = rotations[row]
            # Pixel centre (x + 0.5, y + 0.5): fold the half-pixel shift into c2.
            px, py = PIXEL_CENTER - cx, PIXEL_CENTER - cy
            cols[row, 0:3], cols[row, 3:6] = r[:, 0] / fx, r[:, 1] / fy
            cols[row, 6:9] = r[:, 2] + r[:, 0] * (px / fx) + r[:, 1] * (py / fy)
        return cols

    def world(
        self, cols: Tensor, at: Pixels, scratch: ThreadScratch, z_out: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        n, dtype = at.image.shape[0], self.dtype
        px, py = scratch.get("px", (n,), dtype).copy_(at.x), scratch.get("py", (n,), dtype).copy_(at.y)
        world = torch.addcmul(cols[6:9], cols[0:3], px, out=scratch.get("world", (3, n), dtype))
        world.addcmul_(cols[3:6], py)
        # The camera-frame ray is (u, v, 1) / |(u, v, 1)| and |R (u, v, 1)| = |(u, v, 1)|, so its z is
        # 1 / |R (u, v, 1)|.
        square = torch.mul(world, world, out=scratch.get("square", (3, n), dtype))
        z_scale = square.sum(0) if z_out is None else torch.sum(square, 0, out=z_out)
        world.mul_(z_scale.rsqrt_())
        return world, z_scale


class _RotatedDirections:
    """Kinds that compute camera-frame directions and rotate them by the image's ``R``."""

    mode = ""

    def __init__(
        self,
        cameras: Sequence[Camera],
        camera_index: np.ndarray,
        used: Sequence[int],
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.dtype, self.device = dtype, device
        self._build(cameras, camera_index, used)

    def _build(self, cameras: Sequence[Camera], camera_index: np.ndarray, used: Sequence[int]) -> None:
        raise NotImplementedError  # each subclass builds its tables

    def columns(self, rotations: np.ndarray) -> np.ndarray:
        return np.concatenate([rotations[:, :, 0], rotations[:, :, 1], rotations[:, :, 2]], axis=1)

    def camera_rays(self, image: Tensor, x: Tensor, y: Tensor, local: Tensor | None) -> Tensor:
        raise NotImplementedError  # each subclass defines it

    def world(
        self, cols: Tensor, at: Pixels, scratch: ThreadScratch, z_out: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        d_cam = self.camera_rays(*at)
        z_scale = d_cam[:, 2] if z_out is None else z_out.copy_(d_cam[:, 2])
        world = torch.addcmul(cols[6:9] * d_cam[:, 2], cols[0:3], d_cam[:, 0]).addcmul_(
            cols[3:6], d_cam[:, 1]
        )
        return world, z_scale


class LutDirections(_RotatedDirections):
    """One gather per ray from the concatenated direction tables of the cameras used."""

    mode = "lut"

    def _build(self, cameras: Sequence[Camera], camera_index: np.ndarray, used: Sequence[int]) -> None:
        dtype, device = self.dtype, self.device
        offsets = np.zeros(len(cameras), dtype=np.int64)
        parts, total = [], 0
        for c in used:
            offsets[c] = total
            parts.append(direction_lut(cameras[c], dtype, device).reshape(-1, 3))
            total += parts[-1].shape[0]
        self.lut = torch.cat(parts, 0)
        self.lut_offset = torch.as_tensor(offsets[camera_index], dtype=torch.int64, device=device)
        widths = np.array([c.width for c in cameras], dtype=np.int64)
        self.widths = torch.as_tensor(widths[camera_index], device=device)
        # A single camera: LUT row = y * W + x, no per-image lookups.
        self.single_width = cameras[used[0]].width if len(used) == 1 else 0

    def camera_rays(self, image: Tensor, x: Tensor, y: Tensor, local: Tensor | None) -> Tensor:
        if local is None:
            w = self.single_width if self.single_width else self.widths.index_select(0, image)
            local = y * w + x
        rows = local if self.single_width else self.lut_offset.index_select(0, image) + local
        return self.lut.index_select(0, rows)


class UnprojectDirections(_RotatedDirections):
    """Per-batch unprojection, with per-model parameter tables and each image's group and row."""

    mode = "unproject"

    def _build(self, cameras: Sequence[Camera], camera_index: np.ndarray, used: Sequence[int]) -> None:
        device = self.device
        group = np.zeros(len(cameras), dtype=np.int64)
        row = np.zeros(len(cameras), dtype=np.int64)
        self.groups: list[tuple[CameraModel, Tensor]] = []
        for g, name in enumerate(sorted({cameras[c].model for c in used})):
            members = [c for c in used if cameras[c].model == name]
            group[members], row[members] = g, np.arange(len(members))
            params = torch.tensor([cameras[c].params for c in members], dtype=torch.float64)
            self.groups.append((CAMERA_MODELS[name], params.to(device, index_float(device))))
        self.group = torch.as_tensor(group[camera_index], dtype=torch.int64, device=device)
        self.group_row = torch.as_tensor(row[camera_index], dtype=torch.int64, device=device)

    def camera_rays(self, image: Tensor, x: Tensor, y: Tensor, local: Tensor | None) -> Tensor:
        """(N, 3) camera-frame unit rays of pixel centres, unprojected now with per-ray parameters."""
        xy = pixel_centers(torch.stack((x, y), dim=-1).to(index_float(self.device)))
        group, row = self.group.index_select(0, image), self.group_row.index_select(0, image)
        out = torch.empty((image.shape[0], 3), dtype=self.dtype, device=self.device)
        for g, (spec, table) in enumerate(self.groups):
            sel = torch.nonzero(group == g).squeeze(1)
            params = table.index_select(0, row[sel])
            rays, _ = unproject_model(spec, params.unbind(-1), xy[sel])
            out[sel] = rays.to(self.dtype)
        return out


def directions_for(
    cameras: Sequence[Camera],
    camera_index: np.ndarray,
    dtype: torch.dtype,
    device: torch.device,
    lut_max_bytes: int,
) -> Directions:
    """The kind for images ``camera_index`` (I,) of ``cameras``: pinhole when every camera used is
    one, else direction tables when they fit ``lut_max_bytes``, else unprojection."""
    used = sorted(set(camera_index.tolist()))
    if all(cameras[c].is_pinhole for c in used):
        return PinholeDirections(cameras, camera_index, dtype)
    n_bytes = sum(cameras[c].width * cameras[c].height for c in used) * 3 * dtype.itemsize
    if n_bytes <= lut_max_bytes:
        return LutDirections(cameras, camera_index, used, dtype, device)
    return UnprojectDirections(cameras, camera_index, used, dtype, device)
