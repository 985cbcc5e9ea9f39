"""``raykit run --nproc-per-node 2``: training through torchrun; a killed rank is restarted elastically."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from raykit.trainer.checkpoint import latest_checkpoint

from ..reliability.paused import paused_rank_env, wait_paused

ROOT = Path(__file__).resolve().parents[2]


def _worker(parent: int, rank: int) -> int | None:
    """The pid of torchrun's first-attempt worker of ``rank`` (a child of the launcher), if running."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            raw = (entry / "environ").read_bytes().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
        if ppid == parent and env.get("RANK") == str(rank) and env.get("TORCHELASTIC_RESTART_COUNT") == "0":
            return int(entry.name)
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the rank's process through /proc")
def test_a_killed_rank_is_restarted_by_torchrun(start_raykit: Any, tiny_scene: Path, tmp_path: Path) -> None:
    out, pause = tmp_path / "out", tmp_path / "pause"
    run_dir = out / "runs" / "occupancy"
    # Rank 0 pauses once it has written its first checkpoint (rank 1 then waits for it): the kill
    # lands mid-run, after that checkpoint, for certain.
    env = paused_rank_env(pause, f"{run_dir}/checkpoints/step-*", 0, str(ROOT))
    proc = start_raykit(
        tiny_scene,
        out,
        "--samplers=occupancy",
        "--steps=40",
        "--nproc-per-node=2",
        "--max-restarts=1",
        env=env,
    )
    paused_at = wait_paused(pause, proc)
    attempt = json.loads((out / "pipeline.json").read_text())["stages"]["train-occupancy"]["attempts"][-1]
    victim = _worker(attempt["pid"], rank=1)
    assert victim is not None and latest_checkpoint(run_dir) == paused_at, (victim, paused_at)
    os.kill(victim, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    record = json.loads((out / "pipeline.json").read_text())["stages"]["train-occupancy"]
    assert record["command"][1:4] == ["-m", "torch.distributed.run", "--standalone"]
    (attempt,) = record["attempts"]  # torchrun restarted the group itself: one attempt of the stage
    assert f"exitcode: -9) local_rank: 1 (pid: {victim})" in (out / attempt["log"]).read_text()
    digests = [json.loads((run_dir / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [d["step"] for d in digests] == [40, 40]
    assert digests[0]["parameters_sha256"] == digests[1]["parameters_sha256"]
    steps = [json.loads(line)["step"] for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(2, 41, 2))  # every logged step once, none lost to the restart
