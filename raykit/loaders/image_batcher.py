"""The image loader's batcher stage: a batch's uint8 images -> an :class:`ImageBatch` on the device.

:class:`ImageBatcher` cuts the crops, finds each image's camera, gathers poses and components, and
hands the pixels to :class:`DeviceTransfer`, which converts them to float into recycled CPU buffers
(:class:`~raykit.loaders.image_buffers.BufferPool`) or stages them for the device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from raykit.cameras import Camera
from raykit.image_geometry import crop_camera
from raykit.loaders.components import ImageComponents
from raykit.loaders.image_buffers import BufferPool
from raykit.loaders.image_plan import ImagePlan
from raykit.loaders.image_source import ImageSource
from raykit.rays import unit_colours

__all__ = ["DeviceTransfer", "ImageBatch", "ImageBatcher"]

_ROWS = 64  # image rows converted to float per task


@dataclass
class ImageBatch:
    """``B`` images with their cameras (``H``, ``W``: the image or crop size).

    Attributes:
        images: (B, H, W, 3) float32 in [0, 1] on the loader's device; with the loader's ``transform``,
            (B, H, W, C') of the transform's dtype, as it returned them (on the CPU with B = 1, a
            view of the cache: do not write into it).
        alpha: (B, H, W) float32 in [0, 1], or None when the store has no alpha channel or with a
            ``transform``.
        cameras: the B cameras of these pixels (cropped; the pinhole ones with ``undistort``).
        K: (B, 3, 3) float32 intrinsics (COLMAP image coordinates), or None unless every camera is a
            pinhole.
        c2w: (B, 4, 4) float32 camera-to-world, OpenCV axes, store world frame.
        image: (B,) int64 rows of the store's camera table.
        names: the B image names.
        crop_origin: (B, 2) int64 ``(x0, y0)`` of each crop in its image (zeros without cropping).
        mask: (B, H, W) uint8 on the loader's device (0 = pixel not used, 1..255 used), or None when
            not served (``components``; :mod:`raykit.loaders.components`): the store's mask at the
            loader's level, undistorted and cropped as the pixels, by the nearest sample.
        depth: (B, H, W) float32 on the loader's device (metres when the store knows the scale,
            0 = unknown), or None when not served; transformed as ``mask``. Both, on the CPU with
            B = 1, views of the loader's cache: do not write into them.
        prob: (B,) float32 on the loader's device: the probability each view was drawn with (one
            draw) under ``sampling="loss"``; None with uniform views.
        times: (B,) float32 on the loader's device: each view's time, or None when the store has
            no time (``raykit.store.FrameTime``).
    """

    images: torch.Tensor
    alpha: torch.Tensor | None
    cameras: tuple[Camera, ...]
    K: torch.Tensor | None
    c2w: torch.Tensor
    image: torch.Tensor
    names: tuple[str, ...]
    crop_origin: torch.Tensor
    mask: torch.Tensor | None = None
    depth: torch.Tensor | None = None
    prob: torch.Tensor | None = None
    times: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.names)


class DeviceTransfer:
    """Host arrays -> tensors on ``device``; float batches off the GPU are converted on ``threads``
    threads into buffers of a :class:`BufferPool`."""

    def __init__(self, device: torch.device, threads: int) -> None:
        self.device, self.threads = device, threads
        self.cuda = device.type == "cuda"
        self.buffers = BufferPool()
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Stop the conversion threads (started again when needed) and unmap the free buffers."""
        pool, self._pool = self._pool, None
        if pool is not None:  # (a last reference dropped on one of its own threads cannot wait for it)
            own = threading.current_thread() in getattr(pool, "_threads", ())
            pool.shutdown(wait=not own, cancel_futures=True)
        self.buffers.clear()

    def floats(self, pixels: list[np.ndarray]) -> torch.Tensor:
        """(B, H, W, C) float32 in [0, 1] on the device from B uint8 images.

        CUDA: stacked as uint8 in pinned memory, copied without blocking, converted on the GPU (a
        quarter of the bytes of a float copy). CPU and other devices: converted straight from the
        cached arrays into the float batch, rows split over the threads (numpy releases the GIL; on
        CPU this conversion is most of a cached batch's cost).
        """
        shape = (len(pixels), *pixels[0].shape)
        if self.cuda:
            host = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
            for i, image in enumerate(pixels):
                host[i].copy_(torch.from_numpy(image))
            return unit_colours(host.to(self.device, non_blocking=True))
        cpu = self.device.type == "cpu"
        out = self.buffers.empty(shape, torch.float32) if cpu else torch.empty(shape, dtype=torch.float32)
        view = out.numpy()
        divisor = np.float32(255.0)  # a true division: the bits of raykit.rays.unit_colours
        pieces = [(i, slice(r, r + _ROWS)) for i in range(shape[0]) for r in range(0, shape[1], _ROWS)]

        def convert(piece: tuple[int, slice]) -> None:
            i, rows = piece
            np.divide(pixels[i][rows], divisor, out=view[i, rows], dtype=np.float32)

        if self.threads > 1 and len(pieces) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, "raykit-images-convert")
            list(self._pool.map(convert, pieces))
        else:
            for piece in pieces:
                convert(piece)
        return out if cpu else out.to(self.device)

    def as_is(self, arrays: list[np.ndarray]) -> torch.Tensor:
        """(B, ...) of B arrays as they are: a view of the one array for B = 1 on the CPU, else
        stacked (in pinned memory under CUDA) and copied to the device."""
        host = (
            torch.from_numpy(arrays[0]).unsqueeze(0)
            if len(arrays) == 1
            else torch.from_numpy(np.stack(arrays))
        )
        if self.device.type == "cpu":
            return host
        if self.cuda:
            host = host.pin_memory()
        return host.to(self.device, non_blocking=self.cuda)

    def component(self, arrays: list[np.ndarray]) -> torch.Tensor:
        """(B, H, W) of B component arrays on the device: uint8 masks, float32 depth (on the CPU with
        B = 1, a view of the cache, as the images with a ``transform``: do not write into it)."""
        if arrays[0].dtype == np.float16:
            arrays = [array.astype(np.float32) for array in arrays]
        return self.as_is(arrays)

    def small(self, tensor: torch.Tensor) -> torch.Tensor:
        """A small tensor (poses, intrinsics) on the device."""
        return tensor if self.device.type == "cpu" else tensor.to(self.device, non_blocking=self.cuda)


