"""nerfstudio's ``InputDataset`` with its pixels read from the raykit store (no image files)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from nerfstudio.data.datasets.base_dataset import InputDataset
from PIL import Image

from raykit.integrations.nerfstudio.components import nerfstudio_components
from raykit.integrations.nerfstudio.store_files import open_location
from raykit.store import RayStore

__all__ = ["RaykitDataset"]


class RaykitDataset(InputDataset):
    """``InputDataset`` for ``raykit-data`` outputs: ``get_numpy_image`` reads the store's pixels.

    Everything else (alpha compositing, ``scale_factor`` resizing, keys of ``get_data``) is
    nerfstudio's, so items equal those of its own dataset on the same pixels. With the parser's
    ``alpha_as_mask``, ``get_data`` adds ``mask`` (H, W, 1) bool: alpha > 0. The store's components the
    parser serves (``components``) are added as nerfstudio's datasets give them: ``mask`` (H, W, 1) bool
    (mask > 0, and alpha > 0 with ``alpha_as_mask``) and ``depth_image`` (H, W, 1) float32 in
    nerfstudio's units (store units times ``dataparser_scale``), resized by the nearest sample with
    ``scale_factor`` as nerfstudio resizes them.
    """

    def __init__(self, dataparser_outputs: Any, scale_factor: float = 1.0) -> None:
        super().__init__(dataparser_outputs, scale_factor)
        self.location: str = dataparser_outputs.metadata["raykit_store"]
        self.names: list[str] = list(dataparser_outputs.metadata["raykit_names"])

    @property
    def store(self) -> RayStore:
        return open_location(self.location)

    def get_numpy_image(self, image_idx: int) -> np.ndarray:
        """(H, W, 3|4) uint8 pixels of image ``image_idx`` of this split."""
        image = self.store.read_image(self.names[image_idx])
        if self.scale_factor != 1.0:  # as nerfstudio's InputDataset resizes
            pil = Image.fromarray(image)
            size = (int(pil.width * self.scale_factor), int(pil.height * self.scale_factor))
            image = np.asarray(pil.resize(size, resample=Image.Resampling.BILINEAR), dtype=np.uint8)
        if image.shape[2] == 1:
            image = np.repeat(image, 3, axis=2)
        return image

    def get_data(self, image_idx: int, image_type: Any = "float32") -> dict[str, Any]:
        data = super().get_data(image_idx, image_type)
        alpha_mask = None
        if self.metadata.get("raykit_alpha_as_mask"):
            alpha = self.get_numpy_image(image_idx)[:, :, 3:]
            alpha_mask = data["mask"] = torch.from_numpy(alpha > 0)
        components = list(self.metadata.get("raykit_components", ()))
        if components:
            store, name = self.store, self.names[image_idx]
            held = {
                c: self._resized(store.read_component(c, name), data["image"].shape[:2]) for c in components
            }
            data.update(
                nerfstudio_components(
                    held.get("mask"),
                    held.get("depth"),
                    float(self._dataparser_outputs.dataparser_scale),
                    alpha_mask,
                )
            )
        return data

    def _resized(self, array: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
        """A component at the served image's ``size`` (H, W): nerfstudio's nearest resize when
        ``scale_factor`` resized the image."""
        if tuple(array.shape[:2]) != tuple(size):
            pil = Image.fromarray(array)
            array = np.asarray(pil.resize((size[1], size[0]), resample=Image.Resampling.NEAREST))
        return torch.from_numpy(np.ascontiguousarray(array))
