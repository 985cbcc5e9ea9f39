"""``raykit run``: every stage recorded, make-like reruns, exact resume after kills, no retry of bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from safetensors.torch import load_file

from raykit.cli import main
from raykit.trainer.checkpoint import latest_checkpoint

from .conftest import TINY_FLAGS

STAGES = ["convert", "validate", "profile", "train-occupancy", "train-stratified", "evaluate",
          "export-occupancy", "export-stratified", "render", "report"]  # fmt: skip


def test_every_stage_is_recorded(finished_run: Path) -> None:
    stages = records(finished_run)
    assert list(stages) == STAGES  # in run order
    for name, record in stages.items():
        assert record["status"] == "done", name
        assert record["wall_s"] > 0 and record["cpu_s"] >= 0 and record["peak_rss_mb"] > 50, name
        assert len(record["fingerprint"]) == 64 and record["inputs"] and record["command"], name
        assert record["raykit_version"] and record["environment"]["python"], name
        (attempt,) = record["attempts"]
        assert attempt["status"] == "done" and (finished_run / attempt["log"]).parent.is_dir()
    train = stages["train-occupancy"]
    assert train["attempts"][0]["exit_status"] == 0
    assert train["command"][1:3] == ["-m", "raykit.trainer"] and "--steps=24" in train["command"]
    assert stages["export-occupancy"]["result"]["verify"]["difference_db"] <= 0.05
    assert stages["convert"]["command"][:2] == ["raykit", "convert"]
    # a static capture: renders keep the image names; no PSNR against scene time, no video
    renders = sorted(p.name for p in (finished_run / "runs" / "occupancy" / "renders" / "test").iterdir())
    assert renders[0] == "000_r_0.png" and "frames" not in stages["train-occupancy"]["result"]
    assert stages["render"]["result"]["video"] is None
    assert {p.name for p in (finished_run / "figures").iterdir()}.isdisjoint(
        {"psnr_time.png", "test_camera.mp4"}
    )


def test_rerun_with_nothing_changed_runs_nothing(
    run_raykit: Any, tiny_scene: Path, finished_run: Path
) -> None:
    """How fast it is (the target: 5 s on an idle machine) is measured by benchmarks/bench_pipeline.py
    (BENCHMARKS.md, `raykit run`), not here."""
    before = records(finished_run)
    done = run_raykit(tiny_scene, finished_run, "--samplers=occupancy,stratified", "--steps=24")
    assert "ran: nothing, all up to date" in done.stdout
    assert records(finished_run) == before


def test_a_moved_run_folder_is_rerun_where_it_is(
    run_raykit: Any, tiny_scene: Path, finished_run: Path, tmp_path: Path
) -> None:
    """Records hold paths relative to their folder: a copy, moved away from where it was written, is up
    to date where it now is and names nothing of the old place."""
    import shutil

    copied = Path(shutil.copytree(finished_run, tmp_path / "copy", symlinks=True))
    moved = copied.rename(tmp_path / "moved")
    text = (moved / "pipeline.json").read_text()
    assert str(finished_run) not in text and '"./store"' in text
    done = run_raykit(tiny_scene, moved, "--samplers=occupancy,stratified", "--steps=24")
    assert "ran: nothing, all up to date" in done.stdout and str(moved / "report.md") in done.stdout
    assert (moved / "pipeline.json").read_text() == text


def test_a_new_budget_retrains_but_does_not_convert(
    run_raykit: Any, tiny_scene: Path, finished_run: Path, tmp_path: Path
) -> None:
    out = Path(shutil.copytree(finished_run, tmp_path / "out", symlinks=True))  # 24 steps a sampler
    first = records(out)
    done = run_raykit(tiny_scene, out, "--samplers=occupancy,stratified", "--steps=26")
    ran = done.stdout.split("ran: ")[-1]
    second = records(out)
    for name in ("convert", "validate", "profile"):
        assert second[name] == first[name] and name not in ran
    for sampler in ("occupancy", "stratified"):
        for name in (f"train-{sampler}", "evaluate", f"export-{sampler}", "render", "report"):
            assert second[name]["fingerprint"] != first[name]["fingerprint"] or name == "render", name
            assert name in ran, name
        assert second[f"train-{sampler}"]["result"]["step"] == 26


def _wait_for(predicate: object, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)


def records(out: Path) -> dict[str, Any]:
    stages: dict[str, Any] = json.loads((out / "pipeline.json").read_text())["stages"]
    return stages


def _trainer_pid(out: Path, stage: str) -> int | None:
    try:
        attempts = records(out)[stage]["attempts"]
    except (FileNotFoundError, KeyError, json.JSONDecodeError):
        return None
    return attempts[-1].get("pid") if attempts and attempts[-1]["status"] == "running" else None


def _weights(out: Path, sampler: str) -> dict[str, object]:
    return load_file(out / "export" / sampler / "model.safetensors")


def _equal(a: dict[str, object], b: dict[str, object]) -> bool:
    return a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)  # type: ignore[attr-defined]


def test_sigkilled_trainer_is_retried_and_ends_exactly_as_uninterrupted(
    start_raykit: Any, tiny_scene: Path, finished_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "killed"
    proc = start_raykit(tiny_scene, out, "--samplers=occupancy,stratified", "--steps=24", "--retries=1")
    run_dir = out / "runs" / "occupancy"
    _wait_for(lambda: _trainer_pid(out, "train-occupancy") and latest_checkpoint(run_dir) is not None)
    os.kill(_trainer_pid(out, "train-occupancy"), signal.SIGKILL)  # type: ignore[arg-type]
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    first, second = records(out)["train-occupancy"]["attempts"]
    assert (
        first["status"] == "failed"
        and first["exit_status"] == -signal.SIGKILL
        and "signal 9" in first["error"]
    )
    assert second["status"] == "done" and second["resume"] and second["exit_status"] == 0
    for sampler in ("occupancy", "stratified"):
        assert _equal(_weights(out, sampler), _weights(finished_run, sampler)), sampler


def test_killed_pipeline_resumes_at_the_interrupted_stage(
    run_raykit: Any, start_raykit: Any, tiny_scene: Path, finished_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "interrupted"
    proc = start_raykit(tiny_scene, out, "--samplers=occupancy,stratified", "--steps=24")
    run_dir = out / "runs" / "stratified"
    _wait_for(lambda: _trainer_pid(out, "train-stratified") and latest_checkpoint(run_dir) is not None)
    proc.send_signal(signal.SIGKILL)  # the pipeline itself: its trainer child dies with it
    proc.communicate(timeout=60)
    assert records(out)["train-stratified"]["status"] == "running"
    done = run_raykit(tiny_scene, out, "--samplers=occupancy,stratified", "--steps=24")
    assert "ran: train-stratified, evaluate" in done.stdout  # occupancy's stages were up to date
    attempts = records(out)["train-stratified"]["attempts"]
    assert [a["status"] for a in attempts] == ["running", "done"] and attempts[-1]["resume"]
    assert _equal(_weights(out, "stratified"), _weights(finished_run, "stratified"))


def test_bad_input_fails_at_once_and_is_not_retried(run_raykit: Any, tmp_path: Path) -> None:
    capture = tmp_path / "capture"
    capture.mkdir()
    (capture / "transforms_train.json").write_text('{"camera_angle_x": 0.7, "frames": [{"file_path": "x"}]}')
    done = run_raykit(capture, tmp_path / "out", "--retries=3", check=False)
    assert done.returncode == 2
    assert "raykit: error:" in done.stderr and "transforms_train.json" in done.stderr
    convert = records(tmp_path / "out")["convert"]
    assert convert["status"] == "failed" and len(convert["attempts"]) == 1


@pytest.mark.parametrize("flag", ["--samplers=nonsense", "--minutes=0", "--retries=-1"])
def test_invalid_options_are_refused(
    tiny_scene: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """Through ``raykit.cli.main`` in this process (the refusal of bad input above goes through the real
    entry point in a child)."""
    argv = ["run", str(tiny_scene), str(tmp_path / "out"), *TINY_FLAGS, flag]
    assert main(argv) == 2 and "raykit: error: invalid run options" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_conversion_on_a_dask_scheduler_gives_the_same_store(
    run_raykit: Any, tiny_scene: Path, finished_run: Path, tmp_path: Path
) -> None:
    from dask.distributed import LocalCluster

    options = {"n_workers": 1, "threads_per_worker": 1, "processes": False, "protocol": "tcp"}
    with LocalCluster(dashboard_address=None, **options) as cluster:
        address = cluster.scheduler_address
        run_raykit(tiny_scene, tmp_path / "out", "--steps=2", f"--scheduler={address}")
    convert = records(tmp_path / "out")["convert"]
    assert f"--scheduler={address}" in convert["command"]
    assert convert["result"]["output"] == records(finished_run)["convert"]["result"]["output"]
    assert convert["fingerprint"] == records(finished_run)["convert"]["fingerprint"]  # not the executor's


def test_an_existing_store_is_trained_on_as_it_is(
    run_raykit: Any, finished_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run_raykit(finished_run / "store", out, "--steps=2")
    stages = records(out)
    assert list(stages)[:2] == ["validate", "profile"] and not (out / "store").exists()
    assert stages["validate"]["inputs"]["store"] == records(finished_run)["convert"]["result"]["output"]
    assert "store (zarr, rays layout)" in (out / "report.md").read_text()


def test_a_loss_sampled_run_reports_where_the_rays_went(colmap_run: Path) -> None:
    """``--ray-sampling loss``: the report shows each run's sampling map (copied into its figures)."""
    maps = sorted((colmap_run / "figures").glob("sampling_map_*.png"))
    assert len(maps) == 1
    with Image.open(maps[0]) as figure:
        assert figure.size[0] > 300
    assert f"]({'figures/' + maps[0].name})" in (colmap_run / "report.md").read_text()