class ImageBatcher:
    """Batches of ``source``'s images: crops (``crop``, origins from ``plan``), cameras, poses and
    components (``components_of(epoch, position)``), made on the device by ``transfer``; a
    ``transform``ed source's pixels are served as they are."""

    def __init__(
        self,
        source: ImageSource,
        plan: ImagePlan,
        crop: tuple[int, int] | None,
        transfer: DeviceTransfer,
        components_of: Callable[[int, int], ImageComponents] | None,
    ) -> None:
        self.plan, self.transfer, self.components_of = plan, transfer, components_of
        table = source.store.table
        self._c2w = torch.from_numpy(table.c2w[source.rows].astype(np.float32))
        self._rows = torch.from_numpy(source.rows.astype(np.int64))
        self._times = (
            None if table.time is None else torch.from_numpy(table.time[source.rows].astype(np.float32))
        )
        self.set_source(source, crop)

    def set_source(self, source: ImageSource, crop: tuple[int, int] | None) -> None:
        """Batch ``source``'s images (another level of the same split) with ``crop`` from now on."""
        self.source, self.crop = source, crop
        self._cameras: dict[int, tuple[Camera, np.ndarray | None]] = {}
        self.transfer.buffers.clear()  # the old level's sizes

    def camera_and_K(self, position: int) -> tuple[Camera, np.ndarray | None]:
        """The served camera of image ``position`` and its (3, 3) float32 K (None unless pinhole),
        computed once per image."""
        known = self._cameras.get(position)
        if known is None:
            camera = self.source.camera(position)
            known = camera, camera.K().astype(np.float32) if camera.is_pinhole else None
            self._cameras[position] = known
        return known

    def __call__(self, epoch: int, positions: np.ndarray, images: Sequence[np.ndarray]) -> ImageBatch:
        """One batch from its uint8 images: crops, cameras, then one (pinned) copy to the device."""
        cameras, Ks, origins, pixels = [], [], [], []
        parts: dict[str, list[np.ndarray]] = {}
        for position, image in zip(positions, images, strict=True):
            camera, K = self.camera_and_K(int(position))
            x0 = y0 = 0
            held: Mapping[str, np.ndarray] = {}
            if self.components_of is not None:
                held = self.components_of(epoch, int(position)).arrays
            if self.crop is not None:
                h, w = self.crop
                x0, y0 = self.plan.crop_origin(epoch, int(position), image.shape[:2], self.crop)
                image = image[y0 : y0 + h, x0 : x0 + w]
                held = {name: array[y0 : y0 + h, x0 : x0 + w] for name, array in held.items()}
                camera = crop_camera(camera, x0, y0, w, h)
                K = camera.K().astype(np.float32) if camera.is_pinhole else None
            cameras.append(camera)
            Ks.append(K)
            origins.append((x0, y0))
            pixels.append(image)
            for name, array in held.items():
                parts.setdefault(name, []).append(array)
        served = {name: self.transfer.component(arrays) for name, arrays in parts.items()}
        transformed = self.source.transform is not None
        data = self.transfer.as_is(pixels) if transformed else self.transfer.floats(pixels)
        if len(positions) == 1:  # one image: copies of slices, no gathers
            p = int(positions[0])
            c2w, table_rows = self._c2w[p : p + 1].clone(), self._rows[p : p + 1].clone()
            times = None if self._times is None else self._times[p : p + 1].clone()
            K_all = None if Ks[0] is None else torch.from_numpy(Ks[0]).unsqueeze(0).clone()
        else:
            index = torch.from_numpy(positions)
            c2w, table_rows = self._c2w[index], self._rows[index]
            times = None if self._times is None else self._times[index]
            K_all = (
                None if any(K is None for K in Ks) else torch.from_numpy(np.stack(cast(list[np.ndarray], Ks)))
            )
        return ImageBatch(
            images=data if transformed else data[..., :3],
            alpha=data[..., 3] if data.shape[-1] == 4 and not transformed else None,
            cameras=tuple(cameras),
            K=None if K_all is None else self.transfer.small(K_all),
            c2w=self.transfer.small(c2w),
            image=table_rows,
            names=tuple(self.source.names[int(p)] for p in positions),
            crop_origin=torch.from_numpy(np.asarray(origins, dtype=np.int64).reshape(-1, 2)),
            mask=served.get("mask"),
            depth=served.get("depth"),
            times=None if times is None else self.transfer.small(times),
        )
