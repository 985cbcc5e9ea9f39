"""A tiny built-in scene (Blender form) and ``raykit run`` with a small deterministic step budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Small enough for seconds per sampler on one CPU thread; a step budget makes runs deterministic.
TINY_FLAGS = [
    "--batch-size=256", "--levels=2", "--base-resolution=8", "--max-resolution=16", "--features=2",
    "--hidden=16", "--n-samples=24", "--hier-coarse=12", "--hier-fine=12", "--occ-resolution=16",
    "--march-steps=48", "--occ-warmup-steps=4", "--bench-batches=5", "--ckpt-every=4", "--log-every=2",
    "--device=cpu", "--threads=1", "--no-progress",
]  # fmt: skip


def raykit_run(src: Path, out: Path, *flags: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "raykit", "run", str(src), str(out), *TINY_FLAGS, *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if check:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def start_run(src: Path, out: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``raykit run`` with the tiny flags, not waited for; ``env``: entries added to its environment."""
    cmd = [sys.executable, "-m", "raykit", "run", str(src), str(out), *TINY_FLAGS, *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def records(out: Path) -> dict[str, Any]:
    stages: dict[str, Any] = json.loads((out / "pipeline.json").read_text())["stages"]
    return stages


@pytest.fixture(scope="session")
def run_raykit() -> Any:
    """``raykit_run(src, out, *flags, check=True)``: ``raykit run`` with the tiny flags, in a child."""
    return raykit_run


@pytest.fixture(scope="session")
def start_raykit() -> Any:
    """``start_run(src, out, *flags) -> Popen``: ``raykit run`` with the tiny flags, not waited for."""
    return start_run


@pytest.fixture(scope="session")
def tiny_scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from raykit.testing import render_scene, write_blender

    path = tmp_path_factory.mktemp("scene") / "blender"
    write_blender(render_scene("tiny", seed=0), path)
    return path


@pytest.fixture(scope="session")
def finished_run(tiny_scene: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``raykit run`` of two samplers, 24 steps each, run once uninterrupted."""
    out = tmp_path_factory.mktemp("run") / "out"
    raykit_run(tiny_scene, out, "--samplers=occupancy,stratified", "--steps=24")
    return out


@pytest.fixture(scope="session")
def colmap_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``raykit run`` of the tiny scene's COLMAP form (cameras and sparse points), one sampler, rays
    drawn by their loss (the report shows the sampling map)."""
    from raykit.testing import render_scene, write_colmap

    root = tmp_path_factory.mktemp("colmap")
    write_colmap(render_scene("tiny", seed=0), root / "capture", binary=True)
    raykit_run(root / "capture", root / "out", "--steps=8", "--ray-sampling=loss")
    return root / "out"
