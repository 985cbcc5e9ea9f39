"""A killed sweep reruns only what had not finished: the finished run is not repeated, the interrupted
one resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SPEC = """
seeds = [0, 1]
[[captures]]
scene = "tiny"
"""


def test_sigkill_then_rerun_repeats_no_finished_run(
    tmp_path: Path, spec_writer: Any, sweep_cli: Any, start_sweep_cli: Any
) -> None:
    spec = spec_writer(tmp_path / "spec.toml", SPEC)
    text = spec.read_text().replace("steps = 6", "steps = 40").replace("ckpt_every = 3", "ckpt_every = 2")
    spec.write_text(text)
    out = tmp_path / "out"
    proc = start_sweep_cli(spec, out, "--jobs=1")
    deadline = time.monotonic() + 240

    def second_run_training() -> bool:
        rows = list((out / "runs").glob("*/row.json"))
        return len(rows) == 1 and any(
            p.parent.joinpath("train", "checkpoints").is_dir() and not p.parent.joinpath("row.json").exists()
            for p in (out / "runs").glob("*/pipeline.json")
        )

    while not second_run_training():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the second run never started"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (finished,) = (out / "runs").glob("*/row.json")
    before = finished.read_bytes()
    done = sweep_cli(spec, out, "--jobs=1")
    assert "1 finished before, 1 to run" in done.stdout
    assert finished.read_bytes() == before
    rows = {
        json.loads(p.read_text())["run_id"]: json.loads(p.read_text())
        for p in (out / "runs").glob("*/row.json")
    }
    assert len(rows) == 2 and all(r["status"] == "done" and r["steps"] == 40 for r in rows.values())
    resumed = next(p for p in (out / "runs").glob("*/pipeline.json") if p.parent != finished.parent)
    attempts = json.loads(resumed.read_text())["stages"]["train"]["attempts"]
    assert [a["resume"] for a in attempts] == [False, True]
    invocations = json.loads((out / "sweep.json").read_text())["invocations"]
    assert [inv["status"] for inv in invocations] == ["running", "done"]
    assert len(invocations[1]["ran"]) == 1 and len(invocations[1]["skipped"]) == 1
