"""The protocol's metrics: equal to nerfbaselines' metrics.py (its values committed in
tests/data/oracles, so these run everywhere; one test also runs the installed package), batched equal to
one by one, and equal to their reference twins."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raykit.metrics import (
    image_metrics,
    psnr,
    quantize,
    reference_psnr,
    reference_ssim,
    ssim,
    to_protocol_image,
)

from ..data.oracles import cases
from ..data.oracles.cases import nerfbaselines_metrics, noisy_pairs

_oracle = nerfbaselines_metrics


@pytest.mark.parametrize("seed", list(cases.RANDOM_CASES))
def test_psnr_ssim_equal_nerfbaselines_on_random_images(seed: int) -> None:
    a, b = noisy_pairs(seed, cases.RANDOM_CASES[seed])
    nb_psnr, nb_ssim = _oracle(a, b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    assert np.abs(psnr(ta, tb).numpy() - nb_psnr).max() < 1e-5
    assert np.abs(ssim(ta, tb).numpy() - nb_ssim).max() < 1e-5


def test_psnr_ssim_equal_nerfbaselines_on_real_photos() -> None:
    a, b = cases.photo_pairs()
    nb_psnr, nb_ssim = _oracle(a, b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    got_psnr, got_ssim = psnr(ta, tb).numpy(), ssim(ta, tb).numpy()
    assert np.abs(got_psnr - nb_psnr).max() < 1e-5
    assert np.abs(got_ssim - nb_ssim).max() < 1e-5
    assert 0.0 < got_ssim.min() < got_ssim.max() < 1.0  # real, distinct figures, not degenerate ones


def test_batched_equals_one_by_one_and_twins() -> None:
    a, b = noisy_pairs(5, (3, 24, 30, 3))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    batched_psnr, batched_ssim = psnr(ta, tb), ssim(ta, tb)
    for i in range(3):
        assert psnr(ta[i : i + 1], tb[i : i + 1])[0] == batched_psnr[i]
        assert ssim(ta[i : i + 1], tb[i : i + 1])[0] == batched_ssim[i]
    torch.testing.assert_close(batched_psnr, reference_psnr(ta, tb), rtol=0, atol=1e-9)
    torch.testing.assert_close(batched_ssim, reference_ssim(ta, tb), rtol=0, atol=1e-6)


def test_float_inputs_and_identical_images() -> None:
    a, b = noisy_pairs(7, (2, 20, 20, 3))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    torch.testing.assert_close(psnr(ta.double() / 255, tb.double() / 255), psnr(ta, tb), rtol=0, atol=1e-9)
    torch.testing.assert_close(ssim(ta.float() / 255, tb.float() / 255), ssim(ta, tb), rtol=0, atol=1e-7)
    assert torch.isinf(psnr(ta, ta)).all()
    torch.testing.assert_close(ssim(ta, ta), torch.ones(2, dtype=torch.float64))


def test_ssim_is_symmetric_and_falls_with_noise() -> None:
    g = torch.Generator().manual_seed(0)
    img = torch.rand(1, 20, 24, 3, generator=g)
    noisy = (img + 0.05 * torch.randn(img.shape, generator=g)).clamp(0, 1)
    noisier = (img + 0.2 * torch.randn(img.shape, generator=g)).clamp(0, 1)
    assert ssim(img, noisy)[0] > ssim(img, noisier)[0] > 0
    torch.testing.assert_close(ssim(img, noisy), ssim(noisy, img), rtol=0, atol=1e-7)
    assert float(psnr(torch.zeros(1, 4, 4, 3), torch.full((1, 4, 4, 3), 0.1))[0]) == pytest.approx(20.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_equals_cpu() -> None:
    a, b = noisy_pairs(9, (2, 40, 50, 3))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    torch.testing.assert_close(psnr(ta.cuda(), tb.cuda()).cpu(), psnr(ta, tb))
    torch.testing.assert_close(ssim(ta.cuda(), tb.cuda()).cpu(), ssim(ta, tb), rtol=0, atol=1e-6)


def test_protocol_image_equals_nerfbaselines_image_to_srgb() -> None:
    """Compositing RGBA on the background and quantising floats as nerfbaselines does (truncation)."""
    rgba, background, floats = cases.srgb_inputs()
    expected = cases.nerfbaselines_srgb(rgba, background)
    got = to_protocol_image(torch.from_numpy(rgba), torch.from_numpy(background).float() / 255.0)
    assert np.array_equal(got.numpy(), expected) and len(np.unique(expected)) > 100
    assert np.array_equal(quantize(torch.from_numpy(floats)).numpy(), cases.nerfbaselines_srgb(floats))


def test_torch_path_equals_the_opencv_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ssim``'s any-device path (grouped convolutions) against its CPU path (OpenCV) and the oracle."""
    a, b = noisy_pairs(11, cases.RANDOM_CASES[11])
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    cpu = ssim(ta, tb)
    monkeypatch.setattr(image_metrics, "_cv2", lambda: None)
    anywhere = ssim(ta, tb)
    torch.testing.assert_close(anywhere, cpu, rtol=0, atol=1e-6)
    assert np.abs(anywhere.numpy() - _oracle(a, b)[1]).max() < 1e-5


def test_nerfbaselines_itself_where_it_is_installed() -> None:
    """The committed values are the installed nerfbaselines' (skips where it is not installed)."""
    nb = pytest.importorskip(
        "nerfbaselines.metrics", reason="the oracle: pip install --no-deps nerfbaselines"
    )
    for seed, shape in cases.RANDOM_CASES.items():
        a, b = noisy_pairs(seed, shape)
        af, bf = a.astype(np.float32) / 255.0, b.astype(np.float32) / 255.0
        np.testing.assert_allclose(nb.psnr(nb.mse(af, bf)), _oracle(a, b)[0], rtol=0, atol=1e-5)
        np.testing.assert_allclose(nb.ssim(bf, af), _oracle(a, b)[1], rtol=0, atol=1e-6)
