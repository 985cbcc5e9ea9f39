"""PSNR and SSIM of 8-bit images, batched, on any device, equal to nerfbaselines' ``metrics.py``.

Images are ``(B, H, W, C)`` uint8 tensors (the protocol's images, :func:`raykit.metrics.to_protocol_image`)
or floats in [0, 1] already on that grid; values are ``x / 255``. Results are ``(B,)`` float64.

- PSNR: ``-10 log10(mse)``, the mean over ``H, W, C`` of the squared difference, per image. For uint8 the
  sum of squared differences is exact (a histogram of the absolute differences), so the figure does not
  depend on the device.
- SSIM: dm_pix's (mip-NeRF's) SSIM: separable Gaussian window (11 taps, sigma 1.5), "valid" filtering
  (no padding), ``k1 = 0.01``, ``k2 = 0.03``, variances clipped to ``eps(float32)**2`` and the covariance
  to ``sqrt(var_x var_y)``, the map averaged over pixels and channels. Computed in float64; an image
  smaller than the window uses a window of its smaller side (odd), which the protocol leaves undefined.
  The moments are filtered in float32 on images shifted to [-1/2, 1/2] (variances computed as
  ``E[x^2] - E[x]^2`` lose less there); nerfbaselines filters in float32 too.

:func:`reference_psnr` and :func:`reference_ssim` are the slow twins (one image and one window at a time).
"""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from raykit.lazy import optional_module

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


def _cv2() -> ModuleType | None:
    return optional_module("cv2")


def mse_to_psnr(mse: float) -> float:
    """PSNR in dB of a mean squared error of values in [0, 1] (``inf`` for zero error): the training log's."""
    return math.inf if mse <= 0 else -10.0 * math.log10(mse)


def psnr(pred: Tensor, target: Tensor) -> Tensor:
    """``(B, H, W, C)`` pairs -> ``(B,)`` PSNR in dB (``inf`` for identical images)."""
    if pred.dtype == torch.uint8 and target.dtype == torch.uint8:
        squares = torch.arange(256, dtype=torch.int64, device=pred.device) ** 2
        sse = torch.stack([_histogram(a, b) @ squares for a, b in zip(pred, target, strict=True)])
        mse = sse.to(torch.float64) / (float(pred[0].numel()) * 255.0**2)
    else:
        mse = ((_unit(pred) - _unit(target)) ** 2).flatten(1).mean(1)
    return -10.0 * torch.log10(mse)


def masked_psnr(pred: Tensor, target: Tensor, used: Tensor) -> Tensor:
    """``(B, H, W, C)`` pairs and ``(B, H, W)`` bool ``used`` pixels -> ``(B,)`` PSNR in dB over the used
    pixels only (the mean squared error over them and the channels; exact for uint8); NaN for an image
    without a used pixel, ``inf`` when they are identical there."""
    out = []
    for a, b, m in zip(pred, target, used.to(torch.bool), strict=True):
        n = int(m.sum()) * a.shape[-1]
        if n == 0:
            out.append(torch.tensor(math.nan, dtype=torch.float64))
            continue
        if a.dtype == torch.uint8 and b.dtype == torch.uint8:
            diff = a[m].to(torch.int64) - b[m].to(torch.int64)
            mse = (diff * diff).sum().to(torch.float64).cpu() / (n * 255.0**2)
        else:
            mse = ((_unit(a[m]) - _unit(b[m])) ** 2).sum().cpu() / n
        out.append(-10.0 * torch.log10(mse))
    return torch.stack(out) if out else torch.zeros(0, dtype=torch.float64)


def reference_masked_psnr(pred: Tensor, target: Tensor, used: Tensor) -> Tensor:
    """Slow twin of :func:`masked_psnr`: float64, pixel by pixel of the used ones."""
    out = []
    for a, b, m in zip(pred, target, used, strict=True):
        errors = [float(((_unit(a[y, x]) - _unit(b[y, x])) ** 2).sum()) for y, x in m.nonzero().tolist()]
        count = len(errors) * a.shape[-1]
        mse = sum(errors) / count if count else math.nan
        out.append(math.inf if mse == 0 else -10.0 * math.log10(mse) if count else math.nan)
    return torch.tensor(out, dtype=torch.float64)


