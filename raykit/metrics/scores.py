"""The one per-image scorer: what ``raykit evaluate``, the trainer's ``eval.json``, its quick checks and
exports score, under one protocol.

Both images of a pair become the protocol's 8-bit images (:func:`to_protocol_image`: a float render is
quantised, a stored RGBA image composited on the background first); PSNR and SSIM with the protocol's
parameters, and LPIPS of each of the protocol's nets that has a model (``lpips`` for AlexNet,
``lpips_vgg`` for VGG; null when not computed, or for an image smaller than the net takes). A pair with a
mask is scored on the pixels the mask uses (:data:`MASKED_SCORING`), and the scorer's protocol block then
says ``"masked": true``.

An ``eval.json`` without a ``protocol`` block was written before the protocol (its ``psnr``/``ssim`` are
float figures): :func:`protocol_of` names it :data:`OLD_PROTOCOL`. The float columns ``psnr_float`` and
``ssim_float`` of earlier releases are no longer written; readers ignore them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raykit.metrics.image_metrics import masked_psnr, psnr, ssim
from raykit.metrics.lpips import LPIPS, MIN_SIDE, LpipsWeightsError, load_lpips, lpips_weight_paths
from raykit.metrics.protocol import (
    MASKED_SCORING,
    Protocol,
    background_tensor,
    masked_pair,
    protocol_named,
    quantize,
    to_protocol_image,
)

__all__ = ["LPIPS_KEYS", "METRIC_KEYS", "Scorer"]

LPIPS_KEYS = {"alex": "lpips", "vgg": "lpips_vgg"}
METRIC_KEYS = ("psnr", "ssim", "lpips")  # the default protocol's figures (eval.json's, per image and split)


class Scorer:
    """Scores image pairs under ``protocol`` on an 8-bit ``background`` (RGBA is composited on it).

    LPIPS: with ``lpips``, the models of the protocol's nets are loaded once on ``device`` from
    ``weights`` (``{net: (trunk, heads)}`` paths, None for the defaults; fetched unless ``offline``,
    see :func:`lpips_weight_paths`). ``strict``: a missing weight file raises
    :class:`LpipsWeightsError`; otherwise LPIPS is null and :attr:`lpips_status` says why. ``masked``:
    the pairs are scored on their masks' used pixels (set by :meth:`prepare` too).
    """

    def __init__(
        self,
        background: tuple[int, int, int] | Tensor,
        *,
        protocol: str = "default",
        device: str | torch.device = "cpu",
        lpips: bool = True,
        weights: Mapping[str, tuple[str | None, str | None]] | None = None,
        offline: bool | None = None,
        strict: bool = False,
        masked: bool = False,
    ) -> None:
        if isinstance(background, Tensor):  # floats in [0, 1]: quantised as an image is
            background = quantize(background.detach().cpu().float())
        r, g, b = (int(v) for v in background)
        self.background = (r, g, b)
        self.protocol: Protocol = protocol_named(protocol)
        self.device = torch.device(device)
        self.keys = ("psnr", "ssim", *(LPIPS_KEYS[net] for net in self.protocol.lpips_nets))
        self.models: dict[str, LPIPS] = {}
        self.masked = masked  # a masked evaluation (set too once a pair with a mask is prepared)
        self.lpips_status = "not asked for"
        if lpips:
            try:
                for net in self.protocol.lpips_nets:
                    paths = lpips_weight_paths(net, *(weights or {}).get(net, (None, None)), offline=offline)
                    self.models[net] = load_lpips(paths, self.device)
                self.lpips_status = f"computed ({', '.join(self.models)})"
            except LpipsWeightsError as exc:
                if strict:
                    raise
                self.models, self.lpips_status = {}, f"not computed: {exc}"

    def prepare(
        self, pred: Tensor | np.ndarray, gt: Tensor | np.ndarray, mask: Tensor | np.ndarray | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(H, W, 3|4)`` images (uint8, or floats in [0, 1]) and an ``(H, W)`` mask (0: not used) ->
        the protocol's uint8 pair, with the unused pixels set to the background, and the used pixels."""
        bg = background_tensor(self.background)
        a = to_protocol_image(torch.as_tensor(pred).cpu(), bg)
        b = to_protocol_image(torch.as_tensor(gt).cpu(), bg)
        if mask is None:
            return a, b, None
        self.masked = True
        used = torch.as_tensor(np.asarray(mask) > 0)
        a, b = masked_pair(a, b, used, torch.tensor(self.background, dtype=torch.uint8))
        return a, b, used

    def figures(self, a: Tensor, b: Tensor, used: Tensor | None = None) -> dict[str, float | None]:
        """PSNR and SSIM of one prepared ``(H, W, 3)`` uint8 pair, on the pair's device (PSNR over the
        ``used`` pixels when given; identical images' infinite PSNR is None, JSON has no infinity)."""
        p = self.protocol
        pair = (a[None], b[None])
        value = psnr(*pair) if used is None else masked_psnr(*pair, used[None].to(a.device))
        return {
            "psnr": _finite(float(value[0])),
            "ssim": float(ssim(*pair, kernel_size=p.ssim_kernel, sigma=p.ssim_sigma, k1=p.ssim_k1,
                               k2=p.ssim_k2)[0]),
        }  # fmt: skip

    @torch.no_grad()
    def lpips(self, a: Tensor, b: Tensor) -> dict[str, float | None]:
        """LPIPS of one prepared pair per protocol net (None without a model or for a too small image)."""
        out: dict[str, float | None] = {}
        for net in self.protocol.lpips_nets:
            model, out[LPIPS_KEYS[net]] = self.models.get(net), None
            if model is not None and min(a.shape[0], a.shape[1]) >= MIN_SIDE[net]:
                out[LPIPS_KEYS[net]] = float(model(a[None].to(self.device), b[None].to(self.device))[0])
        return out

    def score(
        self, pred: Tensor | np.ndarray, gt: Tensor | np.ndarray, mask: Tensor | np.ndarray | None = None
    ) -> dict[str, float | None]:
        """Every figure of one pair (:meth:`prepare`, :meth:`figures` on the CPU, :meth:`lpips`)."""
        a, b, used = self.prepare(pred, gt, mask)
        return {**self.figures(a, b, used), **self.lpips(a, b)}

    def means(self, images: list[dict[str, Any]]) -> dict[str, float | None]:
        """Means over ``images`` of each figure (None when any image lacks it)."""
        means: dict[str, float | None] = {}
        for key in self.keys:
            values = [im.get(key) for im in images]
            ok = [float(v) for v in values if v is not None]
            means[key] = float(np.mean(ok)) if ok and len(ok) == len(values) else None
        return means

    def protocol_block(self) -> dict[str, Any]:
        """Every parameter of the protocol, the background, LPIPS's state, and whether it was masked."""
        block = {
            **self.protocol.to_dict(),
            "background": list(self.background),
            "lpips_status": self.lpips_status,
        }
        if self.masked:
            block.update(masked=True, mask=MASKED_SCORING)
        return block


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None
