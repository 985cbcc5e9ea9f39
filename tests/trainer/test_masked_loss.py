"""The compact trainer's loss ignores the pixels a mask leaves out (issue 45)."""

from __future__ import annotations

from pathlib import Path

import torch

from raykit.store import open_store
from raykit.trainer.evaluate import build_models
from raykit.trainer.loop import photometric_loss, step_losses

from .test_train import tiny_config


def test_photometric_loss_is_the_mse_of_the_used_rays() -> None:
    rgb, target = torch.rand(10, 3), torch.rand(10, 3)
    mask = torch.tensor([255, 0, 7, 0, 0, 255, 1, 0, 255, 0], dtype=torch.uint8)
    used = mask > 0
    expected = torch.mean((rgb[used] - target[used]) ** 2)
    torch.testing.assert_close(photometric_loss(rgb, target, mask), expected)
    torch.testing.assert_close(photometric_loss(rgb, target, None), torch.mean((rgb - target) ** 2))
    assert float(photometric_loss(rgb, target, torch.zeros(10, dtype=torch.uint8))) == 0.0


def test_training_step_ignores_masked_pixels(tiny_store: Path, tmp_path: Path) -> None:
    """Changing the colours of masked-out rays changes neither the loss nor a gradient; without the
    mask they would (the check that fails when the loss ignores masks)."""
    store = open_store(str(tiny_store))
    config = tiny_config(tiny_store, tmp_path, sampler="stratified", scene_space="box")
    batch = store.image_rays(store.images("train")[0], "cpu")
    n = len(batch)
    mask = torch.zeros(n, dtype=torch.uint8)
    mask[: n // 2] = 255
    background = torch.ones(3)

    def loss_and_grads(rgb: torch.Tensor, with_mask: bool) -> tuple[float, list[torch.Tensor]]:
        field, grid = build_models(
            config, torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]), torch.device("cpu")
        )
        changed = type(batch)(**{**batch.__dict__, "rgb": rgb, "extra": {"mask": mask} if with_mask else {}})
        loss, _, _ = step_losses(config, field, field, grid, changed, background, 0, None)
        loss.backward()
        return float(loss.detach()), [p.grad.clone() for p in field.parameters() if p.grad is not None]

    other = batch.rgb.clone()
    other[n // 2 :] = 1.0 - other[n // 2 :]  # masked-out rays get other colours
    loss_a, grads_a = loss_and_grads(batch.rgb, True)
    loss_b, grads_b = loss_and_grads(other, True)
    assert loss_a == loss_b
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b)
    assert loss_and_grads(batch.rgb, False)[0] != loss_and_grads(other, False)[0]
