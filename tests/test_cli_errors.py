"""Every subcommand on a table of bad inputs: exit status 2, one ``raykit: error:`` line per problem,
no traceback, nothing half-written left behind."""

from __future__ import annotations

import json
import socket
import traceback
from pathlib import Path

import pytest

import raykit.cli
from raykit.store.schema import FORMAT_NAME
from raykit.testing import render_scene, write_blender


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Blender capture, a store converted from it, a plain file, and two runs (one with a corrupt
    eval.json)."""
    root = tmp_path_factory.mktemp("cli_errors")
    write_blender(render_scene("tiny", seed=0), root / "cap")
    assert raykit.cli.main(["convert", str(root / "cap"), str(root / "s.zarr"), "--no-progress"]) == 0
    (root / "afile").write_text("not a store\n")
    (root / "afile.zarr.partial").write_text("a file that only looks like raykit's work folder\n")
    for name, text in (("run_a", '{"splits": {}}'), ("run_b", '{"splits": {"test": ')):
        (root / name).mkdir()
        (root / name / "eval.json").write_text(text)
    (root / "bad_type").mkdir()
    (root / "bad_type" / "eval.json").write_text("[1, 2]")
    return root


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# (argv with {w} for the work folder, one needle per expected error line)
CASES = [
    (["convert", "{w}/cap", "{w}/afile"], ["afile: exists and is a file, not a raykit store"]),
    (["convert", "{w}/cap", "{w}/afile", "--overwrite"], ["afile: exists and is a file"]),
    (["convert", "{w}/cap", "/proc/raykit-test.zarr"], ["/proc/raykit-test.zarr.lock: cannot create"]),
    (["convert", "{w}/cap", "{w}/neg.zarr", "--seed", "-1"], ["seed: expected an integer >= 0, got -1"]),
    (["convert", "{w}/cap", "{w}/s.zarr"], ["a store already exists there (pass --overwrite"]),
    (["convert", "{w}/cap", "{w}/afile.zarr"], ["afile.zarr.partial: exists and is not a folder"]),
    (["convert", "{w}/nowhere", "{w}/x.zarr"], ["capture not found"]),
    (["convert", "{w}/cap", "{w}/x.zarr", "--downscale", "0"], ["downscale: expected a positive integer"]),
    (["copy", "{w}/s.zarr", "{w}/afile", "--format", "wds"], ["afile: exists and is a file"]),
    (["copy", "{w}/afile", "{w}/c.zarr", "--format", "wds"], ["afile is a file (a store is a folder"]),
    (["info", "http://127.0.0.1:{port}/x.zarr"], ["manifest.json: cannot read"]),
    (["info", "foo://x"], ["foo://x: cannot open (Protocol not known: foo)"]),
    (["info", "{w}/afile"], ["not a raykit store: "]),
    (["info", "{w}/nowhere.zarr"], ["no such store"]),
    (["validate", "{w}/nowhere.zarr"], ["no such store"]),
    (["validate", "foo://x"], ["Protocol not known"]),
    (["bench", "{w}/afile"], ["not a raykit store"]),
    (["train", "{w}/s.zarr", "--out", "{w}/afile"], ["afile: --out is a file"]),
    (["train", "{w}/nowhere.zarr", "--out", "{w}/run"], ["no such store"]),
    (["render", "{w}/nowhere"], ["no checkpoint to render from"]),
    (["compare", "{w}/run_a", "{w}/run_b"], ["run_b/eval.json:1: malformed JSON"]),
    (["compare", "{w}/run_a", "{w}/bad_type"], ["bad_type/eval.json: expected an object with 'splits'"]),
    (["compare", "{w}/run_a", "{w}/nowhere"], ["no eval.json"]),
    (["scene", "make", "{w}/afile"], ["afile"]),
    (["demo", "--out", "{w}/afile", "--quick"], ["afile"]),
]


@pytest.mark.parametrize(("argv", "needles"), CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_bad_input_is_one_line_per_problem(work: Path, capsys, argv: list[str], needles: list[str]) -> None:
    args = [a.format(w=work, port=_closed_port()) for a in argv]
    if args[0] == "convert":
        args.append("--no-progress")
    before = sorted(p.name for p in work.iterdir())
    try:
        status = raykit.cli.main(args)
    except BaseException:  # a traceback the user would have seen
        pytest.fail(f"raykit {' '.join(args)} raised:\n{traceback.format_exc()}")
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2, err
    assert "Traceback" not in err
    assert len(lines) == len(needles), lines
    for line, needle in zip(lines, needles, strict=True):
        assert line.startswith("raykit: error: ") and needle in line, (needle, line)
    assert sorted(p.name for p in work.iterdir()) == before  # no .partial, no half-made run folder


def test_unreadable_plan_of_an_interrupted_write_is_reported_and_replaced(work: Path, capsys) -> None:
    """A corrupt or empty ``DST.partial/plan.json`` no longer blocks the next write (with or without
    --overwrite): a warning names it and the write starts again."""
    for text, flags in (("", []), ('{"key": ', ["--overwrite"]), ("[]", ["--overwrite"])):
        dst = work / "p.zarr"
        (work / "p.zarr.partial").mkdir()
        (work / "p.zarr.partial" / "plan.json").write_text(text)
        status = raykit.cli.main(["convert", str(work / "cap"), str(dst), "--no-progress", *flags])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 0, err
        assert len(err) == 1 and err[0].startswith("raykit: warning: ") and "plan.json: unreadable" in err[0]
        assert json.loads((dst / "manifest.json").read_text())["format"] == FORMAT_NAME
        assert not (work / "p.zarr.partial").exists()
