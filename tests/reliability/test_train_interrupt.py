"""Ctrl-C during ``raykit train``: a prompt non-zero exit, and the resumed run ends with the same
weights as an uninterrupted one (docs/reliability.md)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import torch

from raykit.trainer import TrainConfig, train
from raykit.trainer.checkpoint import latest_checkpoint, load_checkpoint

from .conftest import build_store, subprocess_env
from .paused import start_paused

TINY: dict[str, Any] = {
    "steps": 8,
    "batch_size": 128,
    "levels": 2,
    "base_resolution": 8,
    "max_resolution": 16,
    "features": 2,
    "hidden": 16,
    "n_samples": 16,
    "sampler": "stratified",
    "log_every": 1,
    "ckpt_every": 2,
    "threads": 1,
    "device": "cpu",
    "eval_max_images": 1,
}


def _flags(config: TrainConfig) -> list[str]:
    flags = []
    for key, value in config.to_dict().items():
        if key == "store" or value is None:
            continue
        name = key.replace("_", "-")
        flags.append(
            f"--{name}" if value is True else f"--no-{name}" if value is False else f"--{name}={value}"
        )
    return flags


def _final(run: Path) -> dict[str, torch.Tensor]:
    path = latest_checkpoint(run)
    assert path is not None
    state: dict[str, torch.Tensor] = load_checkpoint(path)[1]["field"]
    return state


def test_ctrl_c_during_train_exits_promptly_and_resumes_exactly(tmp_path: Path) -> None:
    store = tmp_path / "store"
    build_store(store, "zarr")
    straight = train(TrainConfig(store=str(store), out=str(tmp_path / "straight"), **TINY))
    run = tmp_path / "run"
    config = TrainConfig(store=str(store), out=str(run), **TINY)
    # Ctrl-C once the first checkpoint is written (the child waits there for it: no race to lose)
    args = ["train", str(store), *_flags(config)]
    proc, first = start_paused(f"{run}/checkpoints/step-*", args, subprocess_env())
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    code = proc.wait(timeout=60)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert code == 130 and time.monotonic() - t0 < 10, stderr
    assert "raykit: interrupted" in stderr and "terminate called" not in stderr
    stopped = latest_checkpoint(run)
    assert stopped == Path(first) and int(stopped.name.split("-")[-1]) < TINY["steps"]
    resumed = train(config.replace(resume=True))
    losses = [json.loads(line)["loss"] for line in (resumed / "log.jsonl").read_text().splitlines()]
    expected = [json.loads(line)["loss"] for line in (straight / "log.jsonl").read_text().splitlines()]
    assert losses[-1] == expected[-1]
    a, b = _final(straight), _final(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
