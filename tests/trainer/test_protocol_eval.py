"""raykit's own figures follow the community protocol: eval.json equals ``raykit evaluate`` on the run's
renders, keeps the float figures as labelled extra columns, and old run directories still open with their
figures marked as the old protocol (compare, the pipeline's summary)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import raykit.cli
from raykit.pipeline.stages import train_summary
from raykit.trainer import OLD_PROTOCOL, compare, export_run, render, train, verify_export

from .test_train import tiny_config


@pytest.fixture(scope="module")
def run(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("protocol") / "run"
    train(tiny_config(tiny_store, out, steps=6))
    return out


def test_eval_json_follows_the_protocol_and_raykit_evaluate_reproduces_it(
    run: Path, tiny_store: Path, tmp_path: Path
) -> None:
    evaluation = json.loads((run / "eval.json").read_text())
    protocol = evaluation["protocol"]
    assert protocol["name"] == "default" and protocol["ssim"]["kernel_size"] == 11
    assert protocol["background"] == [255, 255, 255] and protocol["float_columns"] == [
        "psnr_float",
        "ssim_float",
    ]
    test = evaluation["splits"]["test"]
    assert set(test) >= {"psnr", "ssim", "lpips", "psnr_float", "ssim_float"}
    assert test["lpips"] is None  # 12 x 12 images: smaller than AlexNet takes, and no weights here
    out = tmp_path / "results.json"
    assert raykit.cli.main(["evaluate", str(run / "renders" / "test"), f"{tiny_store}:test", "--no-lpips",
                            "--output", str(out)]) == 0  # fmt: skip
    results = json.loads(out.read_text())
    assert [im["name"] for im in results["images"]] == [Path(im["name"]).stem for im in test["images"]]
    for ours, theirs in zip(test["images"], results["images"], strict=True):
        assert ours["psnr"] == pytest.approx(theirs["psnr"], abs=1e-9)
        assert ours["ssim"] == pytest.approx(theirs["ssim"], abs=1e-9)
        assert ours["psnr"] != ours["psnr_float"]  # 8-bit figures differ from the float ones


def test_old_run_directories_open_with_old_protocol_marked(run: Path, tmp_path: Path) -> None:
    evaluation = json.loads((run / "eval.json").read_text())
    old = tmp_path / "old"
    old.mkdir()
    for name in ("log.jsonl", "progress.jsonl"):
        if (run / name).exists():
            (old / name).write_text((run / name).read_text())
    test = evaluation["splits"]["test"]
    old_images = [
        {"name": im["name"], "psnr": im["psnr_float"], "ssim": im["ssim_float"]} for im in test["images"]
    ]
    old_eval = {"step": evaluation["step"], "checkpoint": evaluation["checkpoint"],
                "splits": {"test": {"psnr": test["psnr_float"], "ssim": test["ssim_float"], "n_images": 2,
                                    "seconds": 0.1, "images": old_images}}}  # fmt: skip
    (old / "eval.json").write_text(json.dumps(old_eval))
    rows = {(r.split, r.metric): r for r in compare(old, run)}
    assert rows[("test", "psnr")].a is None and rows[("test", "psnr")].b == test["psnr"]
    assert rows[("test", "psnr_float")].a == rows[("test", "psnr_float")].b == test["psnr_float"]
    summary = train_summary(old)
    assert summary["protocol"] == OLD_PROTOCOL and summary["psnr_float"] == test["psnr_float"]
    assert train_summary(run)["protocol"] == "default"
    shutil.copytree(run, tmp_path / "rerendered")
    (tmp_path / "rerendered" / "eval.json").write_text(json.dumps(old_eval))
    again = render(tmp_path / "rerendered", "test")
    assert again["protocol"]["name"] == "default" and again["splits"]["test"]["psnr"] == test["psnr"]
    assert again["splits_before_protocol"]["test"]["psnr"] == test["psnr_float"]  # kept apart, not mixed


def test_export_verify_follows_the_protocol_of_the_figures(run: Path, tmp_path: Path) -> None:
    """An export verifies against the run's protocol figures; one written before the protocol (no
    ``eval_protocol``, float ``psnr``) verifies against the float PSNR."""
    out = export_run(run, tmp_path / "model")
    result = verify_export(out)
    assert result["protocol"] == "default" and result["difference_db"] <= 1e-9
    manifest_path = out / "export.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["eval_protocol"]
    for figures in manifest["eval"].values():
        figures["psnr"] = figures.pop("psnr_float")
    manifest_path.write_text(json.dumps(manifest))
    old = verify_export(out)
    assert old["protocol"] == OLD_PROTOCOL and old["difference_db"] <= 1e-9
    assert old["psnr"] != result["psnr"]
