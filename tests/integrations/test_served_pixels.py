"""``ServedPixels`` (the image datamanager's cache transform) is bit-identical to the colour functions
that equal nerfstudio's ``InputDataset`` (tested against it in test_datamanagers), for every case."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _nerfstudio() -> None:
    """raykit's nerfstudio colour functions for every test here, each test skipping on its own when
    nerfstudio is missing."""
    global ServedPixels, float_colours, uint8_colours
    pytest.importorskip("nerfstudio")
    from raykit.integrations.nerfstudio.common import ServedPixels, float_colours, uint8_colours


def _image(channels: int) -> np.ndarray:
    image = np.random.default_rng(channels).integers(0, 256, (70, 45, channels), dtype=np.uint8)
    if channels == 4:
        image[:10, :, 3], image[10:20, :, 3] = 255, 0  # opaque and transparent rows besides the noise
    return image


@pytest.mark.parametrize("colour", [(1.0, 1.0, 1.0), (0.2, 0.7, 0.1), None])
@pytest.mark.parametrize("image_type", ["uint8", "float32"])
@pytest.mark.parametrize(("channels", "with_mask"), [(3, False), (4, False), (4, True)])  # masks: alpha
def test_served_pixels_equal_the_colour_functions(
    colour: tuple[float, ...] | None, image_type: str, channels: int, with_mask: bool
) -> None:
    image = _image(channels)
    rgba = torch.from_numpy(image)
    alpha_color = None if colour is None else torch.tensor(colour)
    expected = (uint8_colours if image_type == "uint8" else float_colours)(rgba, alpha_color)
    if with_mask:
        expected = torch.cat([expected, (rgba[..., 3:] > 0).to(expected.dtype)], dim=-1)
    served = pickle.loads(pickle.dumps(ServedPixels(colour, image_type, with_mask)))(image)
    assert served.dtype == expected.numpy().dtype and served.shape == tuple(expected.shape)
    np.testing.assert_array_equal(served, expected.numpy())
