"""The community evaluation protocol (nerfbaselines, NeurIPS 2025): what is scored, before any metric.

Both images become 8-bit sRGB before they are compared, exactly as ``nerfbaselines.utils.image_to_srgb``
makes them: RGBA is composited on the dataset's background in float32 (``rgb * a + (1 - a) * bg``,
``uint8 / 255`` first), and a float image is quantised as ``uint8(clip(x * 255, 0, 255))`` in float32
(the cast truncates; nerfbaselines does not round). The metrics then read ``uint8 / 255``.

Two protocols name which LPIPS network is reported: ``default`` (AlexNet) and ``nerf`` (AlexNet and VGG,
the protocol of Blender, Mip-NeRF 360 and Zip-NeRF in nerfbaselines).

A *masked* evaluation (ground truth with per-image masks, e.g. a store's ``mask`` component) scores only
the pixels the mask uses (:data:`MASKED_SCORING`, :func:`masked_pair`), as object-centric evaluations
(DTU-style masked PSNR) do; its results say so (``"masked": true`` in the protocol block, and the protocol
named ``"<name> (masked)"``), so its figures are never set against an unmasked evaluation's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raykit.errors import ConfigError
from raykit.lazy import lazy_torch

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_torch(globals())  # reading a protocol's name (``protocol_of``) needs no torch


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol with every parameter that decides its numbers (written to results)."""

    name: str
    lpips_nets: tuple[str, ...]
    ssim_kernel: int = 11
    ssim_sigma: float = 1.5
    ssim_k1: float = 0.01
    ssim_k2: float = 0.03
    lpips_version: str = "0.1"
    quantization: str = "uint8(clip(x * 255, 0, 255)) in float32"
    compositing: str = "rgb * alpha + (1 - alpha) * background, float32, before quantisation"
    reference: str = "nerfbaselines 1.2 (nerfbaselines/evaluation.py, nerfbaselines/metrics.py)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "image": "8-bit sRGB",
            "quantization": self.quantization,
            "compositing": self.compositing,
            "psnr": "per image -10 log10(mse), mse over H, W and channels of uint8 / 255; split mean of "
            "per-image values",
            "ssim": {
                "window": "gaussian",
                "kernel_size": self.ssim_kernel,
                "sigma": self.ssim_sigma,
                "k1": self.ssim_k1,
                "k2": self.ssim_k2,
                "padding": "valid",
                "reduction": "mean over pixels and channels",
                "variance_clip": "dm_pix (mip-NeRF)",
            },
            "lpips": {"nets": list(self.lpips_nets), "version": self.lpips_version, "input": "2 x - 1"},
            "reference": self.reference,
        }


PROTOCOLS: dict[str, Protocol] = {
    "default": Protocol("default", ("alex",)),
    "nerf": Protocol("nerf", ("alex", "vgg")),
}


MASKED_SCORING = (
    "pixels whose mask is 0 are not scored: PSNR's mean squared error is over the used pixels (mask > 0) "
    "and channels only; SSIM and LPIPS compare both images with every unused pixel set to the background"
)
"""How a masked evaluation scores (written to its results as the protocol block's ``mask``)."""


def masked_pair(pred: Tensor, target: Tensor, used: Tensor, background: Tensor) -> tuple[Tensor, Tensor]:
    """``(..., H, W, 3)`` protocol images (uint8, or float in [0, 1]) and ``(..., H, W)`` bool ``used``
    pixels -> both with every unused pixel set to ``background`` (uint8 ``(3,)`` for uint8 images, else
    float in [0, 1]): what SSIM and LPIPS compare in a masked evaluation."""
    keep = used.to(torch.bool)[..., None]
    fill = background.to(device=pred.device, dtype=pred.dtype)
    return torch.where(keep, pred, fill), torch.where(keep, target, fill.to(target.dtype))


def protocol_named(name: str) -> Protocol:
    """The protocol called ``name`` (``default`` or ``nerf``); an unknown name raises ConfigError."""
    if name not in PROTOCOLS:
        raise ConfigError(f"unknown evaluation protocol {name!r}: expected one of {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def quantize(images: Tensor) -> Tensor:
    """``(..., H, W, C)`` float images in [0, 1] -> uint8, as nerfbaselines does (float32, truncation).

    uint8 input is returned as it is.
    """
    if images.dtype == torch.uint8:
        return images
    return (images.to(torch.float32) * 255.0).clamp(0, 255).to(torch.uint8)


def composite(rgba: Tensor, background: Tensor) -> Tensor:
    """``(..., H, W, 4)`` uint8 or float RGBA over ``background (3,)`` in [0, 1] -> float32
    ``(..., H, W, 3)``."""
    rgba = rgba.to(torch.float32) / 255.0 if rgba.dtype == torch.uint8 else rgba.to(torch.float32)
    alpha = rgba[..., 3:]
    return rgba[..., :3] * alpha + (1 - alpha) * background.to(device=rgba.device, dtype=torch.float32)


def to_protocol_image(image: Tensor, background: Tensor | None = None) -> Tensor:
    """Any ``(..., H, W, 3|4)`` image (uint8, or float in [0, 1]) -> the protocol's uint8 RGB.

    RGBA is composited on ``background (3,)`` (black when None, nerfbaselines' default).
    """
    if image.shape[-1] == 4:
        bg = torch.zeros(3) if background is None else background
        image = composite(image, bg)
    return quantize(image[..., :3])


def parse_colour(text: str) -> tuple[float, float, float]:
    """``white``, ``black`` or ``R,G,B`` in [0, 1] -> three floats (the one parser of a background flag)."""
    named = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}
    try:
        values = named[text] if text in named else tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or not all(0.0 <= v <= 1.0 for v in values):
        raise ConfigError(f"background: expected white, black or R,G,B in [0, 1], got {text!r}")
    return (values[0], values[1], values[2])


def parse_background(text: str) -> tuple[int, int, int]:
    """``white``, ``black`` or ``R,G,B`` in [0, 1] -> the 8-bit colour RGBA images are composited on.

    nerfbaselines stores a dataset's background as uint8; a float colour is quantised like an image.
    """
    quantized = quantize(torch.tensor(parse_colour(text), dtype=torch.float32))
    return (int(quantized[0]), int(quantized[1]), int(quantized[2]))


def background_tensor(color: tuple[int, int, int]) -> Tensor:
    """An 8-bit background colour as the float32 ``(3,)`` :func:`composite` takes (``uint8 / 255``)."""
    return torch.tensor(color, dtype=torch.float32) / 255.0


OLD_PROTOCOL = "float (before the community protocol)"


def protocol_of(document: dict[str, Any]) -> str:
    """The protocol an ``eval.json`` was scored under: a name of :data:`raykit.metrics.PROTOCOLS`,
    :data:`OLD_PROTOCOL` without a ``protocol`` block, ``"unknown"`` for any other (a received run
    folder's text never reaches a report as it is)."""
    block = document.get("protocol")
    if not isinstance(block, dict):
        return OLD_PROTOCOL
    name = block.get("name")
    if not (isinstance(name, str) and name in PROTOCOLS):
        return "unknown"
    return f"{name} (masked)" if block.get("masked") is True else name
