"""What raykit's own figures score: the community evaluation protocol (:mod:`raykit.metrics`).

Each evaluated image is scored as ``raykit evaluate`` scores it: the render quantised to 8 bits as
nerfbaselines quantises it, against the stored image composited on the run's background and quantised
likewise; PSNR and SSIM, and LPIPS (AlexNet, the ``default`` protocol) when its published weights are on
this machine and the image is large enough (otherwise ``lpips`` is null and the protocol block says why).
The float figures of earlier releases (render and target in float, no quantisation) stay as the labelled
extra columns ``psnr_float`` and ``ssim_float``.

An ``eval.json`` has a top-level ``protocol`` block (:meth:`Scorer.protocol_block`); one without it was
written before the protocol, and :func:`protocol_of` names it :data:`OLD_PROTOCOL`.

Masked evaluation: on a store with a ``mask`` component, each image is scored on the pixels its mask uses
(:data:`raykit.metrics.MASKED_SCORING`: PSNR over the used pixels, SSIM and LPIPS with the unused ones
set to the background in both images; the float columns likewise), and the protocol block says
``"masked": true``, so :func:`protocol_of` names it ``"default (masked)"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raykit.metrics import (
    LPIPS,
    MASKED_SCORING,
    MIN_SIDE,
    PROTOCOLS,
    LpipsWeightsError,
    background_tensor,
    load_lpips,
    lpips_weight_paths,
    masked_pair,
    masked_psnr,
    protocol_named,
    psnr,
    quantize,
    ssim,
    to_protocol_image,
)
from raykit.trainer import metrics as float_metrics

__all__ = ["FLOAT_KEYS", "METRIC_KEYS", "OLD_PROTOCOL", "Scorer", "protocol_of", "split_means"]

METRIC_KEYS = ("psnr", "ssim", "lpips")
FLOAT_KEYS = ("psnr_float", "ssim_float")
OLD_PROTOCOL = "float (before the community protocol)"
_PROTOCOL = protocol_named("default")


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


class Scorer:
    """Scores renders of one run under the ``default`` protocol; LPIPS loaded once, when available.
    ``masked``: the run's images are scored on their masks' used pixels (the module docstring)."""

    def __init__(
        self, background: torch.Tensor, device: torch.device, lpips: bool = True, masked: bool = False
    ) -> None:
        self.background = tuple(int(v) for v in quantize(background.detach().cpu().float()))
        self.device, self.masked = device, masked
        self.lpips: LPIPS | None = None
        self.lpips_note = "not asked for"
        if lpips:
            try:
                self.lpips = load_lpips(lpips_weight_paths("alex"), device)
                self.lpips_note = "computed (AlexNet)"
            except LpipsWeightsError as exc:
                self.lpips_note = f"not computed: {exc}"

    def score(
        self, pred: torch.Tensor, target: torch.Tensor, stored: np.ndarray, mask: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Figures of one render ``pred (H, W, 3)`` float in [0, 1]; ``target (H, W, 3)`` is the float
        target of the float columns, ``stored (H, W, 3|4)`` uint8 the store's image; ``mask (H, W)``
        uint8 (0 = not used) scores the used pixels only (a masked evaluation)."""
        a = quantize(pred.cpu())[None]
        b = to_protocol_image(torch.from_numpy(stored), background_tensor(self.background))[None]  # type: ignore[arg-type]
        pred, target = pred.cpu(), target.cpu()
        if mask is None:
            psnr_value, psnr_float = float(psnr(a, b)[0]), float_metrics.psnr(pred, target)
        else:
            used = torch.from_numpy(np.asarray(mask) > 0)
            psnr_value = float(masked_psnr(a, b, used[None])[0])
            psnr_float = float(masked_psnr(pred[None], target[None], used[None])[0])
            a, b = masked_pair(a, b, used[None], torch.tensor(self.background, dtype=torch.uint8))
            pred, target = masked_pair(pred, target, used, torch.tensor(self.background) / 255.0)
        record: dict[str, Any] = {
            "psnr": _finite(psnr_value),
            "ssim": float(ssim(a, b)[0]),
            "lpips": None,
            "psnr_float": _finite(psnr_float),
            "ssim_float": float_metrics.ssim(pred, target),
        }
        if self.lpips is not None and min(a.shape[1], a.shape[2]) >= MIN_SIDE["alex"]:
            with torch.no_grad():
                record["lpips"] = float(self.lpips(a.to(self.device), b.to(self.device))[0])
        return record

    def protocol_block(self) -> dict[str, Any]:
        """The ``protocol`` block of ``eval.json``: every parameter, the background, LPIPS's state."""
        block = {**_PROTOCOL.to_dict(), "background": list(self.background), "lpips_status": self.lpips_note,
                 "float_columns": list(FLOAT_KEYS)}  # fmt: skip
        if self.masked:
            block.update(masked=True, mask=MASKED_SCORING)
        return block


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def split_means(images: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per-split means of :data:`METRIC_KEYS` and :data:`FLOAT_KEYS` (None when any image lacks one)."""
    means: dict[str, float | None] = {}
    for key in (*METRIC_KEYS, *FLOAT_KEYS):
        values = [im.get(key) for im in images]
        ok = [float(v) for v in values if v is not None]
        means[key] = float(np.mean(ok)) if ok and len(ok) == len(values) else None
    return means
