"""A store's per-image components (masks, depth maps) as nerfstudio's models read them."""

from __future__ import annotations

import torch

__all__ = ["nerfstudio_components"]


def nerfstudio_components(
    mask: torch.Tensor | None,
    depth: torch.Tensor | None,
    scale: float,
    alpha_mask: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """A store's ``mask`` (..., ) uint8 and ``depth`` (...,) float32 (store units) where nerfstudio's
    models read them: ``mask`` (..., 1) bool (used: mask > 0; and ``alpha_mask`` (..., 1) when the
    parser's ``alpha_as_mask`` gives one) and ``depth_image`` (..., 1) float32 scaled by the parser's
    ``scale`` (``dataparser_scale``, as nerfstudio's depth dataset scales its depths; 0 stays unknown)."""
    out: dict[str, torch.Tensor] = {}
    if alpha_mask is not None:
        out["mask"] = alpha_mask
    if mask is not None:
        used = (mask > 0)[..., None]
        out["mask"] = used if alpha_mask is None else alpha_mask & used
    if depth is not None:
        out["depth_image"] = depth.to(torch.float32)[..., None] * scale
    return out
