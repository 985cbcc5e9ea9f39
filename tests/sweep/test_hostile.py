"""Careless and hostile inputs to ``raykit sweep``: each one line and exit 2 before anything is
converted, or the correct result; nothing the sweep did not write is touched."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raykit.errors import ConfigError
from raykit.sweep import load_spec

SCENE = '\n[[captures]]\nscene = "tiny"\n'


def _error_line(done: Any) -> str:
    """The one ``raykit: error:`` line of a refused command (exit 2, no traceback)."""
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raykit: error: "), done.stderr[-2000:]
    return str(lines[0])


@pytest.mark.parametrize("name", ["report.md", "report.html", "results.csv"])
def test_a_folder_holding_the_users_files_is_refused_and_untouched(
    tmp_path: Path, spec_writer: Any, sweep_in_process: Any, name: str
) -> None:
    spec = spec_writer(tmp_path / "spec.toml", SCENE)
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("the user's own notes\n")
    line = _error_line(sweep_in_process(spec, out, check=False))
    assert str(out) in line and "not a raykit sweep folder" in line
    assert [p.name for p in out.iterdir()] == [name]
    assert (out / name).read_text() == "the user's own notes\n"


def test_a_huge_grid_is_refused_with_its_count_before_enumeration(
    tmp_path: Path, spec_writer: Any, sweep_in_process: Any
) -> None:
    fields = ["hidden", "levels", "features", "n_samples", "batch_size", "base_resolution",
              "max_resolution", "hier_coarse", "hier_fine", "march_steps"]  # fmt: skip
    grid = "\n[grid]\n" + "".join(f"{f} = {list(range(16, 26))}\n" for f in fields)
    spec = spec_writer(tmp_path / "spec.toml", SCENE + grid, train="")
    with pytest.raises(ConfigError, match=r"= 10000000000 runs, more than the 10000"):
        load_spec(spec)  # 10^10 configurations: enumerated, this would never return
    line = _error_line(sweep_in_process(spec, tmp_path / "out", check=False))
    assert "1 captures x 10000000000 configurations x 1 seeds = 10000000000 runs" in line
    assert not (tmp_path / "out").exists()


def test_seeds_are_checked_linearly_and_for_the_trainers_range(tmp_path: Path, spec_writer: Any) -> None:
    many = list(range(200_000))
    spec = spec_writer(tmp_path / "a.toml", f"seeds = {[*many, 199_999]}" + SCENE)
    with pytest.raises(ConfigError, match="seed 199999 listed twice"):
        load_spec(spec)  # a quadratic check: 2 * 10^10 comparisons
    spec = spec_writer(tmp_path / "b.toml", f"seeds = {many}" + SCENE)
    with pytest.raises(ConfigError, match="200000 seeds = 200000 runs"):
        load_spec(spec)
    for seed in (2**63, 2**62, -1):
        spec = spec_writer(tmp_path / "c.toml", f"seeds = [0, {seed}]" + SCENE)
        with pytest.raises(ConfigError, match=rf"seeds: seed {seed} out of range"):
            load_spec(spec)


def test_an_unreachable_scheduler_stops_before_any_conversion(
    tmp_path: Path, spec_writer: Any, sweep_cli: Any
) -> None:
    spec = spec_writer(tmp_path / "spec.toml", SCENE)
    line = _error_line(sweep_cli(spec, tmp_path / "out", "--scheduler=tcp://127.0.0.1:1", check=False))
    assert "--scheduler tcp://127.0.0.1:1: cannot connect" in line
    assert not (tmp_path / "out").exists()


def test_a_tracking_uri_without_scheme_is_one_line(
    tmp_path: Path, spec_writer: Any, sweep_in_process: Any
) -> None:
    spec = spec_writer(tmp_path / "spec.toml", SCENE)
    flags = ["--tracking=mlflow", "--tracking-uri=localhost:5000"]
    done = sweep_in_process(spec, tmp_path / "out", *flags, check=False)
    assert "--tracking-uri: expected a URI with its scheme" in _error_line(done)
    assert not (tmp_path / "out").exists()


@pytest.fixture
def failing_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on loopback that answers 503 (``/health`` 200 when ``healthy`` holds "yes")."""
    healthy: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/health" and healthy
            self.send_response(200 if ok else 503)
            self.end_headers()
            self.wfile.write(b"OK" if ok else b"unavailable")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", healthy
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("health", ["", "yes"])
def test_a_tracking_server_answering_503_stops_before_any_conversion(
    tmp_path: Path, spec_writer: Any, sweep_cli: Any, failing_server: tuple[str, list[str]], health: str
) -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    url, healthy = failing_server
    healthy.extend([health] if health else [])
    spec = spec_writer(tmp_path / "spec.toml", SCENE)
    done = sweep_cli(spec, tmp_path / "out", "--tracking=mlflow", f"--tracking-uri={url}", check=False)
    line = _error_line(done)
    assert f"--tracking-uri {url}: tracking server not reachable (HTTP 503" in line
    assert not (tmp_path / "out").exists()


