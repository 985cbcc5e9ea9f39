"""Image quality under the community evaluation protocol (nerfbaselines): pure, batched, any device.

- :mod:`~raykit.metrics.protocol`: the protocols (``default``, ``nerf``) and what is scored: 8-bit sRGB
  after compositing on the background (:func:`to_protocol_image`).
- :mod:`~raykit.metrics.image_metrics`: :func:`psnr` and :func:`ssim` of ``(B, H, W, C)`` images, equal
  to nerfbaselines' ``metrics.py``; twins :func:`reference_psnr`, :func:`reference_ssim`.
- :mod:`~raykit.metrics.lpips`: :class:`LPIPS` (AlexNet, VGG) built here in torchvision's layout, the
  trunk's weights fetched once into torch hub's cache and checked by hash unless offline
  (:func:`lpips_weight_paths`, :func:`load_lpips`); twin :func:`reference_lpips`.
- :mod:`~raykit.metrics.scores`: :class:`Scorer`, the one per-image scorer (``raykit evaluate``, the
  trainer's ``eval.json``, quick checks, exports); :func:`protocol_of` an ``eval.json``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raykit.lazy import lazy_attribute

if TYPE_CHECKING:
    from raykit.metrics.image_metrics import (
        masked_psnr,
        mse_to_psnr,
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
        OFFLINE_ENV,
        TRUNK_URLS,
        LpipsWeights,
        LpipsWeightsError,
        load_lpips,
        lpips_weight_paths,
        reference_lpips,
    )
    from raykit.metrics.protocol import (
        MASKED_SCORING,
        OLD_PROTOCOL,
        PROTOCOLS,
        Protocol,
        background_tensor,
        composite,
        masked_pair,
        parse_background,
        parse_colour,
        protocol_named,
        protocol_of,
        quantize,
        to_protocol_image,
    )
    from raykit.metrics.scores import LPIPS_KEYS, METRIC_KEYS, Scorer

# module -> the public names it defines, imported on first use (PEP 562): what only reads a protocol's
# name or an ``eval.json`` does not wait for torch.
_PUBLIC = {
    "image_metrics": (
        "masked_psnr",
        "mse_to_psnr",
        "psnr",
        "reference_masked_psnr",
        "reference_psnr",
        "reference_ssim",
        "ssim",
    ),
    "lpips": (
        "LPIPS",
        "LPIPS_NETS",
        "MIN_SIDE",
        "OFFLINE_ENV",
        "TRUNK_URLS",
        "LpipsWeights",
        "LpipsWeightsError",
        "load_lpips",
        "lpips_weight_paths",
        "reference_lpips",
    ),
    "protocol": (
        "MASKED_SCORING",
        "OLD_PROTOCOL",
        "PROTOCOLS",
        "Protocol",
        "background_tensor",
        "composite",
        "masked_pair",
        "parse_background",
        "parse_colour",
        "protocol_named",
        "protocol_of",
        "quantize",
        "to_protocol_image",
    ),
    "scores": (
        "LPIPS_KEYS",
        "METRIC_KEYS",
        "Scorer",
    ),
}
_MODULES = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = [
    "LPIPS",
    "LPIPS_KEYS",
    "LPIPS_NETS",
    "MASKED_SCORING",
    "METRIC_KEYS",
    "MIN_SIDE",
    "OFFLINE_ENV",
    "OLD_PROTOCOL",
    "PROTOCOLS",
    "TRUNK_URLS",
    "LpipsWeights",
    "LpipsWeightsError",
    "Protocol",
    "Scorer",
    "background_tensor",
    "composite",
    "load_lpips",
    "lpips_weight_paths",
    "masked_pair",
    "masked_psnr",
    "mse_to_psnr",
    "parse_background",
    "parse_colour",
    "protocol_named",
    "protocol_of",
    "psnr",
    "quantize",
    "reference_lpips",
    "reference_masked_psnr",
    "reference_psnr",
    "reference_ssim",
    "ssim",
    "to_protocol_image",
]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _MODULES, globals(), name)
