"""What raykit's own figures score: the community evaluation protocol (:mod:`raykit.metrics`).

Each evaluated image is scored as ``raykit evaluate`` scores it: the render quantised to 8 bits as
nerfbaselines quantises it, against the stored image composited on the run's background and quantised
likewise; PSNR and SSIM, and LPIPS (AlexNet, the ``default`` protocol) when its published weights are on
this machine and the image is large enough (otherwise ``lpips`` is null and the protocol block says why).
The float figures of earlier releases (render and target in float, no quantisation) stay as the labelled
extra columns ``psnr_float`` and ``ssim_float``.

An ``eval.json`` has a top-level ``protocol`` block (:meth:`Scorer.protocol_block`); one without it was
written before the protocol, and :func:`protocol_of` names it :data:`OLD_PROTOCOL`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raykit.metrics import (
    LPIPS,
    MIN_SIDE,
    PROTOCOLS,
    LpipsWeightsError,
    background_tensor,
    load_lpips,
    lpips_weight_paths,
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
    return name if isinstance(name, str) and name in PROTOCOLS else "unknown"


class Scorer:
    """Scores renders of one run under the ``default`` protocol; LPIPS loaded once, when available."""

    def __init__(self, background: torch.Tensor, device: torch.device, lpips: bool = True) -> None:
        self.background = tuple(int(v) for v in quantize(background.detach().cpu().float()))
        self.device = device
        self.lpips: LPIPS | None = None
        self.lpips_note = "not asked for"
        if lpips:
            try:
                self.lpips = load_lpips(lpips_weight_paths("alex"), device)
                self.lpips_note = "computed (AlexNet)"
            except LpipsWeightsError as exc:
                self.lpips_note = f"not computed: {exc}"

    def score(self, pred: torch.Tensor, target: torch.Tensor, stored: np.ndarray) -> dict[str, Any]:
        """Figures of one render ``pred (H, W, 3)`` float in [0, 1]; ``target (H, W, 3)`` is the float
        target of the float columns, ``stored (H, W, 3|4)`` uint8 the store's image."""
        a = quantize(pred.cpu())[None]
        b = to_protocol_image(torch.from_numpy(stored), background_tensor(self.background))[None]  # type: ignore[arg-type]
        record: dict[str, Any] = {
            "psnr": _finite(float(psnr(a, b)[0])),
            "ssim": float(ssim(a, b)[0]),
            "lpips": None,
            "psnr_float": _finite(float_metrics.psnr(pred.cpu(), target.cpu())),
            "ssim_float": float_metrics.ssim(pred.cpu(), target.cpu()),
        }
        if self.lpips is not None and min(a.shape[1], a.shape[2]) >= MIN_SIDE["alex"]:
            with torch.no_grad():
                record["lpips"] = float(self.lpips(a.to(self.device), b.to(self.device))[0])
        return record

    def protocol_block(self) -> dict[str, Any]:
        """The ``protocol`` block of ``eval.json``: every parameter, the background, LPIPS's state."""
        return {**_PROTOCOL.to_dict(), "background": list(self.background), "lpips_status": self.lpips_note,
                "float_columns": list(FLOAT_KEYS)}  # fmt: skip


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
