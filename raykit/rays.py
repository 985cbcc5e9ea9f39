"""Ray batches and the loader's hot path: (image, pixel) -> world-frame rays.

:class:`RayGenerator` keeps, on the target device, one packed row per image (rotation, origin, near,
far, intrinsics) and, when any camera is distorted, one concatenated direction lookup table of all
cameras. A batch then costs one gather per ray plus a few element-wise ops, whatever the model.
:func:`reference_rays` is the simple twin (a loop over images calling
:func:`raykit.cameras.pixels_to_rays`) that tests compare against.

Vocabulary: ``N`` rays, ``I`` images, ``C`` cameras.

Length (about 600 lines): ``RayGenerator``'s tables, decoders and three direction modes share its
per-image table and scratch buffers; splitting it into a pid layout, per-kind direction functions
and a thin composing class is planned (issue 17, part 3) and not done yet.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from dataclasses import field as dataclass_field
from typing import Any, NamedTuple

import numpy as np
import torch

from raykit.camera_models import CAMERA_MODELS, CameraModel, unproject_model
from raykit.cameras import Camera, direction_lut, pixels_to_rays
from raykit.conventions import PIXEL_CENTER, pixel_centers
from raykit.errors import CameraError

__all__ = ["RayBatch", "RayGenerator", "Rays", "reference_rays"]

Tensor = torch.Tensor

# Rows of the packed per-image float table: three 3-vectors c0, c1, c2 (pinhole: the columns of
# R @ inv(K), so that R @ inv(K) @ (x, y, 1) = c0 * x + c1 * y + c2; LUT: the columns of R), then the
# origin, near and far.
_C0, _C1, _C2, _ORIGIN, _NEAR, _FAR = slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12), 12, 13
_TABLE_COLS = 14
# Pixel-id decoding uses a block table while it stays this small (else a binary search).
_MAX_BLOCKS = 1 << 22


@dataclass
class RayBatch:
    """A batch of rays with their pixels' colours.

    Attributes:
        origins: (N, 3) world-frame ray origins.
        directions: (N, 3) unit world-frame directions.
        rgb: (N, 3) float colours in [0, 1] (straight, not premultiplied by alpha).
        alpha: (N,) float coverage in [0, 1], or None for opaque images.
        image: (N,) int64 row index into the store's camera/image table.
        pixel: (N, 2) int64 integer pixels ``(x, y)``.
        near: (N,) near bounds (distance along the unit ray).
        far: (N,) far bounds.
        z_scale: (N,) camera-frame z of the unit direction (``depth_z = t * z_scale``).
        extra: fields the store holds besides colours and pixel ids, e.g. materialised ``origins`` and
            ``directions`` as stored (float16/float32, (N, 3)); empty for compact stores.
    """

    origins: Tensor
    directions: Tensor
    rgb: Tensor
    alpha: Tensor | None
    image: Tensor
    pixel: Tensor
    near: Tensor
    far: Tensor
    z_scale: Tensor
    extra: dict[str, Tensor] = dataclass_field(default_factory=dict)

    @classmethod
    def from_rays(
        cls, rgba: Tensor, image: Tensor, pixel: Tensor, rays: Rays, extra: Mapping[str, Tensor] | None = None
    ) -> RayBatch:
        """Assemble a batch from generated ``rays``, (N, 3|4) uint8 colours and the stored ``extra``
        fields, all on the same device."""
        scaled = rgba.to(torch.float32).div_(255.0)
        return cls(
            origins=rays.origins,
            directions=rays.directions,
            rgb=scaled[:, :3],
            alpha=scaled[:, 3] if rgba.shape[1] == 4 else None,
            image=image,
            pixel=pixel,
            near=rays.near,
            far=rays.far,
            z_scale=rays.z_scale,
            extra=dict(extra or {}),
        )

    def __len__(self) -> int:
        return int(self.origins.shape[0])

    def _map(self, fn: Any) -> RayBatch:
        mapped = {k: None if (v := getattr(self, k)) is None else fn(v) for k in _FIELDS}
        return RayBatch(**mapped, extra={k: fn(v) for k, v in self.extra.items()})  # type: ignore[arg-type]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RayBatch:
        """A copy with every tensor on ``device`` (``non_blocking`` for pinned host memory)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> RayBatch:
        """A copy in page-locked host memory (for asynchronous host-to-GPU copies)."""
        return self._map(lambda t: t.pin_memory())

    def __getitem__(self, index: slice | Tensor) -> RayBatch:
        """The sub-batch selected by a slice, an index tensor or a bool mask."""
        return self._map(lambda t: t[index])

    def split(self, sizes: Sequence[int]) -> list[RayBatch]:
        """Consecutive sub-batches (views) of the given sizes, which must add up to ``len(self)``.

        Same result as slicing one by one, with one split per field instead of one slice per
        field and sub-batch (the loader cuts every generated group of rays this way).
        """
        parts = [None if v is None else v.split(list(sizes)) for v in map(self.__getattribute__, _FIELDS)]
        extra = {k: v.split(list(sizes)) for k, v in self.extra.items()}
        batches = []
        for i in range(len(sizes)):
            tensors = {name: None if p is None else p[i] for name, p in zip(_FIELDS, parts, strict=True)}
            batches.append(RayBatch(**tensors, extra={k: v[i] for k, v in extra.items()}))  # type: ignore[arg-type]
        return batches

    def composite(self, background: Tensor | Sequence[float]) -> Tensor:
        """(N, 3) colours over ``background`` (3,): ``rgb * alpha + background * (1 - alpha)``.

        Returns ``rgb`` unchanged when there is no alpha.
        """
        if self.alpha is None:
            return self.rgb
        bg = torch.as_tensor(background, dtype=self.rgb.dtype, device=self.rgb.device)
        a = self.alpha[:, None].to(self.rgb.dtype)
        return self.rgb * a + bg * (1.0 - a)


