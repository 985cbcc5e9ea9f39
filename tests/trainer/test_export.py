"""Export round trip on the built-in scene: convert -> train -> export -> verify -> render from the export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from raykit.cli import main
from raykit.converters import convert
from raykit.errors import ExportError
from raykit.fileio import json_bytes, sha256_bytes
from raykit.testing import render_scene, write_blender
from raykit.trainer import load_export, train
from raykit.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from raykit.trainer.deploy import render_export, verify_export
from raykit.trainer.export import MODEL_FILE, export_run, flatten_state, unflatten_state

from .test_train import tiny_config


@pytest.fixture(scope="module")
def scene_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The built-in tiny scene as Blender files, its store (normalised frame) and a short occupancy run."""
    root = tmp_path_factory.mktemp("export")
    write_blender(render_scene("tiny"), root / "scene")
    convert(root / "scene", root / "store", normalize="cameras")
    run = train(tiny_config(root / "store", root / "run", sampler="occupancy", steps=12, batch_size=256))
    return {"root": root, "scene": root / "scene", "store": root / "store", "run": run}


def _pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path))


def test_export_verify_and_render_without_run_or_store(
    scene_run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model"
    assert main(["export", str(scene_run["run"]), str(out), "--verify"]) == 0
    assert "difference 0.0000 dB" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "export.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary directory left behind
    manifest = json.loads((out / "export.json").read_text())
    evaluation = json.loads((scene_run["run"] / "eval.json").read_text())
    assert manifest["eval"] == evaluation["splits"] and manifest["step"] == evaluation["step"] == 12
    assert set(manifest["state"]["groups"]) == {"field", "grid"}  # optimiser state left out
    result = verify_export(out)
    assert result["psnr"] == evaluation["splits"]["test"]["psnr"] and result["difference_db"] == 0.0

    # The export alone: run directory and store moved away, cameras from the capture's transforms file.
    renders = {p.name: _pixels(p) for p in (scene_run["run"] / "renders" / "test").glob("*.png")}
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for name in ("run", "store"):
        shutil.move(scene_run[name], hidden / name)
    try:
        novel = tmp_path / "novel"
        figures = render_export(out, scene_run["scene"] / "transforms_test.json", novel)
        assert figures["n_images"] == 2 and figures["psnr"] is None  # no targets without a store
        for name, expected in renders.items():  # the pixels of the run's own evaluation
            diff = np.abs(_pixels(novel / name).astype(int) - expected)
            # rays from the JSON poses (float64) vs the store's: rounding moves a rare value by one level
            assert diff.max() <= 1 and (diff > 0).mean() < 0.01, name
        assert json.loads((novel / "render.json").read_text())["images"][0]["file"] == "000_r_0.png"
    finally:
        for name in ("run", "store"):
            shutil.move(hidden / name, scene_run[name])
    capsys.readouterr()
    flags = ["--model", str(out), "--cameras", str(scene_run["store"]), "--out", str(tmp_path / "s")]
    assert main(["render", *flags]) == 0
    assert f"psnr {evaluation['splits']['test']['psnr']:.3f} dB" in capsys.readouterr().out

    # Cameras from a store of the same capture in another frame (not normalised) are mapped through
    # the capture's frame: the same images, the same PSNR.
    raw = convert(scene_run["scene"], tmp_path / "raw", normalize="none")
    assert not np.allclose(raw.world_from_source, load_export(out).world_from_source)
    figures = render_export(out, tmp_path / "raw", tmp_path / "r")
    assert figures["psnr"] == pytest.approx(evaluation["splits"]["test"]["psnr"], abs=0.01)


def test_corrupt_or_wrong_exports_fail_clearly(
    scene_run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = export_run(scene_run["run"], tmp_path / "model")
    with pytest.raises(ExportError, match="already exists; pass --force"):
        export_run(scene_run["run"], out)
    export_run(scene_run["run"], out, force=True)
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="is not a raykit model export; refusing"):
        export_run(scene_run["run"], tmp_path / "precious", force=True)
    assert (tmp_path / "precious" / "notes.txt").read_text() == "mine"
    data = bytearray((out / MODEL_FILE).read_bytes())
    data[len(data) // 2] ^= 0x01
    (out / MODEL_FILE).write_bytes(bytes(data))
    with pytest.raises(ExportError, match=r"model\.safetensors: corrupt export file: expected .* sha256"):
        load_export(out)
    capsys.readouterr()
    assert main(["export", "--verify", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raykit: error: ") and "model.safetensors" in err[0]
    (out / "config.json").unlink()
    with pytest.raises(ExportError, match=r"config\.json: missing"):
        load_export(out)
    with pytest.raises(ExportError, match="not a raykit model export"):
        load_export(tmp_path)
    assert main(["export", str(out)]) == 2
    assert "expected RUN OUT, or --verify OUT" in capsys.readouterr().err
    assert main(["render", "--model", str(out), "--out", str(tmp_path / "r")]) == 2
    assert "expected --cameras" in capsys.readouterr().err
    with pytest.raises(ExportError, match="no checkpoint to export"):
        export_run(tmp_path / "empty", tmp_path / "nothing")


def test_records_are_size_and_sha256_and_older_bytes_records_still_open(
    scene_run: dict[str, Path], tmp_path: Path
) -> None:
    """Exports and checkpoints write the store's file record, {"size", "sha256"}; an export or a
    checkpoint written before (records {"bytes", "sha256"}) still opens, and is still checked."""
    out = export_run(scene_run["run"], tmp_path / "model")
    manifest = json.loads((out / "export.json").read_text())
    assert all(set(entry) == {"size", "sha256"} for entry in manifest["files"].values())
    files = {name: {"bytes": e["size"], "sha256": e["sha256"]} for name, e in manifest["files"].items()}
    (out / "export.json").write_text(json.dumps({**manifest, "files": files}))
    assert load_export(out).step == manifest["step"]
    files[MODEL_FILE]["bytes"] += 1
    (out / "export.json").write_text(json.dumps({**manifest, "files": files}))
    with pytest.raises(ExportError, match=r"model\.safetensors: .*expected \d+ as recorded"):
        load_export(out)

    checkpoint = tmp_path / "run" / "checkpoints"
    shutil.copytree(latest_checkpoint(scene_run["run"]), checkpoint / "step_00000012")  # type: ignore[arg-type]
    meta = json.loads((checkpoint / "step_00000012" / "meta.json").read_text())
    record = meta["files"]["state.pt"]
    assert set(record) == {"size", "sha256"}
    meta.pop("meta_sha256")
    meta["files"]["state.pt"] = {"bytes": record["size"], "sha256": record["sha256"]}
    (checkpoint / "step_00000012" / "meta.json").write_bytes(
        json_bytes({**meta, "meta_sha256": sha256_bytes(json_bytes(meta))})
    )
    loaded, _ = load_checkpoint(checkpoint / "step_00000012")
    assert loaded.step == 12 and loaded.files["state.pt"]["bytes"] == record["size"]


def test_verify_fails_when_psnr_differs_beyond_tolerance(scene_run: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(scene_run["run"], run)
    path = run / "eval.json"
    evaluation = json.loads(path.read_text())
    evaluation["splits"]["test"]["psnr"] += 0.06
    path.write_text(json.dumps(evaluation))
    out = export_run(run, tmp_path / "model")
    with pytest.raises(
        ExportError, match=r"verification failed: test PSNR .* \(difference 0\.060 dB > 0\.05 dB\)"
    ):
        verify_export(out)
    assert verify_export(out, tolerance_db=0.07)["difference_db"] == pytest.approx(0.06)


def test_every_model_and_sampler_tensor_is_exported(scene_run: dict[str, Path], tmp_path: Path) -> None:
    """A checkpoint group unknown to the exporter (a new sampler's state) travels with the export."""
    run = tmp_path / "run"
    shutil.copytree(scene_run["run"], run)
    (run / "eval.json").unlink()
    meta, tensors = load_checkpoint(latest_checkpoint(run))
    generator = torch.Generator().manual_seed(1)
    proposal = {"nets": {"0.weight": torch.randn(4, 3, generator=generator), "0.bias": torch.zeros(4)}}
    tensors = {**tensors, "proposal": proposal, "proposal_optimizer": {"state": {}}, "contraction": {}}
    save_checkpoint(run, meta, tensors)
    model = load_export(export_run(run, tmp_path / "model"))
    assert set(model.manifest["state"]["groups"]) == {"field", "grid", "proposal", "contraction"}
    assert model.eval is None  # no eval figures: nothing claimed
    for group in ("field", "grid", "proposal"):
        flat_a, flat_b = flatten_state(tensors[group])[0], flatten_state(model.state[group])[0]
        assert flat_a.keys() == flat_b.keys() and all(torch.equal(flat_a[k], flat_b[k]) for k in flat_a)
    assert model.state["contraction"] == {}
    with pytest.raises(ExportError, match="no eval figures"):
        verify_export(model.path)


def test_flatten_round_trip_and_refusals() -> None:
    state = {"a": {"b": torch.arange(3), "c": {}, "n": 5, "s": "x"}, "d": torch.ones(2, dtype=torch.bool)}
    tensors, values, empty = flatten_state(state)
    assert sorted(tensors) == ["a/b", "d"] and values == {"a/n": 5, "a/s": "x"} and empty == ["a/c"]
    back = unflatten_state(tensors, values, empty)
    assert back.keys() == state.keys() and back["a"]["c"] == {} and back["a"]["n"] == 5
    assert torch.equal(back["d"], state["d"]) and torch.equal(back["a"]["b"], state["a"]["b"])
    with pytest.raises(ExportError, match="without '/'"):
        flatten_state({"a/b": torch.zeros(1)})
    with pytest.raises(ExportError, match="not JSON-able"):
        flatten_state({"a": object()})
