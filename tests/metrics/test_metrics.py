"""The protocol's metrics: equal to nerfbaselines' metrics.py (the oracle, installed with --no-deps),
batched equal to one by one, and equal to their reference twins."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from raykit.imagedecode import decode_image
from raykit.metrics import (
    image_metrics,
    psnr,
    quantize,
    reference_psnr,
    reference_ssim,
    ssim,
    to_protocol_image,
)

nb_metrics = pytest.importorskip(
    "nerfbaselines.metrics", reason="the oracle: pip install --no-deps nerfbaselines"
)
nb_utils = pytest.importorskip("nerfbaselines.utils")

PHOTOS = Path(__file__).resolve().parents[1] / "data" / "plant_capture" / "images"


def _noisy_pairs(seed: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    b = np.clip(a.astype(np.int64) + rng.integers(-40, 40, shape), 0, 255).astype(np.uint8)
    return a, b


def _oracle(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """nerfbaselines' figures of uint8 pairs, as its compute_metrics makes them (ssim(gt, pred))."""
    af, bf = a.astype(np.float32) / 255.0, b.astype(np.float32) / 255.0
    return nb_metrics.psnr(nb_metrics.mse(af, bf)), nb_metrics.ssim(bf, af)


def _photos() -> tuple[np.ndarray, np.ndarray]:
    return tuple(decode_image((PHOTOS / n).read_bytes()) for n in ("frame_00001.jpg", "frame_00037.jpg"))  # type: ignore[return-value]


@pytest.mark.parametrize("shape", [(3, 32, 45, 3), (2, 11, 11, 3), (1, 64, 40, 4)])
def test_psnr_ssim_equal_nerfbaselines_on_random_images(shape: tuple[int, ...]) -> None:
    a, b = _noisy_pairs(sum(shape), shape)
    nb_psnr, nb_ssim = _oracle(a, b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    assert np.abs(psnr(ta, tb).numpy() - nb_psnr).max() < 1e-5
    assert np.abs(ssim(ta, tb).numpy() - nb_ssim).max() < 1e-5


def test_psnr_ssim_equal_nerfbaselines_on_real_photos() -> None:
    first, second = _photos()
    noisy = np.clip(first.astype(np.int64) + np.random.default_rng(1).integers(-6, 7, first.shape), 0, 255)
    a = np.stack([first, first, second])
    b = np.stack([second, noisy.astype(np.uint8), first])
    nb_psnr, nb_ssim = _oracle(a, b)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    got_psnr, got_ssim = psnr(ta, tb).numpy(), ssim(ta, tb).numpy()
    assert np.abs(got_psnr - nb_psnr).max() < 1e-5
    assert np.abs(got_ssim - nb_ssim).max() < 1e-5
    assert 0.0 < got_ssim.min() < got_ssim.max() < 1.0  # real, distinct figures, not degenerate ones


def test_batched_equals_one_by_one_and_twins() -> None:
    a, b = _noisy_pairs(5, (3, 24, 30, 3))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    batched_psnr, batched_ssim = psnr(ta, tb), ssim(ta, tb)
    for i in range(3):
        assert psnr(ta[i : i + 1], tb[i : i + 1])[0] == batched_psnr[i]
        assert ssim(ta[i : i + 1], tb[i : i + 1])[0] == batched_ssim[i]
    torch.testing.assert_close(batched_psnr, reference_psnr(ta, tb), rtol=0, atol=1e-9)
    torch.testing.assert_close(batched_ssim, reference_ssim(ta, tb), rtol=0, atol=1e-6)


def test_float_inputs_and_identical_images() -> None:
    a, b = _noisy_pairs(7, (2, 20, 20, 3))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    torch.testing.assert_close(psnr(ta.double() / 255, tb.double() / 255), psnr(ta, tb), rtol=0, atol=1e-9)
    torch.testing.assert_close(ssim(ta.float() / 255, tb.float() / 255), ssim(ta, tb), rtol=0, atol=1e-7)
    assert torch.isinf(psnr(ta, ta)).all()
    torch.testing.assert_close(ssim(ta, ta), torch.ones(2, dtype=torch.float64))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_equals_cpu() -> None:
    a, b = _noisy_pairs(9, (2, 40, 50, 3))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    torch.testing.assert_close(psnr(ta.cuda(), tb.cuda()).cpu(), psnr(ta, tb))
    torch.testing.assert_close(ssim(ta.cuda(), tb.cuda()).cpu(), ssim(ta, tb), rtol=0, atol=1e-6)


def test_protocol_image_equals_nerfbaselines_image_to_srgb() -> None:
    """Compositing RGBA on the background and quantising floats as nerfbaselines does (truncation)."""
    rng = np.random.default_rng(3)
    rgba = rng.integers(0, 256, (2, 9, 7, 4), dtype=np.uint8)
    background = np.array([255, 128, 0], dtype=np.uint8)
    expected = nb_utils.image_to_srgb(rgba, np.uint8, background_color=background)
    got = to_protocol_image(torch.from_numpy(rgba), torch.from_numpy(background).float() / 255.0)
    assert np.array_equal(got.numpy(), expected)
    floats = rng.random((5, 6, 3)).astype(np.float32) * 1.2 - 0.1
    assert np.array_equal(
        quantize(torch.from_numpy(floats)).numpy(), nb_utils.image_to_srgb(floats, np.uint8)
    )


def test_torch_path_equals_the_opencv_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ssim``'s any-device path (grouped convolutions) against its CPU path (OpenCV) and the oracle."""
    a, b = _noisy_pairs(11, (2, 30, 41, 3))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    cpu = ssim(ta, tb)
    monkeypatch.setattr(image_metrics, "_cv2", lambda: None)
    anywhere = ssim(ta, tb)
    torch.testing.assert_close(anywhere, cpu, rtol=0, atol=1e-6)
    assert np.abs(anywhere.numpy() - _oracle(a, b)[1]).max() < 1e-5
