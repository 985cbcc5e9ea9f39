"""raykit's own figures follow the community protocol: eval.json equals ``raykit evaluate`` on the run's
renders (one scorer), has no float columns, and old run directories still open: those from before the
protocol with their figures marked as the old protocol, those with the float columns of earlier releases
with the columns read as before (compare, the pipeline's summary, export verification)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import raykit.cli
from raykit.metrics import psnr
from raykit.pipeline.stages import train_summary
from raykit.store import open_store
from raykit.trainer import OLD_PROTOCOL, compare, export_run, load_export, render, train, verify_export
from raykit.trainer.evaluate import models_from_state, render_view

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
    assert protocol["background"] == [255, 255, 255] and "float_columns" not in protocol
    test = evaluation["splits"]["test"]
    assert set(test) >= {"psnr", "ssim", "lpips"} and not {"psnr_float", "ssim_float"} & set(test)
    assert not {"psnr_float", "ssim_float"} & set(test["images"][0])
    assert test["lpips"] is None  # 12 x 12 images: smaller than AlexNet takes, and no weights here
    out = tmp_path / "results.json"
    assert raykit.cli.main(["evaluate", str(run / "renders" / "test"), f"{tiny_store}:test", "--no-lpips",
                            "--output", str(out)]) == 0  # fmt: skip
    results = json.loads(out.read_text())
    assert [im["name"] for im in results["images"]] == [Path(im["name"]).stem for im in test["images"]]
    for ours, theirs in zip(test["images"], results["images"], strict=True):
        assert ours["psnr"] == pytest.approx(theirs["psnr"], abs=1e-9)
        assert ours["ssim"] == pytest.approx(theirs["ssim"], abs=1e-9)


def test_old_run_directories_open_with_old_protocol_marked(run: Path, tmp_path: Path) -> None:
    evaluation = json.loads((run / "eval.json").read_text())
    old = tmp_path / "old"
    old.mkdir()
    for name in ("log.jsonl", "progress.jsonl"):
        if (run / name).exists():
            (old / name).write_text((run / name).read_text())
    test = evaluation["splits"]["test"]
    floats = {"psnr": test["psnr"] + 0.25, "ssim": test["ssim"] - 0.01}  # the float figures of an old run
    old_images = [{"name": im["name"], **floats} for im in test["images"]]
    split = {**floats, "n_images": 2, "seconds": 0.1, "images": old_images}
    old_eval = {"step": evaluation["step"], "checkpoint": evaluation["checkpoint"], "splits": {"test": split}}
    (old / "eval.json").write_text(json.dumps(old_eval))
    rows = {(r.split, r.metric): r for r in compare(old, run)}
    assert rows[("test", "psnr")].a is None and rows[("test", "psnr")].b == test["psnr"]
    assert rows[("test", "psnr_float")].a == floats["psnr"] and rows[("test", "psnr_float")].b is None
    summary = train_summary(old)
    assert summary["protocol"] == OLD_PROTOCOL and summary["psnr_float"] == floats["psnr"]
    assert train_summary(run)["protocol"] == "default" and train_summary(run)["psnr_float"] is None
    assert ("test", "psnr_float") not in {(r.split, r.metric) for r in compare(run, run)}
    # an eval.json of the last release: the protocol's figures and the float columns beside them
    earlier = {**evaluation, "splits": {"test": {**test, "psnr_float": floats["psnr"], "ssim_float": 0.5}}}
    (old / "eval.json").write_text(json.dumps(earlier))
    rows = {(r.split, r.metric): r for r in compare(old, run)}
    assert rows[("test", "psnr")].a == rows[("test", "psnr")].b == test["psnr"]
    assert rows[("test", "ssim_float")].a == 0.5 and rows[("test", "ssim_float")].b is None
    assert train_summary(old)["psnr_float"] == floats["psnr"]
    shutil.copytree(run, tmp_path / "rerendered")
    (tmp_path / "rerendered" / "eval.json").write_text(json.dumps(old_eval))
    again = render(tmp_path / "rerendered", "test")
    assert again["protocol"]["name"] == "default" and again["splits"]["test"]["psnr"] == test["psnr"]
    assert again["splits_before_protocol"]["test"]["psnr"] == floats["psnr"]  # kept apart, not mixed


def test_export_verify_follows_the_protocol_of_the_figures(run: Path, tmp_path: Path) -> None:
    """An export verifies against the run's protocol figures; one written before the protocol (no
    ``eval_protocol``, a float ``psnr``) verifies against the float PSNR of the same renders."""
    out = export_run(run, tmp_path / "model")
    result = verify_export(out)
    assert result["protocol"] == "default" and result["difference_db"] <= 1e-9
    model, cpu = load_export(out), torch.device("cpu")
    field, grid = models_from_state(model.config, model.state, cpu)
    store = open_store(model.config.store)
    manifest_path = out / "export.json"
    manifest = json.loads(manifest_path.read_text())
    values = []
    for image in manifest["eval"]["test"]["images"]:
        pred, target, _ = render_view(model.config, store, image["name"], field, grid, cpu)
        values.append(float(psnr(pred[None], target[None])[0]))  # the float PSNR of before the protocol
    del manifest["eval_protocol"]
    manifest["eval"]["test"]["psnr"] = float(np.mean(values))
    manifest_path.write_text(json.dumps(manifest))
    old = verify_export(out)
    assert old["protocol"] == OLD_PROTOCOL and old["difference_db"] <= 1e-6
    assert abs(old["psnr"] - result["psnr"]) > 1e-3  # not the 8-bit figure
