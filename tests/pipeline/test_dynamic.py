"""``raykit run`` on a dynamic capture (the built-in scene as a Neural 3D Video store): renders named by
camera and time, test PSNR against scene time, a test camera's video in the report, an export that
carries the time range and verifies; ``raykit evaluate`` and ``raykit render --model`` on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from raykit.evaluation import EvaluateConfig, evaluate
from raykit.pipeline.timeline import plot_psnr_over_time
from raykit.store import open_store
from raykit.trainer.deploy import render_export

from .conftest import records


@pytest.fixture(scope="module")
def dynamic_run(n3dv: dict[str, Any], run_raykit: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``raykit run`` of the n3dv store: one sampler, 6 steps (cam00 held out: 6 test frames)."""
    out = tmp_path_factory.mktemp("dynamic") / "out"
    run_raykit(Path(n3dv["store"].url), out, "--samplers=occupancy", "--steps=6")
    return out


def _test_views(store_url: str) -> list[tuple[str, float]]:
    store = open_store(store_url)
    times = {n: float(store.table.time[store.image_index(n)]) for n in store.images("test")}
    return sorted(times.items(), key=lambda item: item[1])


def test_renders_are_named_by_camera_and_time_and_plotted_against_time(
    dynamic_run: Path, n3dv: dict[str, Any]
) -> None:
    views = _test_views(n3dv["store"].url)
    assert len(views) == 6  # camera 0 at every time
    run_dir = dynamic_run / "runs" / "occupancy"
    files = sorted(p.name for p in (run_dir / "renders" / "test").glob("*.png"))
    assert files == [f"{i:03d}_cam00_t{t:.4f}.png" for i, (_, t) in enumerate(views)]
    images = json.loads((run_dir / "eval.json").read_text())["splits"]["test"]["images"]
    assert [(im["name"], im["camera"], im["time"], im["file"]) for im in images] == [
        (name, "cam00", t, f) for (name, t), f in zip(views, files, strict=True)
    ]
    train = records(dynamic_run)["train-occupancy"]["result"]
    assert train["field"] == "kplanes" and train["ray_sampling"]["name"]
    lines = plot_psnr_over_time({"occupancy": train}, dynamic_run / "again.png")
    assert list(lines.values()) == [[(im["time"], im["psnr"]) for im in images]]
    (label,) = lines
    assert label.startswith("occupancy, cam00 (field kplanes, ray sampling ")
    assert (dynamic_run / "figures" / "psnr_time.png").is_file()


def test_the_report_plays_the_test_camera_over_time(dynamic_run: Path) -> None:
    video = records(dynamic_run)["render"]["result"]["video"]
    assert (
        video["camera"] == "cam00" and video["times"] == sorted(video["times"]) and len(video["times"]) == 6
    )
    path = dynamic_run / "figures" / "test_camera.mp4"
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 6 and frames[0].shape == (128, 256, 3)  # truth | render, 32 px scaled to 128
    assert not np.array_equal(frames[0], frames[-1])  # the sphere moved
    html, md = (dynamic_run / "report.html").read_text(), (dynamic_run / "report.md").read_text()
    tag = '<video controls autoplay loop muted playsinline aria-label="cam00 over time" src="data:video/mp4;'
    assert html.count(tag) == 1
    assert (
        "(figures/test_camera.mp4)" in md and "![test PSNR against scene time](figures/psnr_time.png)" in md
    )


def test_the_export_carries_the_time_range_and_renders_by_camera_and_time(
    dynamic_run: Path, n3dv: dict[str, Any], tmp_path: Path
) -> None:
    export = records(dynamic_run)["export-occupancy"]["result"]
    assert export["verify"]["difference_db"] == 0.0
    model = dynamic_run / "export" / "occupancy"
    scene = json.loads((model / "export.json").read_text())["scene"]
    assert scene["field"] == "kplanes" and scene["time_range"] == [0.0, 1.0]
    figures = render_export(model, n3dv["store"].url, tmp_path / "renders")
    run_renders = dynamic_run / "runs" / "occupancy" / "renders" / "test"
    assert [im["file"] for im in figures["images"]] == sorted(p.name for p in run_renders.glob("*.png"))


def test_raykit_evaluate_matches_renders_to_the_store_by_camera_and_time(
    dynamic_run: Path, n3dv: dict[str, Any], tmp_path: Path
) -> None:
    run_dir = dynamic_run / "runs" / "occupancy"
    config = EvaluateConfig(
        pred=str(run_dir / "renders" / "test"),
        gt=f"{n3dv['store'].url}:test",
        output=str(tmp_path / "results.json"),
        lpips=False,
    )
    result = evaluate(config)
    images = json.loads((run_dir / "eval.json").read_text())["splits"]["test"]["images"]
    assert [(r["name"], r["psnr"]) for r in result["images"]] == [
        (Path(im["name"]).as_posix(), im["psnr"]) for im in images
    ]
