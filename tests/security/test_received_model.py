"""A received checkpoint or export: checked against its record before it is used, read only as
regular files of the recorded size inside its folder, and every problem is one line naming the file."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from raykit.errors import ExportError, ResumeError
from raykit.fileio import json_bytes, sha256_bytes
from raykit.trainer import export_run, load_export
from raykit.trainer.checkpoint import latest_checkpoint, load_checkpoint

from .conftest import SECRET, cli, replace_with, secret_digest

pytestmark = pytest.mark.timeout(10, func_only=True)  # each case; not the shared fixtures


@pytest.fixture()
def run_copy(trained: dict[str, Path], tmp_path: Path) -> Path:
    shutil.copytree(trained["run"], tmp_path / "run")
    (tmp_path / "secret").write_bytes(SECRET)
    return tmp_path / "run"


@pytest.fixture()
def export_copy(trained: dict[str, Path], tmp_path: Path) -> Path:
    shutil.copytree(trained["export"], tmp_path / "export")
    (tmp_path / "secret").write_bytes(SECRET)
    return tmp_path / "export"


def _flip(path: Path, fraction: float) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * fraction)] ^= 0x10
    path.write_bytes(bytes(data))


def _resume_argv(run: Path, store: Path) -> list[str]:
    from .conftest import TINY_TRAIN

    flags = [f"--{k.replace('_', '-')}={v}" for k, v in TINY_TRAIN.items()]
    return ["train", str(store), f"--out={run}", "--resume", *flags]


@pytest.mark.parametrize("fraction", [0.5, 0.97])  # the weights; the optimiser state (written last)
def test_a_flipped_bit_in_a_checkpoint_stops_resume_with_one_line(
    run_copy: Path, trained: dict[str, Path], fraction: float, capsys
) -> None:
    state = latest_checkpoint(run_copy) / "state.pt"  # type: ignore[operator]
    _flip(state, fraction)
    with pytest.raises(ResumeError, match=r"state\.pt: checksum mismatch"):
        load_checkpoint(state.parent)
    code, lines = cli(_resume_argv(run_copy, trained["store"]), capsys)
    assert code == 2 and len(lines) == 1 and "state.pt: checksum mismatch" in lines[0], lines


def _forge(checkpoint: Path, tensors: Any, raw: bytes | None = None) -> None:
    """Replace state.pt with ``tensors`` (or ``raw`` bytes) and re-sign meta.json as raykit would."""
    buffer = io.BytesIO()
    if raw is None:
        torch.save(tensors, buffer)
    data = buffer.getvalue() if raw is None else raw
    (checkpoint / "state.pt").write_bytes(data)
    meta = json.loads((checkpoint / "meta.json").read_text())
    meta.pop("meta_sha256")
    meta["files"]["state.pt"] = {"bytes": len(data), "sha256": sha256_bytes(data)}
    (checkpoint / "meta.json").write_bytes(
        json_bytes({**meta, "meta_sha256": sha256_bytes(json_bytes(meta))})
    )


def _bad_states(good: dict[str, Any]) -> dict[str, Any]:
    nan = {**good, "field": {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                             for k, v in good["field"].items()}}  # fmt: skip
    shape = {**good, "field": {k: v[..., :1] if v.ndim else v for k, v in good["field"].items()}}
    return {"empty": b"", "not a dict": [1, 2], "no groups": {}, "NaN": nan, "wrong shape": shape}


@pytest.mark.parametrize("case", ["empty", "not a dict", "no groups", "NaN", "wrong shape"])
def test_bad_checkpoints_give_one_line(run_copy: Path, trained: dict[str, Path], case: str, capsys) -> None:
    checkpoint = latest_checkpoint(run_copy)
    assert checkpoint is not None
    state = _bad_states(load_checkpoint(checkpoint)[1])[case]
    _forge(checkpoint, state, state if isinstance(state, bytes) else None)
    code, lines = cli(_resume_argv(run_copy, trained["store"]), capsys)
    assert code == 2 and len(lines) == 1 and str(checkpoint) in lines[0], lines
    code, lines = cli(["render", str(run_copy), "--split=test"], capsys)
    assert code == 2 and len(lines) == 1 and str(checkpoint) in lines[0], lines


def test_edited_checkpoint_metadata_gives_one_line(run_copy: Path, trained: dict[str, Path], capsys) -> None:
    checkpoint = latest_checkpoint(run_copy)
    assert checkpoint is not None
    meta = json.loads((checkpoint / "meta.json").read_text())
    meta["step"] = 1000
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    code, lines = cli(_resume_argv(run_copy, trained["store"]), capsys)
    assert code == 2 and len(lines) == 1 and "meta.json" in lines[0] and "meta_sha256" in lines[0], lines


@pytest.mark.parametrize("kind", ["link-out", "fifo", "zero"])
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "export.json"])
def test_export_files_that_are_links_fifos_or_devices(
    export_copy: Path, kind: str, name: str, capsys
) -> None:
    replace_with(export_copy / name, kind, export_copy.parent / "secret")
    with pytest.raises(ExportError) as caught:
        load_export(export_copy)
    assert name in str(caught.value) and secret_digest()[:12] not in str(caught.value)
    code, lines = cli(["export", "--verify", str(export_copy)], capsys)
    assert code == 2 and len(lines) == 1 and name in lines[0], lines
    argv = [
        "render",
        "--model",
        str(export_copy),
        "--cameras",
        "x.json",
        "--out",
        str(export_copy.parent / "r"),
    ]
    code, lines = cli(argv, capsys)
    assert code == 2 and len(lines) == 1 and name in lines[0], lines


@pytest.mark.parametrize(
    "field, value",
    [
        ("step", "abc"),
        ("step", -1),
        ("store_fingerprint", 5),
        ("scene", None),
        ("scene.world_from_source", [[1, 0], [0, 1]]),
        ("scene.world_from_source", [[0.0] * 4] * 4),
        ("scene.near", "x"),
        ("scene.aabb", [1, 2]),
        ("eval", {"test": {"psnr": "high", "images": []}}),
        ("state", []),
        ("state.n_tensors", 999),
        ("files", {"../secret": {"bytes": len(SECRET), "sha256": ""}}),
        ("files", {"model.safetensors": {"bytes": "big", "sha256": ""}, "config.json": {}}),
    ],
)
def test_edited_export_manifest_fields_give_one_line(
    export_copy: Path, field: str, value: Any, capsys
) -> None:
    manifest = json.loads((export_copy / "export.json").read_text())
    node = manifest
    *parents, last = field.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    (export_copy / "export.json").write_text(json.dumps(manifest))
    code, lines = cli(["export", "--verify", str(export_copy)], capsys)
    assert code == 2 and len(lines) == 1 and "export.json" in lines[0], lines


def test_two_exports_of_one_run_are_byte_identical(trained: dict[str, Path], tmp_path: Path) -> None:
    for name in ("a", "b"):
        export_run(trained["run"], tmp_path / name)
    for name in ("model.safetensors", "config.json", "export.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    header = (tmp_path / "a" / "model.safetensors").read_bytes()
    n = int.from_bytes(header[:8], "little")
    metadata = json.loads(header[8 : 8 + n])["__metadata__"]
    assert list(metadata) == sorted(metadata)
    assert load_export(tmp_path / "a").step == 4
    assert os.path.getsize(tmp_path / "a" / "model.safetensors") > 0


def test_a_torn_log_line_does_not_stop_resume(run_copy: Path, trained: dict[str, Path], capsys) -> None:
    """A run killed while appending to log.jsonl leaves half a line: resume drops it and goes on."""
    with open(run_copy / "log.jsonl", "a") as log:
        log.write('{"step": 5, "loss": 0.')
    code, lines = cli(_resume_argv(run_copy, trained["store"]), capsys)
    assert code == 0, lines
    steps = [json.loads(line)["step"] for line in (run_copy / "log.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 4


def test_a_run_folder_cannot_lend_its_export_files_from_outside(run_copy: Path, tmp_path: Path) -> None:
    """``raykit export RUN``: run.json and eval.json are read only from inside RUN (an export embeds
    run.json), and a checkpoint directory that is a symlink out of RUN is not a checkpoint of RUN."""
    (tmp_path / "secret.json").write_text('{"secret": "outside"}')
    for name in ("run.json", "eval.json"):
        original = (run_copy / name).read_bytes()
        (run_copy / name).unlink()
        os.symlink(tmp_path / "secret.json", run_copy / name)
        with pytest.raises(ExportError, match=f"'{name}' leads outside the folder"):
            export_run(run_copy, tmp_path / f"export-{name}")
        (run_copy / name).unlink()
        (run_copy / name).write_bytes(original)
    newest = latest_checkpoint(run_copy)
    assert newest is not None
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(newest, elsewhere)
    os.symlink(elsewhere, run_copy / "checkpoints" / "step-99999999")
    assert latest_checkpoint(run_copy) == newest
