"""``--logger tensorboard``: real event files, read back with TensorBoard's own event reader."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

import raykit.recorder
from raykit.errors import ConfigError
from raykit.trainer import train
from raykit.trainer.checkpoint import list_checkpoints
from raykit.trainer.logging_tb import TensorBoardLog
from raykit.trainer.steptime import PHASES

from .test_train import tiny_config

EventAccumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator"
).EventAccumulator

SCALARS = ("loss", "psnr", "lr", "rays_per_s", "samples_per_ray", "loader_wait_fraction", "peak_memory_mb")


def _events(run: Path) -> EventAccumulator:
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return events


def _log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_tensorboard_scalars_and_test_view(tiny_store: Path, tmp_path: Path) -> None:
    run = train(tiny_config(tiny_store, tmp_path / "run", logger="tensorboard", steps=6, log_every=2))
    events = _events(run)
    tags = events.Tags()
    assert {f"train/{key}" for key in SCALARS} <= set(tags["scalars"])
    assert {"time/data", "time/compute"} <= set(tags["scalars"])  # no phases timed unless recording
    records = _log(run)
    for key in SCALARS:
        scalars = events.Scalars(f"train/{key}")
        assert [s.step for s in scalars] == [2, 4, 6]  # steps increasing, one event per log record
        assert [s.value for s in scalars] == pytest.approx([r[key] for r in records], rel=1e-6)
    assert records[0]["lr"] == pytest.approx(1e-2 * (1e-3 / 1e-2) ** (1 / 6))  # the rate of step 1 (2nd)
    (tag,) = tags["images"]
    assert tag == "test/ball_010.png"
    images = events.Images(tag)
    assert [im.step for im in images] == [2, 6]  # the first record and the end of training
    assert (images[0].width, images[0].height) == (24, 12)  # prediction beside target
    with raykit.recorder.recording() as recorder:  # every phase timed, the device synchronised at each
        plain = train(tiny_config(tiny_store, tmp_path / "plain", steps=6, log_every=2))
    phases = set(PHASES)
    assert set(recorder.seconds["train"]) == phases and all(v > 0 for v in recorder.seconds["train"].values())
    assert all(set(r["seconds"]) == phases for r in _log(plain))
    assert [r["loss"] for r in _log(plain)] == [r["loss"] for r in records]  # monitoring changes nothing


def test_resume_hides_the_events_after_the_checkpoint(tiny_store: Path, tmp_path: Path) -> None:
    run = train(tiny_config(tiny_store, tmp_path / "run", logger="tensorboard", steps=8, ckpt_every=4))
    shutil.rmtree(list_checkpoints(run)[-1])  # as if the run had died after its step-4 checkpoint
    train(tiny_config(tiny_store, run, logger="tensorboard", steps=8, ckpt_every=4, resume=True))
    loss = _events(run).Scalars("train/loss")
    assert [s.step for s in loss] == list(range(1, 9))
    assert [s.value for s in loss] == pytest.approx([r["loss"] for r in _log(run)], rel=1e-6)


def test_image_cadence_follows_the_clock(tmp_path: Path) -> None:
    now = [0.0]
    view = ("v", torch.zeros(2, 3, 3), torch.ones(2, 3, 3))
    log = TensorBoardLog(tmp_path / "tb", lambda: view, image_every_s=180.0, clock=lambda: now[0])
    for step, seconds in enumerate((0.0, 100.0, 200.0, 250.0, 390.0, 400.0), start=1):
        now[0] = seconds
        log.write({"step": step, "loss": 1.0 / step})
    log.finish(6)
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    events.Reload()
    assert [im.step for im in events.Images("test/v")] == [1, 3, 5, 6]  # t = 0, 200, 390; the end


def test_jsonl_is_the_default_and_missing_tensorboard_is_a_config_error(
    tiny_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = train(tiny_config(tiny_store, tmp_path / "plain", steps=2))
    assert not (run / "tensorboard").exists()
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"tensorboard package is not installed; pip install tensorboard"):
        train(tiny_config(tiny_store, tmp_path / "tb", logger="tensorboard", steps=2))
    assert not (tmp_path / "tb").exists()
    with pytest.raises(ConfigError, match="logger: expected one of jsonl, tensorboard"):
        tiny_config(tiny_store, tmp_path / "x", logger="wandb")
