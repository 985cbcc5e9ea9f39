"""PSNR and SSIM of 8-bit images, batched, on any device, equal to nerfbaselines' ``metrics.py``.

Images are ``(B, H, W, C)`` uint8 tensors (the protocol's images, :func:`raykit.metrics.to_protocol_image`)
or floats in [0, 1] already on that grid; values are ``x / 255``. Results are ``(B,)`` float64.

- PSNR: ``-10 log10(mse)``, the mean over ``H, W, C`` of the squared difference, per image. For uint8 the
  sum of squared integer differences is exact (int64), so the figure does not depend on the device.
- SSIM: dm_pix's (mip-NeRF's) SSIM: separable Gaussian window (11 taps, sigma 1.5), "valid" filtering
  (no padding), ``k1 = 0.01``, ``k2 = 0.03``, variances clipped to ``eps(float32)**2`` and the covariance
  to ``sqrt(var_x var_y)``, the map averaged over pixels and channels. Computed in float64; an image
  smaller than the window uses a window of its smaller side (odd), which the protocol leaves undefined.

:func:`reference_psnr` and :func:`reference_ssim` are the slow twins (one image and one window at a time).
"""

from __future__ import annotations

import functools
import math
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["psnr", "reference_psnr", "reference_ssim", "ssim"]

_EPS = float(np.finfo(np.float32).eps) ** 2


def _unit(images: Tensor) -> Tensor:
    """uint8 -> float64 ``x / 255``; floats are clipped to [0, 1] and widened."""
    if images.dtype == torch.uint8:
        return images.to(torch.float64) / 255.0
    return images.to(torch.float64).clamp(0, 1)


def _unit32(images: Tensor) -> Tensor:
    """Images as float32 ``x / 255 - 1/2`` (the shift keeps SSIM's variances accurate in float32)."""
    if images.dtype == torch.uint8:
        return images.to(torch.float32) / 255.0 - 0.5
    return images.to(torch.float32).clamp(0, 1) - 0.5


@functools.cache
def _cv2() -> ModuleType | None:
    try:
        import cv2
    except ImportError:
        return None
    return cv2


def psnr(pred: Tensor, target: Tensor) -> Tensor:
    """``(B, H, W, C)`` pairs -> ``(B,)`` PSNR in dB (``inf`` for identical images)."""
    if pred.dtype == torch.uint8 and target.dtype == torch.uint8:
        diff = pred.to(torch.int32) - target.to(torch.int32)
        sse = (diff * diff).flatten(1).sum(1, dtype=torch.int64)
        mse = sse.to(torch.float64) / (float(pred[0].numel()) * 255.0**2)
    else:
        mse = ((_unit(pred) - _unit(target)) ** 2).flatten(1).mean(1)
    return -10.0 * torch.log10(mse)


