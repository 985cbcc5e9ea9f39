"""The compact trainer's loss ignores the pixels a mask leaves out (issue 45)."""

from __future__ import annotations

from pathlib import Path

import torch

from raykit.loaders import image_rays
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
    batch = image_rays(store, store.images("train")[0], "cpu")
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


def test_a_run_on_a_store_with_masks_is_evaluated_masked(tmp_path: Path) -> None:
    """The run's loader serves the masks (not the depth), and eval.json names the masked protocol."""
    import json

    from raykit.converters import convert
    from raykit.testing import render_scene, write_nerfstudio
    from raykit.trainer import protocol_of, train

    source = write_nerfstudio(render_scene("tiny"), tmp_path / "capture", masks=True, depth=True)
    convert(source, tmp_path / "scene.zarr", threads=1)
    config = tiny_config(tmp_path / "scene.zarr", tmp_path / "run", steps=2)
    run = train(config)
    evaluation = json.loads((run / "eval.json").read_text())
    assert evaluation["protocol"]["masked"] is True and "mask" in evaluation["protocol"]
    assert protocol_of(evaluation) == "default (masked)"
    image = evaluation["splits"]["test"]["images"][0]
    assert image["psnr"] is not None and image["ssim"] is not None
    # raykit evaluate of the saved renders against the store (masked too) gives the same figures
    import raykit.cli

    out = tmp_path / "results.json"
    gt = f"{tmp_path / 'scene.zarr'}:test"
    background = ",".join(str(v / 255) for v in evaluation["protocol"]["background"])  # the run's
    flags = ["--output", str(out), "--no-lpips", "--background", background]
    assert raykit.cli.main(["evaluate", str(run / "renders" / "test"), gt, *flags]) == 0
    scored = json.loads(out.read_text())
    assert scored["protocol"]["masked"] is True and scored["n_images"] == 2
    ours = {Path(im["name"]).name: im for im in evaluation["splits"]["test"]["images"]}
    for im in scored["images"]:
        assert im["psnr"] == ours[Path(im["name"]).name + ".png"]["psnr"]
        assert im["ssim"] == ours[Path(im["name"]).name + ".png"]["ssim"]
    # an export verifies against the run's masked figures, scored masked too
    from raykit.trainer import export_run, verify_export

    verified = verify_export(export_run(run, tmp_path / "model"))
    assert verified["difference_db"] <= 0.05 and verified["protocol"] == "default (masked)"


def test_masked_scores_ignore_the_unused_pixels() -> None:
    import numpy as np

    from raykit.metrics import Scorer

    rng = np.random.default_rng(0)
    stored = rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)
    target = torch.from_numpy(stored).float() / 255
    pred = (target + torch.from_numpy(rng.normal(0, 0.05, (24, 20, 3))).float()).clamp(0, 1)
    mask = np.zeros((24, 20), np.uint8)
    mask[4:20, 3:15] = 255
    scorer = Scorer(torch.ones(3), lpips=False, masked=True)
    scores = scorer.score(pred, stored, mask)
    other = pred.clone()
    other[torch.from_numpy(mask == 0)] = 0.0  # a render that differs only where the mask is 0
    assert scorer.score(other, stored, mask) == scores
    assert Scorer(torch.ones(3), lpips=False).score(other, stored) != scores
    assert scorer.protocol_block()["masked"] is True
    assert "masked" not in Scorer(torch.ones(3), lpips=False).protocol_block()
