"""Restarts on failure: torchrun --max-restarts 1, a rank SIGKILLed mid-run, the group resumes exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from raykit.trainer.checkpoint import latest_checkpoint, load_checkpoint
from raykit.trainer.elastic import gather_rank_states, rank_state
from raykit.trainer.runtime import Processes

from ..reliability.paused import paused_rank_env, wait_paused
from .test_train import config_flags, tiny_config

STEPS = 24


def _torchrun(store: Path, out: Path) -> list[str]:
    config = tiny_config(
        store, out, sampler="occupancy", steps=STEPS, ckpt_every=4, eval_max_images=1, resume=True
    )
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--max-restarts", "1", "--monitor-interval", "0.1",
        "-m", "raykit.trainer", str(store), *config_flags(config),
    ]  # fmt: skip


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _worker(parent: int, rank: int) -> int | None:
    """The pid of torchrun's first-attempt worker of ``rank`` (a child of the launcher), if running."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        env = _environ(int(entry.name))
        if ppid == parent and env.get("RANK") == str(rank) and env.get("TORCHELASTIC_RESTART_COUNT") == "0":
            return int(entry.name)
    return None


def _final(run: Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    path = latest_checkpoint(run)
    assert path is not None
    digests = [json.loads((run / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert all(d["step"] == STEPS for d in digests)
    return load_checkpoint(path)[1]["field"], [d["parameters_sha256"] for d in digests]


def _losses(run: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker through /proc")
def test_torchrun_restarts_a_killed_rank_and_resumes_exactly(tiny_store: Path, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # The uninterrupted reference runs meanwhile (its own rendezvous port; the store is only read).
    straight = subprocess.Popen(
        _torchrun(tiny_store, tmp_path / "straight"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip

    try:
        crashed, pause = tmp_path / "crashed", tmp_path / "pause"
        # Rank 0 pauses once it has written its first checkpoint (rank 1 then waits for it): the kill
        # lands mid-run, after that checkpoint, for certain.
        env = {
            **env,
            **paused_rank_env(pause, f"{crashed}/checkpoints/step-*", 0, os.environ.get("PYTHONPATH", "")),
        }
        launcher = subprocess.Popen(
            _torchrun(tiny_store, crashed),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        paused_at = wait_paused(pause, launcher)
        victim, killed_at = _worker(launcher.pid, rank=1), latest_checkpoint(crashed)
        assert victim is not None and killed_at == paused_at, (victim, killed_at, paused_at)
        os.kill(victim, signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=300)
        # The agent saw the worker die of SIGKILL, and the group still finished: it was restarted (with
        # no restart left, torchrun exits non-zero).
        assert f"exitcode: -9) local_rank: 1 (pid: {victim})" in stderr, stderr[-3000:]
        assert launcher.returncode == 0, stderr[-3000:]
        assert int(killed_at.name.split("-")[-1]) < STEPS  # killed mid-run
        _, straight_err = straight.communicate(timeout=300)
    finally:
        straight.kill()  # a no-op once it has ended
        straight.wait()
    assert straight.returncode == 0, straight_err[-3000:]

    weights, digests = _final(crashed)
    expected, expected_digests = _final(tmp_path / "straight")
    assert digests == expected_digests and digests[0] == digests[1]
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in weights)
    assert _losses(crashed) == _losses(tmp_path / "straight")
    assert [step for step, _ in _losses(crashed)] == list(range(1, STEPS + 1))


def test_rank_state_falls_back_to_rank_zero() -> None:
    states = {"jitter": "a", "jitter@rank1": "b"}
    assert [rank_state(states, "jitter", r) for r in (0, 1, 2)] == ["a", "b", "a"]
    assert gather_rank_states(Processes(0, 1, 0), {"jitter": "a"}) == {}  # single process: nothing to gather
