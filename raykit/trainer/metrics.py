"""Image quality metrics: PSNR and SSIM (Wang et al. 2004, 11x11 Gaussian window, sigma 1.5).

Images are ``(H, W, 3)`` float tensors in [0, 1]. SSIM is computed per channel on the "valid"
region (no padding) and averaged, as in the NeRF literature (``skimage``'s ``gaussian_weights=True``,
``use_sample_covariance=False``, ``data_range=1``). :func:`reference_ssim` is its slow twin.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["mse_to_psnr", "psnr", "reference_ssim", "ssim"]

_C1 = 0.01**2
_C2 = 0.03**2


def mse_to_psnr(mse: float) -> float:
    """PSNR in dB of a mean squared error for signals in [0, 1] (``inf`` for zero error)."""
    return math.inf if mse <= 0 else -10.0 * math.log10(mse)


def psnr(pred: Tensor, target: Tensor) -> float:
    """PSNR in dB between two images (any equal shapes), values in [0, 1]."""
    return mse_to_psnr(float(torch.mean((pred.double() - target.double()) ** 2)))


def _gaussian_window(size: int, sigma: float, dtype: torch.dtype) -> Tensor:
    """(size,) normalised 1-D Gaussian."""
    coords = torch.arange(size, dtype=dtype) - (size - 1) / 2
    window = torch.exp(-(coords**2) / (2 * sigma**2))
    return window / window.sum()


def ssim(pred: Tensor, target: Tensor, window: int = 11, sigma: float = 1.5) -> float:
    """Mean structural similarity of two ``(H, W, 3)`` images (separable Gaussian filtering).

    Images smaller than the window use a window of the image's smaller side (odd).
    """
    size = min(window, pred.shape[0], pred.shape[1])
    size -= 1 - size % 2
    g = _gaussian_window(size, sigma, torch.float64)
    x = pred.double().permute(2, 0, 1)[:, None]
    y = target.double().permute(2, 0, 1)[:, None]

    def blur(img: Tensor) -> Tensor:
        img = F.conv2d(img, g.view(1, 1, -1, 1))
        return F.conv2d(img, g.view(1, 1, 1, -1))

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x**2
    var_y = blur(y * y) - mu_y**2
    cov = blur(x * y) - mu_x * mu_y
    num = (2 * mu_x * mu_y + _C1) * (2 * cov + _C2)
    den = (mu_x**2 + mu_y**2 + _C1) * (var_x + var_y + _C2)
    return float((num / den).mean())


def reference_ssim(pred: Tensor, target: Tensor, window: int = 11, sigma: float = 1.5) -> float:
    """Slow twin of :func:`ssim`: one explicit weighted window per output pixel and channel."""
    size = min(window, pred.shape[0], pred.shape[1])
    size -= 1 - size % 2
    g = _gaussian_window(size, sigma, torch.float64)
    w2 = g[:, None] * g[None, :]
    x_all, y_all = pred.double(), target.double()
    values = []
    for c in range(x_all.shape[2]):
        for i in range(x_all.shape[0] - size + 1):
            for j in range(x_all.shape[1] - size + 1):
                x = x_all[i : i + size, j : j + size, c]
                y = y_all[i : i + size, j : j + size, c]
                mx, my = (w2 * x).sum(), (w2 * y).sum()
                vx = (w2 * (x - mx) ** 2).sum()
                vy = (w2 * (y - my) ** 2).sum()
                cxy = (w2 * (x - mx) * (y - my)).sum()
                values.append(
                    ((2 * mx * my + _C1) * (2 * cxy + _C2)) / ((mx**2 + my**2 + _C1) * (vx + vy + _C2))
                )
    return float(torch.stack(values).mean())
