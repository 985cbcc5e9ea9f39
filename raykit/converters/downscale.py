"""Downscale rules of ``raykit convert --downscale N``: ``exact`` and ``mipnerf360``.

- ``exact`` (the default): N must divide every image's width and height (no cropping); every output pixel
  is the mean of an N x N block, rounded half up in integer arithmetic, and intrinsics are divided by N
  (:meth:`raykit.cameras.Camera.scaled`). RGBA is averaged with premultiplied alpha (colours weighted by
  alpha, so transparent pixels do not bleed their colour into edges); a block with zero total alpha takes
  its plain colour mean.
- ``mipnerf360``: the Mip-NeRF 360 protocol as nerfbaselines prepares it. Images are downscaled from full
  resolution (never from a capture's pre-scaled ``images_N`` folder) to ``w = round_half_up(W / N)``,
  ``h = round_half_up(H / N)`` with an area (box) filter (Pillow's ``BOX``); focal lengths become
  ``f / N`` and the principal point ``cx' = (cx - W / 2) / N + w / 2``, ``cy' = (cy - H / 2) / N + h / 2``
  (nerfbaselines' ``_downscale_cameras_v2``); distortion parameters are unchanged. The split is unchanged
  too (``every:8`` on sorted names).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from raykit.cameras import Camera
from raykit.errors import CameraError, ConfigError, SourceError
from raykit.imagedecode import downscale_area as area_filter

__all__ = ["DOWNSCALE_RULES", "downscale_area", "mipnerf360_camera", "resize_area", "round_half_up_div"]

DOWNSCALE_RULES = ("exact", "mipnerf360")


def round_half_up_div(size: int, factor: int) -> int:
    """``size / factor`` rounded half up, in integers (nerfbaselines' ``_div_round_half_up``)."""
    q, r = divmod(size, factor)
    return q + 1 if 2 * r >= factor else q


def mipnerf360_camera(camera: Camera, factor: int) -> Camera:
    """``camera`` for its image downscaled by ``factor`` under the ``mipnerf360`` rule (module docstring)."""
    if not isinstance(factor, int) or factor < 1:
        raise ConfigError(f"downscale: expected a positive integer, got {factor!r}")
    width, height = round_half_up_div(camera.width, factor), round_half_up_div(camera.height, factor)
    if width < 1 or height < 1:
        raise CameraError(f"{camera.label or camera.camera_id}: downscale {factor} leaves no pixel")
    spec, params = camera.spec, list(camera.params)
    for i in spec.focal_idx:
        params[i] = params[i] / factor
    cx, cy = spec.pp_idx
    params[cx] = (params[cx] - camera.width / 2) / factor + width / 2
    params[cy] = (params[cy] - camera.height / 2) / factor + height / 2
    return Camera(camera.model, width, height, tuple(params), camera.camera_id, camera.label)


def resize_area(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """``uint8 (H, W, C)`` -> ``uint8 (height, width, C)`` by area averaging (Pillow's ``BOX`` filter)."""
    channels = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(image[..., c])).resize((width, height), Image.Resampling.BOX)
        )
        for c in range(image.shape[2])
    ]
    return np.stack(channels, axis=-1)


def _check_factor(height: int, width: int, factor: int, where: str) -> None:
    if not isinstance(factor, int | np.integer) or factor < 1:
        raise SourceError(f"{where}: downscale factor must be a positive integer, got {factor!r}")
    if height % factor or width % factor:
        raise SourceError(
            f"{where}: image size {width}x{height} is not divisible by the downscale factor {factor}"
        )


def downscale_area(image: np.ndarray, factor: int, *, where: str = "image") -> np.ndarray:
    """Exact box-filter downscale (:func:`raykit.imagedecode.downscale_area`, the one rule shared with
    the loaders' resolution levels) of an image whose size ``factor`` divides, checked: one
    ``SourceError`` naming ``where`` otherwise."""
    height, width, _ = image.shape
    _check_factor(height, width, factor, where)
    return area_filter(image, factor)
