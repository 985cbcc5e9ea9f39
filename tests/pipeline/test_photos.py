"""``raykit run PHOTOS OUT``: poses first (pycolmap), and the report names the photos left out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from raykit.testing.photos import render_photos


def test_photos_without_poses_run_through_to_the_report(run_raykit: Any, tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i, image in enumerate(render_photos(24, 240).images):
        Image.fromarray(image).save(photos / f"view_{i:02d}.png")
    noise = np.random.default_rng(5).integers(0, 256, (240, 240, 3), dtype=np.uint8)
    Image.fromarray(noise).save(photos / "zz_stray.png")
    out = tmp_path / "out"
    run_raykit(photos, out, "--steps=6")
    stages = json.loads((out / "pipeline.json").read_text())["stages"]
    assert list(stages)[:2] == ["poses", "convert"]
    assert stages["poses"]["command"][:2] == ["raykit", "poses"]
    assert stages["poses"]["result"]["summary"]["unregistered"] == ["zz_stray.png"]
    assert stages["convert"]["inputs"]["source"] == stages["poses"]["result"]["output"]
    report = (out / "report.md").read_text()
    assert "Photos left out: `zz_stray.png` (not registered by structure from motion)." in report
    assert "(photos): 1 camera(s)" in report and "240x240" in report
