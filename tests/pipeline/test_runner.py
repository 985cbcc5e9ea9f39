"""``StageRunner``: skip, redo and resume by fingerprint; retries for machine faults only."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from raykit.errors import SourceError
from raykit.pipeline import Stage, StageRunner
from raykit.pipeline.runner import Attempt


def _stage(out: Path, outcomes: list[BaseException | None], calls: list[Attempt], **inputs: Any) -> Stage:
    """A stage writing ``out/made``; its n-th run raises ``outcomes[n]`` (None: succeeds)."""

    def run(attempt: Attempt) -> dict[str, Any]:
        calls.append(attempt)
        (out / "made").mkdir(exist_ok=True)
        (out / "made" / f"attempt-{len(calls)}").write_text("x")
        outcome = outcomes[len(calls) - 1] if len(calls) <= len(outcomes) else None
        if outcome is not None:
            raise outcome
        return {"output": "fp", "calls": len(calls)}

    return Stage("work", {"option": 1, **inputs}, run, ["raykit", "work"], (out / "made",))


def _record(out: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((out / "pipeline.json").read_text())["stages"]["work"]
    return record


@pytest.mark.parametrize(
    "fault", [OSError(errno.EIO, "Input/output error"), MemoryError(), FileNotFoundError("gone")]
)
def test_a_machine_fault_is_retried_with_every_attempt_recorded(tmp_path: Path, fault: BaseException) -> None:
    calls: list[Attempt] = []
    result = StageRunner(tmp_path, retries=1, echo=lambda _: None).execute(_stage(tmp_path, [fault], calls))
    assert result["calls"] == 2 and [c.resume for c in calls] == [False, True]
    first, second = _record(tmp_path)["attempts"]
    assert first["status"] == "failed" and type(fault).__name__ in first["error"]
    assert type(fault).__name__ in (tmp_path / first["log"]).read_text()  # the traceback
    assert second["status"] == "done" and _record(tmp_path)["status"] == "done"


def test_bad_input_is_never_retried(tmp_path: Path) -> None:
    calls: list[Attempt] = []
    runner = StageRunner(tmp_path, retries=5, echo=lambda _: None)
    with pytest.raises(SourceError, match=r"capture\.json: no frames"):
        runner.execute(_stage(tmp_path, [SourceError("capture.json: no frames")], calls))
    assert len(calls) == 1 and _record(tmp_path)["status"] == "failed"


def test_retries_run_out(tmp_path: Path) -> None:
    calls: list[Attempt] = []
    faults: list[BaseException | None] = [OSError(errno.EIO, "I/O error")] * 3
    with pytest.raises(OSError, match="I/O error"):
        StageRunner(tmp_path, retries=2, echo=lambda _: None).execute(_stage(tmp_path, faults, calls))
    assert [a["status"] for a in _record(tmp_path)["attempts"]] == ["failed"] * 3


def test_up_to_date_is_skipped_and_a_change_starts_over(tmp_path: Path) -> None:
    calls: list[Attempt] = []
    StageRunner(tmp_path, echo=lambda _: None).execute(_stage(tmp_path, [], calls))
    again = StageRunner(tmp_path, echo=lambda _: None)
    assert again.execute(_stage(tmp_path, [], calls))["calls"] == 1 and again.ran == []
    assert len(calls) == 1
    changed = StageRunner(tmp_path, echo=lambda _: None)
    changed.execute(_stage(tmp_path, [], calls, option=2))
    assert changed.ran == ["work"] and not calls[-1].resume
    assert sorted(p.name for p in (tmp_path / "made").iterdir()) == ["attempt-2"]  # old outputs removed
    assert len(_record(tmp_path)["attempts"]) == 1


def test_an_interrupted_stage_resumes_in_place(tmp_path: Path) -> None:
    calls: list[Attempt] = []
    with pytest.raises(KeyboardInterrupt):
        StageRunner(tmp_path, echo=lambda _: None).execute(_stage(tmp_path, [KeyboardInterrupt()], calls))
    assert _record(tmp_path)["status"] == "interrupted"
    StageRunner(tmp_path, echo=lambda _: None).execute(_stage(tmp_path, [KeyboardInterrupt()], calls))
    assert calls[-1].resume and sorted(p.name for p in (tmp_path / "made").iterdir()) == [
        "attempt-1",
        "attempt-2",
    ]
    assert [a["status"] for a in _record(tmp_path)["attempts"]] == ["interrupted", "done"]


def test_a_warm_started_child_fails_as_a_fresh_one_would(tmp_path: Path) -> None:
    """``WarmStarter``: bad input is exit status 2 with the child's error line (not retried), a kill
    is the machine's fault; the log holds the child's output and its pid is reported."""
    import os
    import signal

    from raykit.pipeline import StageError, WarmStarter
    from raykit.pipeline.records import Meter

    starter = WarmStarter(("raykit.trainer.__main__",))
    pids: list[int] = []
    bad = Attempt(1, tmp_path / "bad.log", False, Meter(), pids.append)
    with pytest.raises(StageError) as info:
        starter.run("raykit.trainer", [str(tmp_path / "missing.zarr"), f"--out={tmp_path / 'run'}"], bad)
    assert not info.value.machine and "missing.zarr" in str(info.value) and "\n" not in str(info.value)
    assert bad.meter.child["exit_status"] == 2 and bad.meter.child["peak_rss_mb"] > 10
    assert "raykit: error:" in bad.log.read_text() and pids and pids[0] != os.getpid()

    def kill(pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    killed = Attempt(1, tmp_path / "killed.log", False, Meter(), kill)
    with pytest.raises(StageError) as info:
        starter.run("raykit.trainer", ["--help"], killed)
    assert info.value.machine and "signal 9" in str(info.value)
