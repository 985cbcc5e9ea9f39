"""Config <-> flags, CLI subcommands, checkpoint atomicity, DDP with two real gloo processes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from raykit.errors import ConfigError, ResumeError
from raykit.trainer.checkpoint import (
    CheckpointMeta,
    check_resumable,
    decode_rng_state,
    encode_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from raykit.trainer.cli import register
from raykit.trainer.config import TrainConfig, add_arguments, from_args

from .test_train import TINY, config_flags, tiny_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raykit")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_every_field_is_a_flag_with_help_and_round_trips() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    helps = {a.dest: a.help for a in parser._actions if a.dest != "help"}
    assert set(helps) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert all(helps.values())
    config = from_args(
        parser.parse_args(
            [
                "s",
                "--out",
                "o",
                "--sampler",
                "hierarchical",
                "--max-seconds",
                "3",
                "--no-mixed-precision",
                "--resume",
                "--eval-max-images",
                "2",
            ]
        )
    )
    assert config == TrainConfig(
        store="s",
        out="o",
        sampler="hierarchical",
        max_seconds=3.0,
        mixed_precision=False,
        resume=True,
        eval_max_images=2,
    )
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(SystemExit):
        parser.parse_args(["s"])  # --out is required


def test_invalid_config_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="sampler"):
        TrainConfig(store="s", out="o", sampler="random")
    with pytest.raises(ConfigError, match="batch-size"):
        TrainConfig(store="s", out="o", batch_size=0)
    with pytest.raises(ConfigError, match="unknown"):
        TrainConfig.from_dict({"store": "s", "out": "o", "bogus": 1})


def _meta(step: int) -> CheckpointMeta:
    return CheckpointMeta(step, {"seed": 0}, {"batch": step}, {}, "fp", "0.1.0")


def test_checkpoints_are_atomic_and_pruned(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, _meta(step), {"w": torch.full((3,), float(step))}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    # a lambda does not pickle: AttributeError for a local object (Python 3.11), PicklingError otherwise
    with pytest.raises((pickle.PicklingError, AttributeError), match=r"pickle|Can't"):
        save_checkpoint(tmp_path, _meta(4), {"w": lambda: None}, keep=2)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-00000003"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002", "step-00000003"]
    meta, tensors = load_checkpoint(tmp_path / "checkpoints" / "step-00000003")
    assert meta == _meta(3) and torch.equal(tensors["w"], torch.full((3,), 3.0))


def test_rng_state_round_trip_and_resume_checks() -> None:
    g = torch.Generator().manual_seed(5)
    text = encode_rng_state(g)
    first = torch.rand(4, generator=g)
    g2 = torch.Generator()
    g2.set_state(decode_rng_state(text))
    assert torch.equal(torch.rand(4, generator=g2), first)
    meta = CheckpointMeta(1, {"seed": 0, "out": "a"}, {}, {}, "fp", "0.1.0")
    check_resumable(meta, "fp", {"seed": 0, "out": "b"}, False, "ckpt")
    with pytest.raises(ResumeError, match="config seed: checkpoint has 0, got 1"):
        check_resumable(meta, "fp", {"seed": 1, "out": "a"}, False, "ckpt")
    check_resumable(meta, "other", {"seed": 1}, True, "ckpt")


def test_render_and_compare_subcommands(
    tiny_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = _parser()
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    for name, sampler in (("a", "stratified"), ("b", "occupancy")):
        args = parser.parse_args(
            [
                "train",
                str(tiny_store),
                "--out",
                str(tmp_path / name),
                "--sampler",
                sampler,
                "--steps",
                "4",
                *flags[1:],
            ]
        )
        assert args.func(args) == 0
    before = json.loads((tmp_path / "a" / "eval.json").read_text())["splits"]["test"]
    args = parser.parse_args(["render", str(tmp_path / "a"), "--split", "train"])
    assert args.func(args) == 0
    after = json.loads((tmp_path / "a" / "eval.json").read_text())["splits"]
    assert after["test"] == before and after["train"]["n_images"] == 10
    capsys.readouterr()
    args = parser.parse_args(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    assert args.func(args) == 0
    rows = json.loads(capsys.readouterr().out)
    psnr = next(r for r in rows if r["split"] == "test" and r["metric"] == "psnr")
    assert psnr["delta"] == pytest.approx(psnr["b"] - psnr["a"])
    with pytest.raises(ResumeError, match="no checkpoint"):
        args = parser.parse_args(["render", str(tmp_path / "nothing")])
        args.func(args)


@pytest.mark.parametrize("sampler", ["occupancy", pytest.param("proposal", marks=pytest.mark.slow)])
def test_ddp_two_gloo_processes_keep_parameters_identical(
    tiny_store: Path, tmp_path: Path, sampler: str
) -> None:
    """Two gloo ranks end with identical models; with the proposal sampler the proposal networks
    (outside DDP, gradients averaged by hand) are identical too."""
    config = tiny_config(tiny_store, tmp_path / "ddp", sampler=sampler, steps=4, eval_max_images=1)
    args = config_flags(config)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "raykit.trainer",
        str(tiny_store),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / "ddp" / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 4
    assert ranks[0]["parameters_sha256"] == ranks[1]["parameters_sha256"]
    if sampler == "proposal":
        assert ranks[0]["proposal_sha256"] == ranks[1]["proposal_sha256"]
    single = tiny_config(tiny_store, tmp_path / "single", sampler=sampler, steps=4, eval_max_images=1)
    from raykit.trainer import train

    train(single)
    one = json.loads((tmp_path / "single" / "ranks" / "rank-0.json").read_text())
    assert one["parameters_sha256"] != ranks[0]["parameters_sha256"]  # the two ranks saw different rays
    assert json.loads((tmp_path / "ddp" / "run.json").read_text())["environment"]["world_size"] == 2
