"""The whole suite: with ``RAYKIT_CI_NO_SKIPS=1`` (``.ci/run`` sets it) any skip but CUDA's fails the run.

A check that skips where its oracle (a package, a browser) is missing checks nothing; CI installs them
all, so there a skip means a missing install step. Tests that need a CUDA device (or none) say
``CUDA`` in their skip reason and may skip anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

NO_SKIPS = "RAYKIT_CI_NO_SKIPS"
_SKIPS: list[str] = []


def _record(report: Any) -> None:
    if not report.skipped or getattr(report, "wasxfail", None) is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if "CUDA" not in reason:
        _SKIPS.append(f"{report.nodeid}: {reason}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get(NO_SKIPS) == "1" and _SKIPS and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if os.environ.get(NO_SKIPS) == "1" and _SKIPS:
        terminalreporter.section(f"{NO_SKIPS}=1: skips other than CUDA's fail the run", red=True)
        for line in _SKIPS:
            terminalreporter.line(line, red=True)


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private stand-in for ``/dev/shm``: the node cache's folders go there (``RAYKIT_NODE_CACHE_DIR``)."""
    folder = tmp_path / "shm"
    folder.mkdir()
    monkeypatch.setenv("RAYKIT_NODE_CACHE_DIR", str(folder))
    return folder


@pytest.fixture(scope="session")
def dnerf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The built-in dynamic scene (4 cameras x 6 times, 32x32; camera 1 with its own intrinsics) as a
    D-NeRF capture, converted in both layouts and backends: ``{"scene", "capture", "rays", "images",
    "rays_wds", "images_wds"}`` (issue 58's time tests)."""
    from raykit.converters import convert
    from raykit.store import copy_store
    from raykit.testing import render_dynamic, write_dnerf

    root = tmp_path_factory.mktemp("dnerf")
    scene = render_dynamic()
    capture = write_dnerf(scene, root / "capture")
    out: dict[str, Any] = {"scene": scene, "capture": capture}
    for layout in ("rays", "images"):
        out[layout] = root / f"{layout}.zarr"
        convert(capture, out[layout], layout=layout, chunk_rays=1024)
        out[f"{layout}_wds"] = root / f"{layout}.wds"  # the images one re-laid out from the rays store
        copy_store(out["rays"], out[f"{layout}_wds"], backend="wds", layout=layout)
    return out


@pytest.fixture(scope="session")
def n3dv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The built-in dynamic scene (4 cameras x 6 times, 32x32, one shared camera) as a Neural 3D Video
    capture and its rays-layout store: ``{"scene", "capture", "store"}`` (issue 58's video tests)."""
    from raykit.converters import convert
    from raykit.testing import render_dynamic, write_n3dv

    root = tmp_path_factory.mktemp("n3dv")
    scene = render_dynamic(own_intrinsics=-1)
    capture = write_n3dv(scene, root / "capture")
    return {
        "scene": scene,
        "capture": capture,
        "store": convert(capture, root / "rays.zarr", chunk_rays=1024),
    }
