"""nerfstudio's ``InputDataset`` with its pixels read from the raykit store (no image files)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from nerfstudio.data.datasets.base_dataset import InputDataset
from PIL import Image

from raykit.integrations.nerfstudio.store_files import open_location
from raykit.store import RayStore

__all__ = ["RaykitDataset"]


class RaykitDataset(InputDataset):
    """``InputDataset`` for ``raykit-data`` outputs: ``get_numpy_image`` reads the store's pixels.

    Everything else (alpha compositing, ``scale_factor`` resizing, keys of ``get_data``) is
    nerfstudio's, so items equal those of its own dataset on the same pixels. With the parser's
    ``alpha_as_mask``, ``get_data`` adds ``mask`` (H, W, 1) bool: alpha > 0.
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
        if self.metadata.get("raykit_alpha_as_mask"):
            alpha = self.get_numpy_image(image_idx)[:, :, 3:]
            data["mask"] = torch.from_numpy(alpha > 0)
        return data
