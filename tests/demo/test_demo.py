"""``raykit demo --quick`` end to end: the report holds real numbers and real images, and the demo is
``raykit run`` (its pipeline.json records every stage; a rerun with nothing changed runs nothing)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# ``raykit demo --quick`` through raykit's own command line, with the quick plan's time budgets cut
# (its scene, stages, worker counts and batch sizes as they are): these checks are of the stages, the
# records and the report, not of what a longer training or benchmark reaches.
_QUICKER = """
import dataclasses, sys
import raykit.demo
from raykit.cli import main
quick = raykit.demo.plan_for(True)
raykit.demo.plan_for = lambda _quick: dataclasses.replace(
    quick, train_seconds=1.5, bench_batches=10, progress_every_s=0.5
)
raise SystemExit(main(sys.argv[1:]))
"""


def _demo(out: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", _QUICKER, "demo", "--quick", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "out"
    _demo(out, timeout=300)
    return out


def test_report_has_every_section_and_figure(demo_out: Path) -> None:
    report = (demo_out / "report.md").read_text()
    headings = ("## Dataset", "## Loader throughput", "## Training", "## Layouts", "## Export verification")
    for heading in headings:
        assert heading in report
    for figure in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report):
        image = np.asarray(Image.open(demo_out / figure).convert("L"), dtype=np.float64)
        assert image.std() > 5.0, f"{figure} is blank"


def test_results_are_real_measurements(demo_out: Path) -> None:
    results = json.loads((demo_out / "results.json").read_text())
    stores = results["stores"]
    assert stores["equal_fingerprints_zarr_wds"] is True
    assert all(stores[k]["valid"] for k in ("blender-zarr", "blender-wds", "colmap-zarr"))
    assert stores["blender_vs_colmap"]["images"] == results["scene"]["views"]["test"]
    assert stores["blender_vs_colmap"]["directions"] < 1e-5
    for row in results["bench"]["grid"]:
        assert row["warm"]["rays_per_s"] > 0 and math.isfinite(row["warm"]["rays_per_s"])
    for name in ("a_precomputed_rays", "b_cached_images"):
        assert results["bench"]["baselines"][name]["steady_rays_per_s"] > 0
    for sampler in ("stratified", "hierarchical", "occupancy"):
        run = results["runs"][sampler]
        assert run["step"] > 0 and math.isfinite(run["psnr"]) and run["renders"]
    layouts = results["layouts"]
    for name in ("rays", "images"):
        row = layouts[name]
        assert row["bytes_on_disk"] > 0 and row["rays_per_s"] > 0 and math.isfinite(row["test_psnr"])
        assert 0 < row["shuffle_quality"]["ratio"] <= 1.01
    # No order between the two sizes: on the flat-shaded built-in scene a format-3 ray store (about
    # 1 B/ray) can be smaller than its PNGs; BENCHMARKS.md compares them on photo-like captures.


def test_report_numbers_match_results(demo_out: Path) -> None:
    results = json.loads((demo_out / "results.json").read_text())
    report = (demo_out / "report.md").read_text()
    for sampler, run in results["runs"].items():
        assert f"| {sampler} | {run['psnr']:.2f} |" in report


def test_the_demo_is_raykit_run(demo_out: Path) -> None:
    stages = json.loads((demo_out / "pipeline.json").read_text())["stages"]
    samplers = ("stratified", "hierarchical", "occupancy", "proposal")
    expected = {
        "scene",
        "convert",
        "validate",
        "profile",
        "evaluate",
        "render",
        "report",
        "demo-stores",
        "demo-loader",
        "demo-layouts",
        *(f"train-{s}" for s in samplers),
        *(f"export-{s}" for s in samplers),
    }
    assert set(stages) == expected and all(r["status"] == "done" for r in stages.values())
    for sampler in samplers:
        assert stages[f"export-{sampler}"]["result"]["verify"]["difference_db"] <= 0.05
    assert (demo_out / "report.html").stat().st_size > 10_000
    assert "ran: nothing, all up to date" in _demo(demo_out, timeout=120).stdout
