"""``raykit sweep``: one row per run with every column, no repeats, failures as rows, Dask = local."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from raykit.errors import ConfigError
from raykit.sweep import SweepOptions, comparable, paired_comparison, run_sweep, summarise
from raykit.trainer import TrainConfig

MEASURED = (
    "wall_s",
    "train_s",
    "eval_s",
    "overhead_s",
    "steps",
    "rays_per_s",
    "peak_rss_mb",
    "loader_wait_fraction",
    "store_fingerprint",
    "source_fingerprint",
    "config_hash",
    "raykit_version",
)


def _rows(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(out / "results.parquet").to_pylist()
    return rows


def test_one_row_per_run_with_every_column(local_sweep: tuple[Path, Path]) -> None:
    _, out = local_sweep
    rows = _rows(out)
    assert [(r["config"], r["seed"]) for r in rows] == [
        ("sampler=occupancy", 0),
        ("sampler=occupancy", 1),
        ("sampler=stratified", 0),
        ("sampler=stratified", 1),
    ]
    for row in rows:
        assert row["status"] == "done" and row["error"] is None, row
        assert row["steps"] == 6 and row["attempts"] == 1
        for field in dataclasses.fields(TrainConfig):
            if field.name not in ("store", "out", "seed", "resume", "force", "progress"):
                assert f"config.{field.name}" in row, field.name
        for column in MEASURED:
            assert row[column] is not None, column
        assert 0 < row["test_psnr"] < 60 and 0 < row["test_ssim"] <= 1  # read from eval.json generically
        assert row["config.sampler"] == row["config"].removeprefix("sampler=")
        assert row["wall_s"] >= row["train_s"] + row["eval_s"]
        assert (out / row["export_path"] / "export.json").is_file() and row["export_verify_db"] <= 0.05
    assert len({r["run_id"] for r in rows}) == 4 and len({r["store_fingerprint"] for r in rows}) == 1
    csv = pcsv.read_csv(out / "results.csv").to_pylist()
    assert [r["run_id"] for r in csv] == [r["run_id"] for r in rows]
    assert csv[0]["test_psnr"] == pytest.approx(rows[0]["test_psnr"])
    invocation = json.loads((out / "sweep.json").read_text())["invocations"][0]  # later tests add more
    assert len(invocation["ran"]) == 4 and invocation["skipped"] == [] and invocation["status"] == "done"


def test_the_report_compares_configurations(local_sweep: tuple[Path, Path], sweep_cli: Any) -> None:
    _, out = local_sweep
    md = (out / "report.md").read_text()
    for text in (
        "## Capture: tiny",
        "Mean ± standard deviation over seeds",
        "## Paired comparison",
        "| sampler=occupancy | sampler=stratified | 2 |",
        "![curves tiny](figures/curves-tiny.png)",
    ):
        assert text in md, text
    (out / "report.md").unlink()
    (out / "report.html").unlink()
    done = sweep_cli("--report", out, timeout=120)
    assert "report:" in done.stdout and (out / "report.md").read_text() == md
    assert (out / "report.html").stat().st_size > 10_000  # the curves are inline PNGs


def test_mean_std_and_paired_comparison_figures() -> None:
    rows = [
        {"capture": c, "config": k, "seed": s, "status": "done", "m": v}
        for c, k, s, v in [
            ("a", "x", 0, 10.0),
            ("a", "x", 1, 12.0),
            ("a", "y", 0, 11.0),
            ("a", "y", 1, 11.0),
            ("b", "x", 0, 5.0),
            ("b", "y", 0, 7.0),
            ("b", "y", 1, 9.0),
        ]
    ]
    stats = summarise(rows, "m")
    assert stats[("a", "x")] == {"mean": 11.0, "std": pytest.approx(2**0.5), "n": 2}
    assert stats[("b", "x")] == {"mean": 5.0, "std": 0.0, "n": 1}
    (pair,) = paired_comparison(rows, "m")
    assert (pair["pairs"], pair["a_wins"], pair["b_wins"], pair["ties"]) == (3, 1, 2, 0)
    assert pair["mean_diff"] == pytest.approx((-1 + 1 - 2) / 3) and (pair["min_diff"], pair["max_diff"]) == (
        -2,
        1,
    )
    assert (pair["captures_a"], pair["captures_b"], pair["captures"]) == (0, 1, 2)
    (lower,) = paired_comparison(rows, "m", higher_is_better=False)
    assert (lower["a_wins"], lower["b_wins"]) == (2, 1)


def test_a_rerun_repeats_no_finished_run(
    local_sweep: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    spec, out = local_sweep
    before = {p: p.read_bytes() for p in (out / "runs").glob("*/row.json")}
    run_sweep(spec, out, SweepOptions(jobs=2))
    assert "4 finished before, 0 to run" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in (out / "runs").glob("*/row.json")} == before
    last = json.loads((out / "sweep.json").read_text())["invocations"][-1]
    assert last["ran"] == [] and len(last["skipped"]) == 4


def test_two_captures_that_are_one_store_stop_before_any_run(
    local_sweep: tuple[Path, Path], spec_writer: Any, tmp_path: Path
) -> None:
    _, out = local_sweep
    (store,) = (out / "stores").glob("*/store")
    shutil.copytree(store, tmp_path / "copy")  # another path, the same content: the same fingerprint
    body = f'[[captures]]\npath = "{store}"\n[[captures]]\npath = "{tmp_path / "copy"}"\n'
    spec = spec_writer(tmp_path / "spec.toml", body)
    with pytest.raises(ConfigError, match=r"spec.toml: capture 'copy': the same store as capture 'store'"):
        run_sweep(spec, tmp_path / "out")
    assert not (tmp_path / "out" / "runs").exists()


def _distributed_cluster() -> Any:
    distributed = pytest.importorskip("distributed")
    # each worker declares one GPU, as `dask worker --resources GPU=1` on a GPU machine: a run holds it
    return distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", resources={"GPU": 1}
    )


def test_dask_gives_the_local_results_and_a_failure_is_a_row(
    local_sweep: tuple[Path, Path], spec_writer: Any, tmp_path: Path
) -> None:
    spec_local, out_local = local_sweep
    body = spec_local.read_text().split("[train]")[0].replace("seeds = [0, 1]", "seeds = [0]")
    body = body.replace(
        '[grid]\nsampler = ["occupancy", "stratified"]',
        '[[configs]]\nsampler = "occupancy"\n[[configs]]\nname = "broken"\ntrain_split = "nope"',
    )
    (store,) = (out_local / "stores").glob("*/store")  # the same store: the same run identities
    body = body.replace('scene = "tiny"', f'path = "{store}"')
    spec = spec_writer(tmp_path / "spec.toml", body)
    with _distributed_cluster() as cluster:
        run_sweep(spec, tmp_path / "out", SweepOptions(scheduler=cluster.scheduler_address))
    rows = {r["config"]: r for r in _rows(tmp_path / "out")}
    broken = rows["broken"]
    assert (
        broken["status"] == "failed" and broken["error"].startswith("input: ") and "nope" in broken["error"]
    )
    assert broken["attempts"] == 1  # bad input is never retried
    dask_row = rows["sampler=occupancy"]
    (local_row,) = [r for r in _rows(out_local) if r["run_id"] == dask_row["run_id"]]
    assert dask_row["executor"].startswith("dask:") and dask_row["executor"].endswith(" GPU=1")
    other = ("export_path", "source_fingerprint")  # the SPECs name the capture differently
    assert {k: v for k, v in comparable(dask_row).items() if k not in other} == {
        k: v for k, v in comparable(local_row).items() if k not in other
    }
    shutil.rmtree(tmp_path / "out" / "runs")  # checkpoints: keep the temporary folder small
