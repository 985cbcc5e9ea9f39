"""Masked evaluation (issue 45): PSNR over the used pixels equals its twin, and the pair SSIM/LPIPS see."""

from __future__ import annotations

import numpy as np
import torch

from raykit.metrics import masked_pair, masked_psnr, psnr, reference_masked_psnr


def test_masked_psnr_equals_its_twin_and_ignores_unused_pixels() -> None:
    rng = np.random.default_rng(3)
    a = torch.from_numpy(rng.integers(0, 256, (2, 9, 11, 3), dtype=np.uint8))
    b = torch.from_numpy(rng.integers(0, 256, (2, 9, 11, 3), dtype=np.uint8))
    used = torch.from_numpy(rng.random((2, 9, 11)) < 0.4)
    value = masked_psnr(a, b, used)
    torch.testing.assert_close(value, reference_masked_psnr(a, b, used))
    torch.testing.assert_close(masked_psnr(a.float() / 255, b.float() / 255, used), value)
    changed = b.clone()
    changed[~used] = 255 - changed[~used]  # unused pixels do not count
    torch.testing.assert_close(masked_psnr(a, changed, used), value)
    everything = torch.ones(2, 9, 11, dtype=torch.bool)
    torch.testing.assert_close(masked_psnr(a, b, everything), psnr(a, b))
    assert torch.isnan(masked_psnr(a, b, torch.zeros_like(used))).all()


def test_masked_pair_sets_unused_pixels_to_the_background() -> None:
    a = torch.full((1, 2, 2, 3), 10, dtype=torch.uint8)
    b = torch.full((1, 2, 2, 3), 20, dtype=torch.uint8)
    used = torch.tensor([[[True, False], [False, True]]])
    pa, pb = masked_pair(a, b, used, torch.tensor([255, 0, 7], dtype=torch.uint8))
    assert pa[0, 0, 1].tolist() == pb[0, 0, 1].tolist() == [255, 0, 7]
    assert pa[0, 0, 0].tolist() == [10] * 3 and pb[0, 1, 1].tolist() == [20] * 3
