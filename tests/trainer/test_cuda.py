"""The CUDA path (bfloat16 autocast, the step against the CPU's, torch.compile); skipped without CUDA."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from raykit.loaders import image_rays
from raykit.trainer import TrainConfig, train
from raykit.trainer.evaluate import build_models
from raykit.trainer.loop import step_losses

from .test_train import tiny_config


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sampler", ["stratified", "hierarchical", "occupancy"])
def test_cuda_mixed_precision_run(tiny_store: Path, tmp_path: Path, sampler: str) -> None:
    run = train(tiny_config(tiny_store, tmp_path / sampler, sampler=sampler, device="cuda", threads=None))
    losses = [json.loads(line)["loss"] for line in (run / "log.jsonl").read_text().splitlines()]
    assert all(math.isfinite(loss) for loss in losses)
    info = json.loads((run / "run.json").read_text())
    assert info["environment"]["device"].startswith("cuda") and "gpu" in info["environment"]
    assert json.loads((run / "eval.json").read_text())["splits"]["test"]["n_images"] == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_run_exports_and_verifies_on_cuda_and_on_cpu(tiny_store: Path, tmp_path: Path) -> None:
    from raykit.trainer import export_run, verify_export

    run = train(tiny_config(tiny_store, tmp_path / "run", device="cuda", threads=None, steps=12))
    out = export_run(run, tmp_path / "model")
    assert verify_export(out)["difference_db"] <= 0.05  # on the run's device
    assert verify_export(out, device="cpu")["difference_db"] <= 0.05  # deployed on another device


def _step_gradients(
    config: TrainConfig, store: Any, device: torch.device
) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward and backward of the training step on ``device``: its loss and gradients (on the CPU)."""
    aabb = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0])
    field, grid = build_models(config, aabb, device)
    batch = image_rays(store, store.images("train")[0], device)
    background = torch.ones(3, device=device)
    _, total, _ = step_losses(config, field, field, grid, batch, background, 0, None)
    total.backward()
    modules = [("field", field)] + ([("grid", grid)] if grid is not None else [])
    grads = {
        f"{m}.{n}": p.grad.cpu()
        for m, module in modules
        for n, p in module.named_parameters()
        if p.grad is not None
    }
    return float(total.detach()), grads


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sampler", ["stratified", "hierarchical", "occupancy", "proposal"])
def test_cuda_step_matches_cpu_step(tiny_store: Path, tmp_path: Path, sampler: str) -> None:
    from raykit.store import open_store

    store = open_store(str(tiny_store))
    config = tiny_config(tiny_store, tmp_path, sampler=sampler, scene_space="box", mixed_precision=False)
    cpu_loss, cpu_grads = _step_gradients(config, store, torch.device("cpu"))
    gpu_loss, gpu_grads = _step_gradients(config, store, torch.device("cuda"))
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-4)
    assert set(gpu_grads) == set(cpu_grads)
    for name, grad in cpu_grads.items():
        torch.testing.assert_close(gpu_grads[name], grad, rtol=1e-3, atol=1e-6, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_compiled_field_trains_like_the_eager_one(tiny_store: Path, tmp_path: Path) -> None:
    def losses(run: Path) -> list[float]:
        return [json.loads(line)["loss"] for line in (run / "log.jsonl").read_text().splitlines()]

    changes = {"device": "cuda", "threads": None, "steps": 6, "log_every": 2, "mixed_precision": False}
    eager = train(tiny_config(tiny_store, tmp_path / "eager", **changes))
    compiled = train(tiny_config(tiny_store, tmp_path / "compiled", compile_field=True, **changes))
    assert losses(compiled) == pytest.approx(losses(eager), rel=1e-3)
