"""``--tracking mlflow`` against a real ``mlflow server`` on loopback: every run's parameters, metrics and
artifacts, the sweep's report, and nothing logged twice."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _needs_mlflow() -> None:
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    _needs_mlflow()
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    store, artifacts = f"sqlite:///{root / 'mlflow.db'}", str(root / "art")
    argv = [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", store, "--artifacts-destination", artifacts]  # fmt: skip
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, (root / "server.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_runs_and_the_sweep_are_logged_once(
    server: str, local_sweep: tuple[Path, Path], sweep_cli: Any, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    from raykit.sweep import SweepOptions, run_sweep

    spec, out = local_sweep  # finished: the runs are logged as they are (a copy would be refused: its
    # records point into the original folder)
    done = sweep_cli(spec, out, "--tracking=mlflow", f"--tracking-uri={server}", timeout=300)
    assert "warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    run_sweep(spec, out, SweepOptions(tracking="mlflow", tracking_uri=server))  # logs no run again
    client = MlflowClient(tracking_uri=server)
    (experiment,) = [e for e in client.search_experiments() if e.name == "raykit sweep spec"]
    runs = client.search_runs([experiment.experiment_id])
    named = {r.info.run_name: r for r in runs}
    assert sorted(named) == sorted(
        ["sweep", *(f"tiny / sampler={s} / seed {k}" for s in ("occupancy", "stratified") for k in (0, 1))]
    )
    assert sum(1 for r in runs if r.info.run_name == "sweep") == 2  # one per invocation; runs once
    run = named["tiny / sampler=stratified / seed 1"]
    assert run.data.params["config.sampler"] == "stratified" and run.data.params["seed"] == "1"
    assert len(run.data.params["store_fingerprint"]) == 64
    assert 0 < run.data.metrics["test_psnr"] < 60 and run.data.metrics["steps"] == 6
    assert run.data.tags["raykit.run_id"] and run.info.status == "FINISHED"
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"results.json", "eval.json", "export"} <= files
    sweep = next(r for r in runs if r.info.run_name == "sweep")
    assert {"report.html", "report.md", "results.parquet", "results.csv"} <= {
        a.path for a in client.list_artifacts(sweep.info.run_id)
    }


def test_an_unreachable_server_stops_before_any_run(
    local_sweep: tuple[Path, Path], sweep_cli: Any, tmp_path: Path
) -> None:
    _needs_mlflow()
    spec, _ = local_sweep
    url = f"http://127.0.0.1:{_free_port()}"
    done = sweep_cli(spec, tmp_path / "out", "--tracking=mlflow", f"--tracking-uri={url}", check=False)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"raykit: error: --tracking-uri {url}: tracking server not reachable")
    assert not (tmp_path / "out").exists()