_FIELDS = tuple(f.name for f in fields(RayBatch) if f.name != "extra")  # the tensor fields
_THREAD = threading.local()  # per-thread scratch buffers of RayGenerator._scratch


class Rays(NamedTuple):
    """Output of :meth:`RayGenerator.generate`; unpacks as a 5-tuple."""

    origins: Tensor
    directions: Tensor
    z_scale: Tensor
    near: Tensor
    far: Tensor


def _per_image(name: str, values: Any, n_images: int) -> np.ndarray:
    arr = np.broadcast_to(np.asarray(values, dtype=np.float64), (n_images,))
    if not np.isfinite(arr).all():
        raise CameraError(f"RayGenerator: {name} must be finite")
    return arr


class RayGenerator:
    """Vectorised (image, pixel) -> world-frame rays for a fixed set of images.

    Args:
        cameras: (C) cameras.
        camera_index: (I,) int camera row of each image.
        c2w: (I, 4, 4) camera-to-world poses (OpenCV camera frame), numpy or torch.
        near: (I,) or scalar near bound per image.
        far: (I,) or scalar far bound per image.
        device: where rays are generated.
        dtype: float dtype of the rays.
        pixel_offset: (I,) or (I + 1,) int first global pixel id of each image; default: the running
            sum of ``W * H`` in image order (``pid = pixel_offset[image] + y * W + x``).
        lut_max_bytes: memory limit of the concatenated direction table. Above it (e.g. thousands of
            distorted per-image cameras) rays are unprojected per batch instead (``mode ==
            "unproject"``): exact, but slower.

    Attributes:
        mode: ``"pinhole"`` (analytic), ``"lut"`` (one table gather) or ``"unproject"``.

    Raises:
        CameraError: inconsistent shapes or camera indices.
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
        cam_idx = np.asarray(camera_index, dtype=np.int64).reshape(-1)
        n_images = len(cam_idx)
        poses = np.asarray(c2w.cpu() if isinstance(c2w, Tensor) else c2w, dtype=np.float64)
        if poses.shape != (n_images, 4, 4):
            raise CameraError(f"RayGenerator: expected c2w of shape ({n_images}, 4, 4), got {poses.shape}")
        if n_images and (cam_idx.min() < 0 or cam_idx.max() >= len(self.cameras)):
            raise CameraError(f"RayGenerator: camera_index outside [0, {len(self.cameras)})")
        self.camera_index = cam_idx
        self.c2w = poses
        self.near = _per_image("near", near, n_images)
        self.far = _per_image("far", far, n_images)
        sizes = np.array([(c.width, c.height) for c in self.cameras], dtype=np.int64).reshape(-1, 2)
        self.widths = sizes[cam_idx, 0] if n_images else np.zeros(0, np.int64)
        self.heights = sizes[cam_idx, 1] if n_images else np.zeros(0, np.int64)
        self.pixel_offset = self._pixel_offsets(pixel_offset, n_images)
        used = sorted(set(cam_idx.tolist()))
        self.mode = self._choose_mode(used, lut_max_bytes)
        # Stored transposed, (14, I): a gather along dim 1 gives contiguous per-ray rows.
        self._table = torch.as_tensor(self._float_table().T.copy(), device=self.device).to(dtype)
        # The parts gathered per ray: the 9 rotation columns for the maths (a (9, N) gather), origins
        # straight into (N, 3) rows, near and far as (N,).
        self._rot_table = self._table[_C0.start : _C2.stop].contiguous()
        self._origin_rows = self._table[_ORIGIN].T.contiguous()
        self._near_t, self._far_t = self._table[_NEAR].contiguous(), self._table[_FAR].contiguous()
        self._lut, lut_offset = self._build_lut(used)
        self._groups, group, group_row = self._param_groups(used)
        self._lut_offset, self._group, self._group_row = (
            torch.as_tensor(a[cam_idx], dtype=torch.int64, device=self.device)
            for a in (lut_offset, group, group_row)
        )
        self._offsets_t = torch.as_tensor(self.pixel_offset, device=self.device)
        self._widths_t = torch.as_tensor(self.widths, device=self.device)
        self._first_pid = self._offsets_t[:-1].contiguous()
        self._index_float = _index_float(self.device)
        self._widths_float = (
            self._widths_t.to(self._index_float) if self._index_float == torch.float64 else self._widths_t
        )
        self._block_shift, self._blocks = self._block_table()
        self._uniform = self._uniform_layout()
        # LUT mode with a single camera: LUT row = y * W + x, no per-image lookups.
        self._single_width = self.cameras[used[0]].width if self.uses_lut and len(used) == 1 else 0
        if self._blocks is not None:
            self._block_next = self._offsets_t.index_select(0, self._blocks + 1)

    def _pixel_offsets(self, pixel_offset: Any, n_images: int) -> np.ndarray:
        counts = self.widths * self.heights
        if pixel_offset is None:
            return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        offsets = np.asarray(pixel_offset, dtype=np.int64).reshape(-1)
        if len(offsets) == n_images:
            offsets = np.concatenate((offsets, [offsets[-1] + counts[-1]] if n_images else [0]))
        if len(offsets) != n_images + 1 or np.any(offsets[1:] - offsets[:-1] < counts):
            raise CameraError("RayGenerator: pixel_offset must give each image at least W * H ids, in order")
        return offsets

    def _choose_mode(self, used: list[int], lut_max_bytes: int) -> str:
        if all(self.cameras[c].is_pinhole for c in used):
            return "pinhole"
        n_bytes = sum(self.cameras[c].width * self.cameras[c].height for c in used) * 3 * self.dtype.itemsize
        return "lut" if n_bytes <= lut_max_bytes else "unproject"

    @property
    def uses_lut(self) -> bool:
        return self.mode == "lut"

    def _param_groups(
        self, used: list[int]
    ) -> tuple[list[tuple[CameraModel, Tensor]], np.ndarray, np.ndarray]:
        """Per-model parameter tables for ``mode == "unproject"``, with each camera's group and row."""
        group = np.zeros(len(self.cameras), dtype=np.int64)
        row = np.zeros(len(self.cameras), dtype=np.int64)
        if self.mode != "unproject":
            return [], group, row
        models = sorted({self.cameras[c].model for c in used})
        groups = []
        for g, name in enumerate(models):
            members = [c for c in used if self.cameras[c].model == name]
            group[members], row[members] = g, np.arange(len(members))
            params = torch.tensor([self.cameras[c].params for c in members], dtype=torch.float64)
            groups.append((CAMERA_MODELS[name], params.to(self.device, _index_float(self.device))))
        return groups, group, row

    def _unproject_rays(self, image: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """(N, 3) camera-frame unit rays of pixel centres, unprojected now with per-ray parameters."""
        compute = _index_float(self.device)
        xy = pixel_centers(torch.stack((x, y), dim=-1).to(compute))
        group, row = self._group.index_select(0, image), self._group_row.index_select(0, image)
        out = torch.empty((image.shape[0], 3), dtype=self.dtype, device=self.device)
        for g, (spec, table) in enumerate(self._groups):
            sel = torch.nonzero(group == g).squeeze(1)
            params = table.index_select(0, row[sel])
            rays, _ = unproject_model(spec, params.unbind(-1), xy[sel])
            out[sel] = rays.to(self.dtype)
        return out

    def _float_table(self) -> np.ndarray:
        rot = self.c2w[:, :3, :3]
        table = np.zeros((self.n_images, _TABLE_COLS))
        table[:, _ORIGIN] = self.c2w[:, :3, 3]
        table[:, _NEAR], table[:, _FAR] = self.near, self.far
        if self.mode != "pinhole":
            table[:, _C0], table[:, _C1], table[:, _C2] = rot[:, :, 0], rot[:, :, 1], rot[:, :, 2]
            return table
        for row, c in enumerate(self.camera_index):
            (fx, fy), (cx, cy) = self.cameras[c].focal, self.cameras[c].principal_point
            r = rot[row]
            # Pixel centre (x + 0.5, y + 0.5): fold the half-pixel shift into c2.
            px, py = PIXEL_CENTER - cx, PIXEL_CENTER - cy
            table[row, _C0], table[row, _C1] = r[:, 0] / fx, r[:, 1] / fy
            table[row, _C2] = r[:, 2] + r[:, 0] * (px / fx) + r[:, 1] * (py / fy)
        return table

    def _block_table(self) -> tuple[int, Tensor | None]:
        counts = self.pixel_offset[1:] - self.pixel_offset[:-1]
        if self.n_images == 0 or counts.min() <= 0:
            return 0, None
        # Blocks of 2**shift ids, no longer than the shortest image: each block meets at most two images.
        shift = int(np.floor(np.log2(counts.min())))
        n_blocks = (int(self.pixel_offset[-1]) >> shift) + 1
        if n_blocks > _MAX_BLOCKS:
            return 0, None
        starts = np.arange(n_blocks, dtype=np.int64) << shift
        first = np.searchsorted(self.pixel_offset, starts, side="right") - 1
        return shift, torch.as_tensor(np.clip(first, 0, self.n_images - 1), device=self.device)

    def _uniform_layout(self) -> tuple[int, int] | None:
        """``(W, W * H)`` when every image has the same size and ids are packed without gaps."""
        if self.n_images == 0 or len(set(self.widths.tolist())) > 1 or len(set(self.heights.tolist())) > 1:
            return None
        w, wh = int(self.widths[0]), int(self.widths[0] * self.heights[0])
        packed = np.array_equal(self.pixel_offset, np.arange(self.n_images + 1, dtype=np.int64) * wh)
        return (w, wh) if packed else None

    def _build_lut(self, used: list[int]) -> tuple[Tensor, np.ndarray]:
        offsets = np.zeros(len(self.cameras), dtype=np.int64)
        if not self.uses_lut:
            return torch.zeros((0, 3), dtype=self.dtype, device=self.device), offsets
        parts, total = [], 0
        for c in used:
            offsets[c] = total
            lut = direction_lut(self.cameras[c], self.dtype, self.device).reshape(-1, 3)
            parts.append(lut)
            total += lut.shape[0]
        return torch.cat(parts, 0), offsets

    @property
    def n_images(self) -> int:
        return len(self.camera_index)

    def _check(self, image: Tensor, pixel: Tensor) -> None:
        if image.numel() == 0:
            return
        if int(image.min()) < 0 or int(image.max()) >= self.n_images:
            raise CameraError(f"RayGenerator: image index outside [0, {self.n_images})")
        w = self._widths_t[image]
        h = torch.as_tensor(self.heights, device=self.device)[image]
        if bool(((pixel < 0).any(-1) | (pixel[:, 0] >= w) | (pixel[:, 1] >= h)).any()):
            raise CameraError("RayGenerator: pixel outside its image")

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
            self._check(image, pixel)
        return self._generate(image, pixel[:, 0], pixel[:, 1])

    def _lut_index(self, image: Tensor, x: Tensor, y: Tensor, local: Tensor | None) -> Tensor:
        """(N,) rows of the concatenated LUT; ``local`` (``y * W + x``) saves recomputing it."""
        if local is None:
            w = self._single_width if self._single_width else self._widths_t.index_select(0, image)
            local = y * w + x
        if self._single_width:
            return local  # one camera: its table starts at row 0
        return self._lut_offset.index_select(0, image) + local

    def _generate(
        self, image: Tensor, x: Tensor, y: Tensor, local: Tensor | None = None, out: Rays | None = None
    ) -> Rays:
        """:meth:`generate` for validated (N,) int64 ``image``, ``x``, ``y`` (and ``y * W + x``).

        ``out``: tensors to write the rays into (pinhole mode only).
        """
        # One gather of the rotation columns: (9, N), each row contiguous for fast element-wise math.
        n = image.shape[0]
        cols = torch.index_select(self._rot_table, 1, image, out=self._scratch("cols", (9, n)))
        if self.mode == "pinhole":
            # (R @ inv(K)) @ (x, y, 1) with the +0.5 pixel-centre shift folded into c2.
            px, py = self._scratch("px", (n,)).copy_(x), self._scratch("py", (n,)).copy_(y)
            world = torch.addcmul(cols[_C2], cols[_C0], px, out=self._scratch("world", (3, n)))
            world.addcmul_(cols[_C1], py)
            # The camera-frame ray is (u, v, 1) / |(u, v, 1)| and |R (u, v, 1)| = |(u, v, 1)|.
            square = torch.mul(world, world, out=self._scratch("square", (3, n)))
            z_scale = square.sum(0) if out is None else torch.sum(square, 0, out=out.z_scale)
            world.mul_(z_scale.rsqrt_())
        else:
            if self.mode == "lut":
                d_cam = self._lut.index_select(0, self._lut_index(image, x, y, local))
            else:
                d_cam = self._unproject_rays(image, x, y)
            z_scale = d_cam[:, 2]
            world = torch.addcmul(cols[_C2] * z_scale, cols[_C0], d_cam[:, 0]).addcmul_(
                cols[_C1], d_cam[:, 1]
            )
        if out is not None and self.mode == "pinhole":
            torch.index_select(self._origin_rows, 0, image, out=out.origins)
            torch.index_select(self._near_t, 0, image, out=out.near)
            torch.index_select(self._far_t, 0, image, out=out.far)
            out.directions.T.copy_(world)
            return out
        origins = self._origin_rows.index_select(0, image)
        near, far = self._near_t.index_select(0, image), self._far_t.index_select(0, image)
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
        fast = self.device.type == "cpu" and self.dtype == torch.float32 and self._uniform is not None
        if not (fast and self.mode == "pinhole"):
            image, pixel, rays = self.generate_from_pids(pid)
            return RayBatch.from_rays(rgba.to(self.device), image, pixel, rays, extra)
        n, c = pid.shape[0], rgba.shape[1]
        floats = torch.empty((9 + c) * n, dtype=torch.float32)
        ints = torch.empty(3 * n, dtype=torch.int64)
        origins, directions = floats[: 3 * n].view(n, 3), floats[3 * n : 6 * n].view(n, 3)
        colour = floats[6 * n : (6 + c) * n].view(n, c)
        near, far, z_scale = floats[(6 + c) * n :].view(3, n).unbind(0)
        image, pixel = ints[:n], ints[n:].view(n, 2)
        _, _, x, y = self._decode_uniform(pid.to(self.device), image, pixel)  # any integer dtype
        self._generate(image, x, y, out=Rays(origins, directions, z_scale, near, far))
        colour.copy_(rgba).div_(255.0)
        alpha = colour[:, 3] if c == 4 else None
        return RayBatch(
            origins, directions, colour[:, :3], alpha, image, pixel, near, far, z_scale, dict(extra or {})
        )

    def decode_pids(self, pid: Tensor) -> tuple[Tensor, Tensor]:
        """(N,) global pixel ids -> ``(image (N,) int64, pixel (N, 2) int64)`` on the device."""
        image, x, y, _ = self._decode(pid.to(self.device).to(torch.int64))
        return image, torch.stack((x, y), dim=-1)

    def _decode(self, pid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(N,) int64 pids -> (N,) int64 ``(image, x, y, local)`` with ``local = y * W + x``.

        Integer division goes through float64: for ``a < 2**53`` the correctly rounded quotient
        ``a / b`` truncates to the exact integer quotient.
        """
        fdt = self._index_float
        if self._uniform is not None:
            w, wh = self._uniform
            image = _floor_div(pid, wh, fdt)
            local = pid - image * wh
            y = _floor_div(local, w, fdt)
            return image, local - y * w, y, local
        if self._blocks is not None:
            block = pid >> self._block_shift
            # The block's first image, plus one where the id lies past that image's end.
            past = pid >= self._block_next.index_select(0, block)
            image = self._blocks.index_select(0, block) + past.to(torch.int64)
        else:
            image = torch.searchsorted(self._offsets_t, pid, right=True) - 1
        local = pid - self._first_pid.index_select(0, image)
        y = _floor_div(local, self._widths_float.index_select(0, image), fdt)
        return image, local - y * self._widths_t.index_select(0, image), y, local

    def generate_from_pids(self, pid: Tensor, check: bool = False) -> tuple[Tensor, Tensor, Rays]:
        """(N,) global pixel ids -> ``(image (N,), pixel (N, 2), rays)``; see :meth:`generate`."""
        pid = pid.to(self.device).to(torch.int64)
        if check and pid.numel() and (int(pid.min()) < 0 or int(pid.max()) >= int(self.pixel_offset[-1])):
            raise CameraError(f"RayGenerator: pixel id outside [0, {int(self.pixel_offset[-1])})")
        if self._uniform is not None and self.mode == "pinhole" and self._index_float == torch.float64:
            image, pixel, xf, yf = self._decode_uniform(pid)
            if check:
                self._check(image, pixel)
            return image, pixel, self._generate(image, xf, yf)
        image, x, y, local = self._decode(pid)
        pixel = torch.stack((x, y), dim=-1)
        if check:
            self._check(image, pixel)
        return image, pixel, self._generate(image, x, y, local)

    def _decode_uniform(
        self, pid: Tensor, image: Tensor | None = None, pixel: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """:meth:`_decode` for the uniform layout in float64, with few temporaries (the loader's path):
        (N,) integer pids (any integer dtype, uint32 included) ->
        ``(image (N,) int64, pixel (N, 2) int64, x (N,) float64, y (N,) float64)``,
        written into ``image`` and ``pixel`` when given; ``x`` and ``y`` are scratch (see ``_scratch``).

        Exact: every value is an integer below 2**53, and a correctly rounded quotient of such
        integers truncates to the integer quotient.
        """
        w, wh = self._uniform  # type: ignore[misc]
        n, f64 = pid.shape[0], torch.float64
        value = self._scratch("value", (n,), f64).copy_(pid)
        image_f = torch.div(value, wh, out=self._scratch("image", (n,), f64)).trunc_()
        value.sub_(image_f, alpha=wh)  # the pixel's index within its image
        y = torch.div(value, w, out=self._scratch("y", (n,), f64)).trunc_()
        x = value.sub_(y, alpha=w)
        if pixel is None:
            pixel = torch.empty((pid.shape[0], 2), dtype=torch.int64, device=pid.device)
        pixel[:, 0].copy_(x)
        pixel[:, 1].copy_(y)
        if image is None:
            return image_f.to(torch.int64), pixel, x, y
        return image.copy_(image_f), pixel, x, y

    def _scratch(self, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> Tensor:
        """A reusable buffer of this thread for a temporary that never leaves the call (CPU only).

        Reusing the hot path's temporaries keeps the allocator from fragmenting under several
        generating threads (a loader's resident memory stays near its live data); on other devices
        a fresh tensor is returned (their caching allocators already reuse memory).
        """
        dtype = self.dtype if dtype is None else dtype
        if self.device.type != "cpu":
            return torch.empty(shape, dtype=dtype, device=self.device)
        buffers: dict[tuple[str, torch.dtype], Tensor] = _THREAD.__dict__.setdefault("scratch", {})
        numel = math.prod(shape)
        buffer = buffers.get((name, dtype))
        if buffer is None or buffer.numel() < numel:
            buffer = buffers[name, dtype] = torch.empty(numel, dtype=dtype)
        return buffer[:numel].view(shape)

    def reference_generate(self, image: Tensor, pixel: Tensor) -> Rays:
        """Simple twin of :meth:`generate`: :func:`reference_rays` on this generator's inputs."""
        return reference_rays(
            self.cameras, self.camera_index, self.c2w, self.near, self.far, image, pixel,
            device=self.device, dtype=self.dtype,
        )  # fmt: skip

    @property
    def pid_decoding(self) -> str:
        """How :meth:`decode_pids` finds a pid's image: ``"uniform"`` (images of one size packed
        without gaps: a division), ``"blocks"`` (a block table, at most two images per block) or
        ``"search"`` (a binary search over the images' first ids)."""
        if self._uniform is not None:
            return "uniform"
        return "search" if self._blocks is None else "blocks"


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
    """The simple twin of :meth:`RayGenerator.generate` (same arguments as the generator, then the
    rays): a loop over the images calling ``pixels_to_rays``; shares nothing with the fast path.

    Args:
        image: (N,) int image indices; pixel: (N, 2) int pixels ``(x, y)``.
    """
    device = torch.device(device)
    cam_idx = np.asarray(camera_index, dtype=np.int64).reshape(-1)
    poses = np.asarray(c2w.cpu() if isinstance(c2w, Tensor) else c2w, dtype=np.float64)
    near, far = _per_image("near", near, len(cam_idx)), _per_image("far", far, len(cam_idx))
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


def _floor_div(a: Tensor, b: Tensor | int, fdt: torch.dtype) -> Tensor:
    """``a // b`` for non-negative int64 ``a``, via float64 where available (faster on CPU)."""
    if fdt == torch.float64:
        return (a.to(fdt) / b).to(torch.int64)
    return torch.div(a, b, rounding_mode="floor")


def _index_float(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


def _shapes(n: int) -> dict[str, tuple[int, ...]]:
    return {"origins": (n, 3), "directions": (n, 3), "z_scale": (n,), "near": (n,), "far": (n,)}