def _copy(local_sweep: tuple[Path, Path], tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(local_sweep[1], out, symlinks=True)
    return out


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("sweep.json", "[1, 2]", "not a sweep record (expected a JSON object, got list)"),
        ("sweep.json", '{"invocations": 5}', "expected 'invocations' to be a list of objects"),
        ("sweep.json", "[" * 5000 + "]" * 5000, "unreadable sweep record"),
        ("row.json", "[]", "expected a JSON object (a run's row), got list"),
    ],
)
def test_a_damaged_record_is_one_line(
    local_sweep: tuple[Path, Path], tmp_path: Path, sweep_in_process: Any, name: str, text: str, problem: str
) -> None:
    out = _copy(local_sweep, tmp_path)
    path = out / name if name == "sweep.json" else next((out / "runs").iterdir()) / name
    path.write_text(text)
    line = _error_line(sweep_in_process(local_sweep[0], out, check=False))
    assert str(path) in line and problem in line


def test_a_row_that_is_a_fifo_is_refused_without_hanging(
    local_sweep: tuple[Path, Path], tmp_path: Path, sweep_in_process: Any
) -> None:
    out = _copy(local_sweep, tmp_path)
    row = next((out / "runs").iterdir()) / "row.json"
    row.unlink()
    os.mkfifo(row)
    line = _error_line(sweep_in_process(local_sweep[0], out, check=False))
    assert str(row) in line and "a FIFO" in line


def test_a_moved_sweep_folder_is_rerun_where_it_is(
    local_sweep: tuple[Path, Path], tmp_path: Path, sweep_cli: Any
) -> None:
    copied = _copy(local_sweep, tmp_path)
    moved = copied.rename(tmp_path / "moved")  # nothing is left where the records were written
    done = sweep_cli(local_sweep[0], moved, "--jobs=2")
    assert "4 runs, 4 finished before, 0 to run" in done.stdout
    assert not copied.exists()
    stores = [p for p in (moved / "stores").glob("*/pipeline.json")]
    assert stores and all(str(local_sweep[1]) not in p.read_text() for p in stores)
    for record in (moved / "runs").glob("*/pipeline.json"):
        assert str(local_sweep[1]) not in record.read_text()  # paths relative to the folder


def test_a_sweep_whose_every_run_failed_exits_2(tmp_path: Path, spec_writer: Any, sweep_cli: Any) -> None:
    spec = spec_writer(tmp_path / "spec.toml", '[evaluation]\nsplits = "nonsense"\n' + SCENE)
    out = tmp_path / "out"
    line = _error_line(sweep_cli(spec, out, check=False))
    assert line.startswith(f"raykit: error: {out}: every run failed (1 of 1; the first: input: ")
    assert (out / "report.md").is_file() and (out / "results.csv").is_file()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie waiting for its parent counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_a_sigkilled_sweep_leaves_no_trainer_and_its_rerun_repeats_no_step(
    tmp_path: Path, spec_writer: Any, sweep_cli: Any, start_sweep_cli: Any
) -> None:
    spec = spec_writer(tmp_path / "spec.toml", "seeds = [0]" + SCENE)
    text = spec.read_text().replace("steps = 6", "steps = 400").replace("ckpt_every = 3", "ckpt_every = 20")
    spec.write_text(text)
    out = tmp_path / "out"
    proc = start_sweep_cli(spec, out, "--jobs=1")
    deadline = time.monotonic() + 240

    def trainer() -> int | None:
        for record in (out / "runs").glob("*/pipeline.json"):
            log = record.parent / "train" / "log.jsonl"
            attempts = json.loads(record.read_text())["stages"].get("train", {}).get("attempts", [])
            if attempts and "pid" in attempts[-1] and log.is_file() and log.stat().st_size:
                return int(attempts[-1]["pid"])
        return None

    while (pid := trainer()) is None:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the trainer never started"
        time.sleep(0.05)
    assert not _gone(pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 120
    while not _gone(pid):  # the trainer dies with its sweep (its parent is the fork server)
        assert time.monotonic() < deadline, f"trainer {pid} still runs after its sweep was killed"
        time.sleep(0.1)
    done = sweep_cli(spec, out, "--jobs=1")
    assert "0 finished before, 1 to run" in done.stdout
    (log,) = (out / "runs").glob("*/train/log.jsonl")
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines() if line.strip()]
    assert steps == sorted(set(steps)) and steps[-1] >= 395, steps  # no step logged twice


def test_a_second_trainer_into_a_live_run_folder_is_refused(
    local_sweep: tuple[Path, Path], tmp_path: Path
) -> None:
    import subprocess
    import sys

    from raykit.locks import store_lock

    row = json.loads(next((local_sweep[1] / "runs").glob("*/row.json")).read_text())
    store = next(local_sweep[1].glob("stores/*/store"))
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    argv = [sys.executable, "-m", "raykit.trainer", str(store), f"--out={run}", "--steps=2", "--device=cpu"]
    with store_lock(run, what="training run"):  # as a live trainer of that folder holds it
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert row["status"] == "done"
    line = _error_line(done)
    assert f"{run}: another process is writing this training run (pid {os.getpid()}" in line
    assert not run.exists()
    with store_lock(run, what="training run"):  # ``raykit train`` takes the same lock
        done = subprocess.run(
            [sys.executable, "-m", "raykit", "train", *argv[3:]],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
    assert f"{run}: another process is writing this training run" in _error_line(done)
    assert not run.exists()
