"""Rays from a store's camera table: compact rays -> ``RayBatch`` on the target device, the loaders'
ray-generation stage (the store holds colours and pixel ids; making rays is done here).

``ray_generator(store, device)`` is a store's ``RayGenerator`` (memoised per store and device),
``image_rays(store, name)`` the rays of one image. ``DeviceBatcher`` is the fast path: only the compact
layout crosses to the device (``rgba`` uint8 and ``pid`` uint32: 7-8 bytes per ray); pixel ids are
decoded and rays generated there, vectorised; a store with time gives each ray its view's time
(``RayBatch.times``, looked up by image on the device). On CUDA the host arrays are staged in page-locked
(pinned) memory and copied with ``non_blocking=True``. Its simple twin is ``reference_batch``, which
tests compare against.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from raykit.rays import RayBatch, RayGenerator, table_ray_generator
from raykit.store import RawRays, RayStore

__all__ = ["DeviceBatcher", "image_rays", "ray_generator", "reference_batch"]


_GENERATORS: weakref.WeakKeyDictionary[RayStore, dict[str, RayGenerator]] = weakref.WeakKeyDictionary()


def ray_generator(store: RayStore, device: torch.device | str = "cpu") -> RayGenerator:
    """A ``raykit.rays.RayGenerator`` for ``store``'s images on ``device`` (memoised per store)."""
    generators = _GENERATORS.setdefault(store, {})
    key = str(torch.device(device))
    if key not in generators:
        generators[key] = table_ray_generator(store.table, device, near=store.scene.near, far=store.scene.far)
    return generators[key]


def reference_batch(store: RayStore, raw: RawRays, device: torch.device | str = "cpu") -> RayBatch:
    """Twin of :class:`DeviceBatcher`: a ``RayBatch`` on ``device`` from compact rays of ``store``."""
    generator = ray_generator(store, device)
    pid = torch.from_numpy(raw.pid.astype(np.int64))
    image, pixel, rays = generator.generate_from_pids(pid)
    colour = torch.from_numpy(np.ascontiguousarray(raw.rgba)).to(generator.device)
    extra = {k: torch.from_numpy(np.ascontiguousarray(v)).to(generator.device) for k, v in raw.extra.items()}
    batch = RayBatch.from_rays(colour, image, pixel, rays, extra)
    if store.table.time is not None:
        batch.times = torch.from_numpy(store.table.time[image.cpu().numpy()].astype(np.float32)).to(
            image.device
        )
    return batch


def image_rays(store: RayStore, name: str, device: torch.device | str = "cpu") -> RayBatch:
    """``RayBatch`` of every pixel of image ``name`` of ``store`` in row-major order, on ``device``."""
    return reference_batch(store, store.image_raw(name), device)


class DeviceBatcher:
    """``batcher(raw) -> RayBatch`` on ``device`` for the images of ``store``.

    Args:
        store: a :class:`raykit.store.RayStore` (its ray generator is built once per device).
    """

    def __init__(self, store: RayStore, device: Any = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = ray_generator(store, self.device)
        self.pinned = self.device.type == "cuda"
        time = store.table.time  # (I,) per image; None for a static store: nothing done per batch
        self.times = None if time is None else torch.from_numpy(time.astype(np.float32)).to(self.device)

    def warm_up(self) -> None:
        """Run the generation path once on one ray (first calls of torch ops cost milliseconds)."""
        first = int(self.generator.pixel_offset[0])
        self(RawRays(np.zeros((1, 4), np.uint8), np.array([first], np.uint32)))

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        host = torch.from_numpy(np.ascontiguousarray(array))
        if self.pinned:
            return host.pin_memory().to(self.device, non_blocking=True)
        return host

    def __call__(self, raw: RawRays) -> RayBatch:
        """(N,) compact rays -> a ``RayBatch`` of N rays on the device."""
        if self.pinned:  # 4 bytes per id over the bus, widened on the device
            pid = self._to_device(raw.pid.view(np.int32)).to(torch.int64) & 0xFFFFFFFF
        else:
            pid = torch.from_numpy(np.ascontiguousarray(raw.pid))  # uint32, widened by the generator
        extra = {k: self._to_device(v) for k, v in raw.extra.items()}
        batch = self.generator.batch_from_pids(pid, self._to_device(raw.rgba), extra)
        if self.times is not None:
            batch.times = self.times.index_select(0, batch.image)  # half the time of [] indexing
        return batch
