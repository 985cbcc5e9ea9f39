"""Ray batches: :class:`RayBatch` (a batch of rays with their pixels' colours, its split and device
helpers), :class:`Rays` (what :class:`raykit.rays.RayGenerator` generates) and ``unit_colours``, the
one conversion of stored 8-bit colours to [0, 1]. Generating rays is ``raykit.rays``' (which
re-exports these).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from dataclasses import field as dataclass_field
from typing import Any, NamedTuple

import torch

__all__ = ["RayBatch", "Rays", "unit_colours"]

Tensor = torch.Tensor


class Rays(NamedTuple):
    """Output of :meth:`RayGenerator.generate`; unpacks as a 5-tuple."""

    origins: Tensor
    directions: Tensor
    z_scale: Tensor
    near: Tensor
    far: Tensor


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
        times: (N,) float32 time of each ray's view, or None when the store has no time (a static
            capture; ``raykit.store.FrameTime``).
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
    times: Tensor | None = None

    @classmethod
    def from_rays(
        cls, rgba: Tensor, image: Tensor, pixel: Tensor, rays: Rays, extra: Mapping[str, Tensor] | None = None
    ) -> RayBatch:
        """Assemble a batch from generated ``rays``, (N, 3|4) uint8 colours and the stored ``extra``
        fields, all on the same device."""
        scaled = unit_colours(rgba)
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

# k / 255 for k = 0..255, correctly rounded float32 division, made on the CPU: what the CPU's
# ``div_(255.0)`` gives. On CUDA, division by a Python scalar multiplies by its reciprocal, which
# differs in the last bit for 126 of the 256 values, so other devices look the values up here.
_UNIT = torch.arange(256, dtype=torch.float32).div_(255.0)


def unit_colours(colours: Tensor) -> Tensor:
    """(...) uint8 -> (...) float32 ``colours / 255`` on their device, the same bits on every device.

    The one conversion of stored 8-bit colours to [0, 1]: on the CPU a true division in place of a
    copy, elsewhere a lookup in the CPU's 256 quotients (CUDA's scalar division is not exact).
    """
    if colours.device.type == "cpu":
        return colours.to(torch.float32).div_(255.0)
    return _unit_on(colours.device)[colours.to(torch.int32)]


@functools.lru_cache(maxsize=8)
def _unit_on(device: torch.device) -> Tensor:
    """(256,) float32 ``_UNIT`` on ``device`` (copied there once)."""
    return _UNIT.to(device)
