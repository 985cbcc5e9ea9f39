"""The CUDA path (bfloat16 autocast for the field); skipped where CUDA is not available."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from raykit.trainer import train

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
