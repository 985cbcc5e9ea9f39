"""Compact rays -> ``RayBatch`` on the target device: the loader's ray-generation stage.

Only the compact layout crosses to the device (``rgba`` uint8 and ``pid`` uint32: 7-8 bytes per ray);
pixel ids are decoded and rays generated there, vectorised. On CUDA the host arrays are staged in
page-locked (pinned) memory and copied with ``non_blocking=True``. The simple twin is
:meth:`raykit.store.RayStore.to_batch`, which tests compare against.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raykit.rays import RayBatch
from raykit.store import RawRays, RayStore

__all__ = ["DeviceBatcher"]


class DeviceBatcher:
    """``batcher(raw) -> RayBatch`` on ``device`` for the images of ``store``.

    Args:
        store: a :class:`raykit.store.RayStore` (its ray generator is built once per device).
    """

    def __init__(self, store: RayStore, device: Any = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = store.ray_generator(self.device)
        self.pinned = self.device.type == "cuda"

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
        return self.generator.batch_from_pids(pid, self._to_device(raw.rgba), extra)
