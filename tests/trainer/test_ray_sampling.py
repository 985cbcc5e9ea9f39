"""``raykit train --ray-sampling loss``: the loader's loss sampling stage fed by the step's per-ray
losses, recorded in run.json, and resumed exactly after SIGKILL (the maps are in the checkpoint)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import torch
from PIL import Image

from raykit.trainer import train
from raykit.trainer.checkpoint import latest_checkpoint

from ..reliability.paused import start_paused
from .test_train import _final_state, _log, config_flags, tiny_config

STEPS = {"steps": 72, "ckpt_every": 36, "log_every": 4}  # past the map's first rebuild (batch 64)


def test_loss_sampling_is_recorded_and_resumes_exactly(tiny_store: Path, tmp_path: Path) -> None:
    straight = train(tiny_config(tiny_store, tmp_path / "straight", ray_sampling="loss", **STEPS))
    record = json.loads((straight / "run.json").read_text())
    assert record["ray_sampling"] == {"name": "loss", "reweight": False}
    with Image.open(straight / "sampling_map.png") as figure:  # the views beside their maps
        assert figure.size[0] > 300 and figure.size[1] > 200
    uniform = train(tiny_config(tiny_store, tmp_path / "uniform", **STEPS))
    assert [r["loss"] for r in _log(uniform)] != [r["loss"] for r in _log(straight)]  # other rays
    assert not (uniform / "sampling_map.png").exists()
    crashed = tmp_path / "crashed"
    config = tiny_config(tiny_store, crashed, ray_sampling="loss", **STEPS)
    args = ["train", str(tiny_store), *config_flags(config)]
    proc, first = start_paused(f"{crashed}/checkpoints/step-*", args, os.environ.copy())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert latest_checkpoint(crashed) == Path(first)
    resumed = train(config.replace(resume=True))
    assert [r["loss"] for r in _log(resumed)] == [r["loss"] for r in _log(straight)]
    a, b = _final_state(straight), _final_state(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
