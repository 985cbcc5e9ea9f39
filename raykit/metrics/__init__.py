"""Image quality under the community evaluation protocol (nerfbaselines): pure, batched, any device.

- :mod:`~raykit.metrics.protocol`: the protocols (``default``, ``nerf``) and what is scored: 8-bit sRGB
  after compositing on the background (:func:`to_protocol_image`).
- :mod:`~raykit.metrics.image_metrics`: :func:`psnr` and :func:`ssim` of ``(B, H, W, C)`` images, equal
  to nerfbaselines' ``metrics.py``; twins :func:`reference_psnr`, :func:`reference_ssim`.
- :mod:`~raykit.metrics.lpips`: :class:`LPIPS` (AlexNet, VGG) built here in torchvision's layout, weights
  from files only (:func:`lpips_weight_paths`, :func:`load_lpips`); twin :func:`reference_lpips`.
"""

from __future__ import annotations

from raykit.metrics.image_metrics import (
    masked_psnr,
    psnr,
    reference_masked_psnr,
    reference_psnr,
    reference_ssim,
    ssim,
)
from raykit.metrics.lpips import (
    LPIPS,
    LPIPS_NETS,
    MIN_SIDE,
    LpipsWeights,
    LpipsWeightsError,
    load_lpips,
    lpips_weight_paths,
    reference_lpips,
)
from raykit.metrics.protocol import (
    MASKED_SCORING,
    PROTOCOLS,
    Protocol,
    background_tensor,
    composite,
    masked_pair,
    parse_background,
    parse_colour,
    protocol_named,
    quantize,
    to_protocol_image,
)

__all__ = [
    "LPIPS",
    "LPIPS_NETS",
    "MASKED_SCORING",
    "MIN_SIDE",
    "PROTOCOLS",
    "LpipsWeights",
    "LpipsWeightsError",
    "Protocol",
    "background_tensor",
    "composite",
    "load_lpips",
    "lpips_weight_paths",
    "masked_pair",
    "masked_psnr",
    "parse_background",
    "parse_colour",
    "protocol_named",
    "psnr",
    "quantize",
    "reference_lpips",
    "reference_masked_psnr",
    "reference_psnr",
    "reference_ssim",
    "ssim",
    "to_protocol_image",
]
