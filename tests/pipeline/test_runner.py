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


def _located_stage(folder: Path, calls: list[Attempt]) -> Stage:
    """A stage whose inputs and result name paths inside ``folder``."""

    def run(attempt: Attempt) -> dict[str, Any]:
        calls.append(attempt)
        (folder / "made").mkdir(exist_ok=True)
        return {"path": str(folder / "made"), "files": [str(folder / "made" / "a.png")], "output": "fp"}

    inputs = {"out": str(folder / "made"), "store": str(folder / "store")}
    return Stage("work", inputs, run, ["raykit", "work"], (folder / "made",))


def test_a_moved_folder_is_up_to_date_where_it_now_is(tmp_path: Path) -> None:
    calls: list[Attempt] = []
    first = tmp_path / "first"
    StageRunner(first, echo=lambda _: None).execute(_located_stage(first, calls))
    record = _record(first)
    assert record["result"]["path"] == "./made" and record["inputs"]["store"] == "./store"
    moved = first.rename(tmp_path / "moved")
    runner = StageRunner(moved, echo=lambda _: None)
    result = runner.execute(_located_stage(moved, calls))
    assert runner.ran == [] and len(calls) == 1  # up to date, not rerun
    assert result["path"] == str(moved / "made") and result["files"] == [str(moved / "made" / "a.png")]


def test_a_recorded_path_leading_out_of_the_folder_is_one_line(tmp_path: Path) -> None:
    from raykit.errors import ConfigError

    calls: list[Attempt] = []
    runner = StageRunner(tmp_path, echo=lambda _: None)
    runner.execute(_located_stage(tmp_path, calls))
    data = json.loads((tmp_path / "pipeline.json").read_text())
    data["stages"]["work"]["result"]["path"] = "./../../etc"
    (tmp_path / "pipeline.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"pipeline\.json: stage 'work': file name '\.\./\.\./etc'"):
        StageRunner(tmp_path, echo=lambda _: None).execute(_located_stage(tmp_path, calls))


def test_a_child_leads_its_own_process_group_and_dies_with_its_owner(tmp_path: Path) -> None:
    """A warm-started child is in its own session (killed as a group) and watches the process that
    started it, not its parent (the fork server): when that owner ends, the child ends."""
    import os
    import subprocess
    import sys
    import time

    script = tmp_path / "owner.py"
    script.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from raykit.pipeline import WarmStarter\n"
        "from raykit.pipeline.records import Meter\n"
        "from raykit.pipeline.runner import Attempt\n"
        "out = Path(sys.argv[1])\n"
        "def on_pid(pid):\n"
        "    (out / 'pid').write_text(str(pid))\n"
        "if __name__ == '__main__':\n"
        "    starter = WarmStarter(('json',))\n"
        "    starter.run('sleeper', [], Attempt(1, out / 'c.log', False, Meter(), on_pid))\n"
    )
    (tmp_path / "sleeper").mkdir()
    (tmp_path / "sleeper" / "__init__.py").write_text("")
    (tmp_path / "sleeper" / "__main__.py").write_text("import time\ndef main():\n    time.sleep(600)\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    owner = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    deadline = time.monotonic() + 120
    while not (tmp_path / "pid").is_file() or not (tmp_path / "pid").read_text():
        assert owner.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    child = int((tmp_path / "pid").read_text())
    while os.getsid(child) != child:  # the child's first act: its own session
        assert time.monotonic() < deadline, "the child never left its owner's session"
        time.sleep(0.05)
    assert os.getpgid(child) == child and os.getsid(owner.pid) != child
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 60
    while True:
        try:
            with open(f"/proc/{child}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        assert time.monotonic() < deadline, f"child {child} outlived its owner"
        time.sleep(0.05)
