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
