"""End-to-end runs on a tiny real store: run directory, samplers, time budget, exact resume, refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import raykit
from raykit.errors import ConfigError, ResumeError
from raykit.trainer import TrainConfig, train
from raykit.trainer.checkpoint import latest_checkpoint, load_checkpoint
from raykit.trainer.defaults import DEFAULT_REASONS, DEFAULT_STEPS, UNLIMITED_STEPS, resolve_steps

from ..reliability.paused import start_paused

TINY = {
    "steps": 8,
    "batch_size": 128,
    "levels": 2,
    "base_resolution": 8,
    "max_resolution": 16,
    "features": 2,
    "hidden": 16,
    "n_samples": 24,
    "hier_coarse": 12,
    "hier_fine": 12,
    "hier_anneal_steps": 4,
    "occ_resolution": 16,
    "occ_update_every": 3,
    "occ_warmup_steps": 4,
    "march_steps": 48,
    "log_every": 1,
    "ckpt_every": 4,
    "threads": 1,
    "device": "cpu",
}


def tiny_config(store: Path, out: Path, **changes: Any) -> TrainConfig:
    return TrainConfig(store=str(store), out=str(out), **{**TINY, **changes})


def config_flags(config: TrainConfig) -> list[str]:
    """The command-line flags that reproduce ``config`` (without the positional store)."""
    flags = []
    for key, value in config.to_dict().items():
        name = key.replace("_", "-")
        if key == "store" or value is None:
            continue
        flags.append(
            f"--{name}" if value is True else f"--no-{name}" if value is False else f"--{name}={value}"
        )
    return flags


def _log(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def _final_state(run: Path) -> dict[str, torch.Tensor]:
    path = latest_checkpoint(run)
    assert path is not None
    return load_checkpoint(path)[1]["field"]


def test_run_directory_records_everything(tiny_store: Path, tmp_path: Path) -> None:
    run = train(tiny_config(tiny_store, tmp_path / "run", sampler="stratified"))
    config = TrainConfig.from_dict(json.loads((run / "config.json").read_text()))
    expected = tiny_config(tiny_store, tmp_path / "run", sampler="stratified")
    assert config == expected.replace(scene_space="box", background="white", field="static")  # auto, resolved
    info = json.loads((run / "run.json").read_text())
    assert info["store_fingerprint"] == raykit.open_store(str(tiny_store)).fingerprint
    assert info["raykit_version"] == raykit.__version__ and info["seed"] == 0
    assert {"python", "torch", "platform", "device"} <= set(info["environment"])
    assert set(DEFAULT_REASONS) == {f.name for f in dataclasses.fields(TrainConfig)}  # every default: why
    defaults = info["defaults"]  # why each default the run kept is what it is; not those it set
    assert defaults["lr"] == {"value": 1e-2, "why": DEFAULT_REASONS["lr"]} and defaults["lr"]["why"]
    assert "sampler" not in defaults and "steps" not in defaults and "store" not in defaults
    assert info["sampler"]["reason"] == "chosen with --sampler"
    records = _log(run)
    assert [r["step"] for r in records] == list(range(1, 9))
    for key in (
        "loss",
        "psnr",
        "rays_per_s",
        "samples_per_ray",
        "loader_wait_fraction",
        "step_time_s",
        "peak_memory_mb",
    ):
        assert all(r[key] >= 0 for r in records), key
    assert all(0 <= r["loader_wait_fraction"] <= 1 for r in records)
    result = json.loads((run / "eval.json").read_text())
    test = result["splits"]["test"]
    assert result["step"] == 8 and test["n_images"] == 2 and len(test["images"]) == 2
    assert test["psnr"] == pytest.approx(sum(i["psnr"] for i in test["images"]) / 2)
    assert 0 < test["ssim"] <= 1
    assert len(list((run / "renders" / "test").glob("*.png"))) == 2


@pytest.mark.parametrize("sampler", ["stratified", "hierarchical", "occupancy", "proposal"])
def test_samplers_reduce_the_loss(tiny_store: Path, tmp_path: Path, sampler: str) -> None:
    run = train(tiny_config(tiny_store, tmp_path / sampler, sampler=sampler, steps=40, lr=3e-2))
    losses = [r["loss"] for r in _log(run)]
    assert sum(losses[-5:]) < sum(losses[:5])
    assert all(r["samples_per_ray"] > 0 for r in _log(run))


def test_same_seed_same_run_different_seed_different_run(tiny_store: Path, tmp_path: Path) -> None:
    a = train(tiny_config(tiny_store, tmp_path / "a", sampler="hierarchical", steps=4))
    b = train(tiny_config(tiny_store, tmp_path / "b", sampler="hierarchical", steps=4))
    c = train(tiny_config(tiny_store, tmp_path / "c", sampler="hierarchical", steps=4, seed=1))
    assert [r["loss"] for r in _log(a)] == [r["loss"] for r in _log(b)]
    assert [r["loss"] for r in _log(a)] != [r["loss"] for r in _log(c)]


def test_time_budget_stops_then_evaluates(tiny_store: Path, tmp_path: Path) -> None:
    config = tiny_config(
        tiny_store,
        tmp_path / "t",
        steps=100000,
        max_seconds=1.0,
        log_every=1,
        progress_every_s=0.4,
        progress_images=1,
    )
    run = train(config)
    log = _log(run)
    times = [r["elapsed_s"] for r in log]
    assert [r["step"] for r in log] == list(range(1, len(log) + 1)) and len(log) < 100000
    # it stops at the first step whose training time reaches the budget (the recorded clock, no wall clock)
    assert all(t < 1.0 for t in times[:-1]) and times[-1] >= 1.0
    assert (run / "eval.json").is_file()
    progress = [json.loads(line) for line in (run / "progress.jsonl").read_text().splitlines()]
    # a quick check at each step that crossed a multiple of 0.4 s of training time, and at the end
    crossed = [
        r["step"]
        for r, before in zip(log, [0.0, *times], strict=False)
        if r["elapsed_s"] // 0.4 > before // 0.4
    ]
    assert [p["step"] for p in progress] == sorted({*crossed, log[-1]["step"]}) and crossed  # 1.0 s > 0.4 s
    assert all(p["n_images"] == 1 and p["psnr"] > 0 for p in progress)


@pytest.mark.parametrize("sampler", ["hierarchical", "occupancy"])
def test_resume_after_sigkill_is_exact(tiny_store: Path, tmp_path: Path, sampler: str) -> None:
    straight = train(tiny_config(tiny_store, tmp_path / "straight", sampler=sampler, ckpt_every=2))
    crashed = tmp_path / "crashed"
    config = tiny_config(tiny_store, crashed, sampler=sampler, ckpt_every=2)
    # killed once its first checkpoint is written (the child waits there: no race to lose)
    args = ["train", str(tiny_store), *config_flags(config)]
    proc, first = start_paused(f"{crashed}/checkpoints/step-*", args, os.environ.copy())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = latest_checkpoint(crashed)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    assert killed_at == Path(first) and int(killed_at.name.split("-")[-1]) < 8  # killed mid-run
    resumed = train(config.replace(resume=True))
    assert [r["step"] for r in _log(resumed)] == list(range(1, 9))
    assert [r["loss"] for r in _log(resumed)] == [r["loss"] for r in _log(straight)]
    a, b = _final_state(straight), _final_state(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_different_store_unless_forced(
    tiny_store: Path, other_store: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    train(tiny_config(tiny_store, run, steps=4))
    with pytest.raises(ResumeError, match="fingerprint"):
        train(tiny_config(other_store, run, steps=8, resume=True))
    with pytest.raises(ResumeError, match="config sampler"):
        train(tiny_config(tiny_store, run, steps=4, resume=True, sampler="stratified"))
    with pytest.raises(ConfigError, match="already holds checkpoints"):
        train(tiny_config(tiny_store, run, steps=4))
    train(tiny_config(other_store, run, steps=6, resume=True, force=True))
    assert _log(run)[-1]["step"] == 6


def test_adam_eps_reaches_the_optimizer(tiny_store: Path, tmp_path: Path) -> None:
    """Adam steps with the default epsilon (1e-8, not 1e-15) or the one asked for; the checkpoint says."""
    for name, changes, eps in (("default", {}, 1e-8), ("asked", {"adam_eps": 1e-6}, 1e-6)):
        run = train(tiny_config(tiny_store, tmp_path / name, sampler="stratified", steps=4, **changes))
        path = latest_checkpoint(run)
        assert path is not None
        groups = load_checkpoint(path)[1]["optimizer"]["param_groups"]
        assert [group["eps"] for group in groups] == [eps]


def test_steps_default_to_5000_or_to_the_time_budget() -> None:
    """Unset --steps: 5000 steps, or no step limit under --max-seconds (a 300 s budget is trained in
    full however fast the machine); set, it is kept (and with a budget, whichever comes first)."""
    assert TrainConfig().steps is None
    config, why = resolve_steps(TrainConfig())
    assert config.steps == DEFAULT_STEPS == 5000 and "5000" in why
    config, why = resolve_steps(TrainConfig(max_seconds=300))
    assert config.steps == UNLIMITED_STEPS and "no step limit" in why
    config, why = resolve_steps(TrainConfig(steps=40, max_seconds=300))
    assert config.steps == 40 and why == "chosen with --steps"


def test_a_time_budget_without_steps_is_not_cut_at_5000_steps(tiny_store: Path, tmp_path: Path) -> None:
    run = train(tiny_config(tiny_store, tmp_path / "run", sampler="stratified", steps=None, max_seconds=3))
    info = json.loads((run / "run.json").read_text())
    assert info["steps"] == {"steps": UNLIMITED_STEPS, "reason": info["steps"]["reason"]}
    assert "no step limit" in info["steps"]["reason"]
    assert json.loads((run / "config.json").read_text())["steps"] == UNLIMITED_STEPS
    assert 1 <= _log(run)[-1]["step"] < UNLIMITED_STEPS
