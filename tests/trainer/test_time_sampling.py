"""``raykit train --ray-sampling temporal``: the loader's ISG-then-IST draws on a multi-view video store,
the schedule (``--ist-step``) passed to the loader and recorded, an exact resume across the switch, one
line for a store that cannot serve it, and the option through ``raykit run`` and sweep SPECs."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import raykit.cli
from raykit.errors import ConfigError
from raykit.trainer import train
from raykit.trainer.checkpoint import latest_checkpoint, load_checkpoint

from .test_train import _final_state, _log, tiny_config

STEPS = {"steps": 24, "ckpt_every": 8, "log_every": 4, "features": 4}  # checkpoints at 8, 16, 24
SWITCH = 20  # ISG for steps 0-19: a resume from step 16 draws across the switch


@pytest.fixture(scope="module")
def video(n3dv: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The built-in dynamic scene's Neural 3D Video capture in the images layout, with and without
    the ISG/IST weights (``rays``: the rays-layout store of the capture)."""
    from raykit.converters import convert
    from raykit.converters.weights import add_temporal_weights
    from raykit.temporal_weights import TemporalWeightsConfig

    root = tmp_path_factory.mktemp("time_sampling")
    bare = root / "bare.zarr"
    convert(n3dv["capture"], bare, layout="images", chunk_rays=1024)
    weighted = root / "weighted.zarr"
    shutil.copytree(bare, weighted)
    add_temporal_weights(weighted, TemporalWeightsConfig(shift=2, factor=2))
    return {"weighted": weighted, "bare": bare, "rays": Path(n3dv["store"].url)}


def _loader_state(run: Path) -> dict[str, Any]:
    path = latest_checkpoint(run)
    assert path is not None
    return load_checkpoint(path)[0].loader_state


def test_temporal_sampling_is_recorded_and_resumes_exactly_across_the_switch(
    video: dict[str, Path], tmp_path: Path
) -> None:
    config = tiny_config(video["weighted"], tmp_path / "straight", ray_sampling="temporal", ist_step=SWITCH,
                         **STEPS)  # fmt: skip
    straight = train(config)
    record = json.loads((straight / "run.json").read_text())["ray_sampling"]
    assert record["name"] == "temporal" and record["reweight"] is False and record["ist_step"] == SWITCH
    assert record["weights_factor"] == 2 and record["weights_source"]["shift"] == 2
    assert "IST from step 20" in record["schedule"]
    assert _loader_state(straight)["temporal_sampling"]["ist_step"] == SWITCH  # the loader's schedule
    short = {**STEPS, "steps": 8}  # other rays from the first batch on: by uniform draws, by IST's weights
    uniform = train(tiny_config(video["weighted"], tmp_path / "uniform", **short))
    ist = train(config.replace(out=str(tmp_path / "ist"), ist_step=0, steps=8))
    losses = [r["loss"] for r in _log(straight)]
    assert losses[:2] != [r["loss"] for r in _log(uniform)] and losses[:2] != [r["loss"] for r in _log(ist)]

    resumed = tmp_path / "resumed"  # the straight run as a crash after step 16 would have left it
    shutil.copytree(straight, resumed)
    newest = latest_checkpoint(resumed)
    assert newest is not None and newest.name.endswith("24")
    shutil.rmtree(newest)
    train(config.replace(out=str(resumed), resume=True))
    assert [r["loss"] for r in _log(resumed)] == losses
    a, b = _final_state(straight), _final_state(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_switch_counts_granules_under_a_sample_budget(video: dict[str, Path], tmp_path: Path) -> None:
    run = train(tiny_config(video["weighted"], tmp_path / "budget", ray_sampling="temporal", ist_step=5,
                            samples_per_step=2000, budget_granule=64, steps=2))  # fmt: skip
    assert _loader_state(run)["temporal_sampling"]["ist_step"] == 10  # 5 steps of 128 rays: 10 granules


@pytest.mark.parametrize(
    ("store", "needle"),
    [
        ("bare", "lacks: run `raykit add-component {store} temporal`"),
        ("rays", "draws from an images-layout store (split 'train' is pre-shuffled rays)"),
    ],
)
def test_a_store_that_cannot_serve_it_is_one_line(
    video: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], store: str, needle: str
) -> None:
    out = tmp_path / "run"
    argv = ["train", str(video[store]), "--out", str(out), "--ray-sampling", "temporal", "--steps", "2"]
    assert raykit.cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raykit: error: ")
    assert needle.format(store=video[store]) in err[0]
    assert not out.exists()  # nothing half-written
    with pytest.raises(ConfigError, match="--ist-step"):
        tiny_config(video["weighted"], out, ist_step=-1)


def test_raykit_run_and_sweep_specs_carry_it(
    n3dv: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from raykit.pipeline import config as run_config
    from raykit.pipeline.stages import train_argv
    from raykit.sweep import load_spec

    parser = argparse.ArgumentParser()
    run_config.add_arguments(parser)
    args = parser.parse_args(["store", "out", "--ray-sampling", "temporal", "--ist-step", "300"])
    train_config = run_config.from_args(args).train
    assert (train_config.ray_sampling, train_config.ist_step) == ("temporal", 300)
    argv = train_argv(train_config.replace(store="s", out="o"))
    assert "--ray-sampling=temporal" in argv and "--ist-step=300" in argv
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[train]\nist_step = 100\n[grid]\nray_sampling = ["uniform", "temporal"]\n'
        '[[captures]]\nscene = "tiny"\n'
    )
    pairs = [(c.train.ray_sampling, c.train.ist_step) for c in load_spec(spec).configs]
    assert pairs == [("uniform", 100), ("temporal", 100)]
    # A capture is refused before it is converted: the weights need a store made for them.
    argv = ["run", str(n3dv["capture"]), str(tmp_path / "run"), "--ray-sampling", "temporal"]
    assert raykit.cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "`raykit add-component STORE temporal`, then give STORE as SRC" in err[0]
    assert not (tmp_path / "run" / "store").exists()
