"""Tiny sweeps of the built-in scene: two samplers x two seeds, a few steps each (seconds per run)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The trainer's tiny model (as tests/pipeline's TINY_FLAGS): seconds per run on one CPU thread.
TINY_TRAIN = """
[train]
steps = 6
batch_size = 256
levels = 2
base_resolution = 8
max_resolution = 16
features = 2
hidden = 16
n_samples = 24
hier_coarse = 12
hier_fine = 12
occ_resolution = 16
march_steps = 48
occ_warmup_steps = 4
ckpt_every = 3
log_every = 2
device = "cpu"
threads = 1
"""


def write_spec(path: Path, body: str, train: str = TINY_TRAIN) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body + train)
    return path


def raykit_sweep(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "raykit", "sweep", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def sweep_main(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``raykit sweep`` through ``raykit.cli.main`` in this process: a refusal's status and lines without
    a child's start (tests/sweep/test_spec.py checks the same refusal through the real entry point)."""
    from raykit.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv = ["sweep", *map(str, args)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's refusals
            status = exc.code if isinstance(exc.code, int) else 2
    done = subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def start_sweep(*args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "raykit", "sweep", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def sweep_record(out: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((out / "sweep.json").read_text())
    return record


SPEC = """
seeds = [0, 1]
export = true

[evaluation]
metric = "psnr"
max_images = 1

[grid]
sampler = ["occupancy", "stratified"]

[[captures]]
scene = "tiny"
name = "tiny"
"""


@pytest.fixture(scope="session")
def sweep_cli() -> Any:
    """``raykit_sweep(*args, check=True, timeout=300)``: ``raykit sweep`` in a child."""
    return raykit_sweep


@pytest.fixture(scope="session")
def sweep_in_process() -> Any:
    """``sweep_main(*args, check=True)``: ``raykit sweep`` through ``raykit.cli.main``, in this process."""
    return sweep_main


@pytest.fixture(scope="session")
def start_sweep_cli() -> Any:
    """``start_sweep(*args) -> Popen``: ``raykit sweep`` in a child, not waited for."""
    return start_sweep


@pytest.fixture(scope="session")
def spec_writer() -> Any:
    """``write_spec(path, body, train=TINY_TRAIN)``: a SPEC file with the tiny trainer settings."""
    return write_spec


@pytest.fixture(scope="session")
def local_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(SPEC, OUT) of a finished local sweep: 1 capture x 2 samplers x 2 seeds, two runs at a time."""
    root = tmp_path_factory.mktemp("sweep")
    spec = write_spec(root / "spec.toml", SPEC)
    raykit_sweep(spec, root / "out", "--jobs=2")
    return spec, root / "out"