def _gaussian(size: int, sigma: float, device: torch.device) -> Tensor:
    """(size,) float64 normalised Gaussian centred on the window (dm_pix's filter)."""
    f = ((torch.arange(size, dtype=torch.float64, device=device) - size // 2) / sigma) ** 2
    g = torch.exp(-0.5 * f)
    return g / g.sum()


def _window(height: int, width: int, kernel: int) -> int:
    size = min(kernel, height, width)
    return size - (1 - size % 2)


def _ssim_map(
    mu0: Tensor, mu1: Tensor, s00: Tensor, s11: Tensor, s01: Tensor, k1: float, k2: float
) -> Tensor:
    """dm_pix's SSIM map from the filtered moments of images shifted by -1/2 (variances clipped as
    dm_pix clips them; the shift leaves variances unchanged and is added back to the means)."""
    s00 = torch.clamp(s00 - mu0 * mu0, min=_EPS)
    s11 = torch.clamp(s11 - mu1 * mu1, min=_EPS)
    s01 = s01 - mu0 * mu1
    s01 = torch.sign(s01) * torch.minimum(torch.sqrt(s00 * s11), s01.abs())
    mu0, mu1 = mu0 + 0.5, mu1 + 0.5
    c1, c2 = k1**2, k2**2
    return ((2 * mu0 * mu1 + c1) * (2 * s01 + c2)) / ((mu0 * mu0 + mu1 * mu1 + c1) * (s00 + s11 + c2))


def _blur(maps: Tensor, g: Tensor) -> Tensor:
    """``(M, H, W)`` maps filtered by the separable window ``g (K,)``, "valid" region ``(M, H-K+1, W-K+1)``.

    On the CPU with OpenCV installed, ``cv2.sepFilter2D`` (SIMD, the same sums of products in another
    order); elsewhere two grouped convolutions.
    """
    size = g.shape[0]
    cv2 = _cv2() if maps.device.type == "cpu" else None
    if cv2 is None:
        out = F.conv2d(
            maps[None], g.view(1, 1, -1, 1).expand(maps.shape[0], 1, size, 1), groups=maps.shape[0]
        )
        return F.conv2d(out, g.view(1, 1, 1, -1).expand(maps.shape[0], 1, 1, size), groups=maps.shape[0])[0]
    r, taps = size // 2, g.numpy()
    height, width = maps.shape[1:]
    arrays = maps.numpy()
    filtered = np.empty((maps.shape[0], height - size + 1, width - size + 1), dtype=arrays.dtype)
    for i, m in enumerate(arrays):
        filtered[i] = cv2.sepFilter2D(m, -1, taps, taps)[r : height - r, r : width - r]
    return torch.from_numpy(filtered)


def ssim(
    pred: Tensor,
    target: Tensor,
    *,
    kernel_size: int = 11,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> Tensor:
    """``(B, H, W, C)`` pairs -> ``(B,)`` mean SSIM (see the module docstring)."""
    _, height, width, channels = pred.shape
    size = _window(height, width, kernel_size)
    g = _gaussian(size, sigma, pred.device).to(torch.float32)
    values = []
    for a, b in zip(_unit32(pred), _unit32(target), strict=True):
        x, y = a.permute(2, 0, 1), b.permute(2, 0, 1)  # (C, H, W), shifted to [-1/2, 1/2]
        moments = _blur(torch.cat([x, y, x * x, y * y, x * y]), g).unflatten(0, (5, channels))
        mu0, mu1, s00, s11, s01 = moments.unbind(0)
        values.append(_ssim_map(mu0, mu1, s00, s11, s01, k1, k2).to(torch.float64).mean())
    return torch.stack(values) if values else torch.zeros(0, dtype=torch.float64)


def reference_psnr(pred: Tensor, target: Tensor) -> Tensor:
    """Slow twin of :func:`psnr`: one image at a time, float64 mean, no integer path."""
    out = []
    for a, b in zip(pred, target, strict=True):
        mse = float(((_unit(a) - _unit(b)) ** 2).mean())
        out.append(math.inf if mse == 0 else -10.0 * math.log10(mse))
    return torch.tensor(out, dtype=torch.float64)


def reference_ssim(
    pred: Tensor,
    target: Tensor,
    *,
    kernel_size: int = 11,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> Tensor:
    """Slow twin of :func:`ssim`: float64, every window weighted explicitly (2-D weights), no shift."""
    out = []
    for a, b in zip(_unit(pred), _unit(target), strict=True):
        size = _window(a.shape[0], a.shape[1], kernel_size)
        g = _gaussian(size, sigma, a.device)
        w2 = g[:, None] * g[None, :]
        xs = a.permute(2, 0, 1).unfold(1, size, 1).unfold(2, size, 1)  # (C, H', W', size, size)
        ys = b.permute(2, 0, 1).unfold(1, size, 1).unfold(2, size, 1)
        mx, my = (w2 * xs).sum((-2, -1)), (w2 * ys).sum((-2, -1))
        vx = ((w2 * xs * xs).sum((-2, -1)) - mx * mx).clamp(min=_EPS)
        vy = ((w2 * ys * ys).sum((-2, -1)) - my * my).clamp(min=_EPS)
        cxy = (w2 * xs * ys).sum((-2, -1)) - mx * my
        cxy = torch.where(cxy.abs() > torch.sqrt(vx * vy), torch.sign(cxy) * torch.sqrt(vx * vy), cxy)
        c1, c2 = k1**2, k2**2
        ssim_map = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
        out.append(float(ssim_map.mean()))
    return torch.tensor(out, dtype=torch.float64)