def _histogram(a: Tensor, b: Tensor) -> Tensor:
    """(256,) int64: how many of the values of two uint8 images differ by 0, 1, ..., 255 (exact)."""
    return torch.bincount((torch.maximum(a, b) - torch.minimum(a, b)).flatten(), minlength=256)


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
    """``(M, H, W)`` maps filtered by the separable window ``g (K,)``, "valid" region
    ``(M, H-K+1, W-K+1)``: two grouped convolutions."""
    size, count = g.shape[0], maps.shape[0]
    out = F.conv2d(maps[None], g.view(1, 1, -1, 1).expand(count, 1, size, 1), groups=count)
    return F.conv2d(out, g.view(1, 1, 1, -1).expand(count, 1, 1, size), groups=count)[0]


def _ssim_torch(a: Tensor, b: Tensor, g: Tensor, k1: float, k2: float) -> Tensor:
    """Mean SSIM of one pair of ``(H, W, C)`` float32 images shifted to [-1/2, 1/2], any device."""
    x, y = a.permute(2, 0, 1), b.permute(2, 0, 1)
    moments = _blur(torch.cat([x, y, x * x, y * y, x * y]), g).unflatten(0, (5, a.shape[2]))
    mu0, mu1, s00, s11, s01 = moments.unbind(0)
    return _ssim_map(mu0, mu1, s00, s11, s01, k1, k2).to(torch.float64).mean()


_ROWS = 48  # output rows per block of the CPU path: the block's temporaries stay in the caches


def _ssim_opencv(cv2: ModuleType, a: np.ndarray, b: np.ndarray, g: np.ndarray, k1: float, k2: float) -> float:
    """:func:`_ssim_torch` on the CPU: ``cv2.sepFilter2D`` on the ``(H, W, C)`` moments (the same sums
    of products in another order), then :func:`_ssim_map` in blocks of rows (they stay in the caches)."""
    r = g.shape[0] // 2
    height, width = a.shape[:2]
    blurred = [
        cv2.sepFilter2D(m, -1, g, g)[r : height - r, r : width - r] for m in (a, b, a * a, b * b, a * b)
    ]
    total, count = 0.0, 0
    for lo in range(0, height - 2 * r, _ROWS):
        mu0, mu1, s00, s11, s01 = (torch.from_numpy(m[lo : lo + _ROWS]) for m in blurred)
        block = _ssim_map(mu0, mu1, s00, s11, s01, k1, k2)
        total += float(block.sum(dtype=torch.float64))
        count += block.numel()
    return total / count


def ssim(
    pred: Tensor,
    target: Tensor,
    *,
    kernel_size: int = 11,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> Tensor:
    """``(B, H, W, C)`` pairs -> ``(B,)`` mean SSIM (see the module docstring).

    On the CPU with OpenCV installed the filtering runs through ``cv2.sepFilter2D`` (:func:`_ssim_opencv`);
    elsewhere through grouped convolutions (:func:`_ssim_torch`). Both are checked against
    :func:`reference_ssim` and nerfbaselines.
    """
    _, height, width, _ = pred.shape
    size = _window(height, width, kernel_size)
    g = _gaussian(size, sigma, pred.device).to(torch.float32)
    cv2 = _cv2() if pred.device.type == "cpu" and pred.shape[3] <= 4 else None  # OpenCV: at most 4 channels
    values = []
    for a, b in zip(_unit32(pred), _unit32(target), strict=True):
        if cv2 is not None:
            values.append(torch.tensor(_ssim_opencv(cv2, a.numpy(), b.numpy(), g.numpy(), k1, k2)))
        else:
            values.append(_ssim_torch(a, b, g, k1, k2))
    return torch.stack(values).to(torch.float64) if values else torch.zeros(0, dtype=torch.float64)


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
