"""Docs that run: every ``raykit`` command and ``--flag`` in README.md and docs/*.md exists in the CLI's
parsers, and every Python block of README.md runs (on the tiny built-in scene, as ``scene.zarr``).

A Python block that only illustrates is marked by an ``<!-- illustrative -->`` line just above its fence.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from raykit.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Flags of other programs that the docs name in a code span of their own (pip, dask, nerfstudio and
# nerfbaselines): each with the program it belongs to.
OTHER_FLAGS = {
    "--no-deps": "pip",
    "--resources": "dask worker",
    "--data": "ns-train",
    "--load-dir": "ns-train",
    "--data_factor": "nerfbaselines",
}
# The one change the README's blocks get here: a few steps instead of ten thousand.
README_STEPS = ("range(10_000)", "range(3)")


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _flags(child)
    return found


def _commands() -> dict[str, set[str]]:
    """Subcommand -> its flags (and those of its own subcommands)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: _flags(child) for name, child in sub.choices.items()}


def _mentions(text: str) -> list[str]:
    """What follows ``raykit`` in each command line of a code block (continuation lines joined, one
    per command of a ``&&``/``|``/``;`` chain) and in each code span that starts with ``raykit ``;
    a code span that is a flag alone (``--flag`` or ``--flag VALUE``) as it is."""
    found = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\|\||;|\|", line):
                match = re.match(r"(?:\$ )?(?:\S*/)?raykit (.*)", part.strip())
                found += [match.group(1)] if match else []
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    for span in (m.group(2).strip() for m in re.finditer(r"(`+)(.+?)\1", prose)):
        match = re.match(r"(?:\S*/)?raykit (.*)", span)
        found += [match.group(1)] if match else [span] if re.match(r"--[A-Za-z]", span) else []
    return found


def _unknown(text: str, commands: dict[str, set[str]]) -> list[str]:
    """Each mention of a subcommand or flag that the parsers do not have."""
    every = set().union(*commands.values())
    bad = []
    for mention in _mentions(text):
        try:
            words = shlex.split(mention, comments=True)
        except ValueError:
            words = mention.split()
        if not words:
            continue
        if words[0].startswith("--"):  # a flag alone in prose, or `raykit --help`
            flag = words[0].split("=")[0]
            bad += [] if flag in every | {"--help", "--version"} or flag in OTHER_FLAGS else [mention]
            continue
        # A placeholder (`raykit COMMAND --help`) is checked against every subcommand's flags.
        known = every | {"--help"} if words[0].isupper() else commands.get(words[0])
        if known is None:
            bad.append(f"raykit {mention}: no such subcommand")
            continue
        bad += [f"raykit {mention}: {w.split('=')[0]}" for w in words[1:] if w.startswith("--")
                and w.split("=")[0] not in known | {"--help"}]  # fmt: skip
    return bad


def test_every_command_and_flag_in_the_docs_exists() -> None:
    commands = _commands()
    mentions = {path.name: _mentions(path.read_text()) for path in DOCS}
    assert sum(len(m) for m in mentions.values()) > 100  # the scan sees the docs' commands
    assert {path.name: _unknown(path.read_text(), commands) for path in DOCS} == {p.name: [] for p in DOCS}


def test_the_check_finds_a_command_or_flag_that_does_not_exist() -> None:
    text = (
        "Run `raykit convert a b --materialize-rays`, or `--no-such-flag`, `--no-deps` (pip's).\n\n"
        "```bash\nraykit convert src dst --from colmap && .venv/bin/raykit frobnicate x\n"
        "raykit train scene.zarr --steps 2 \\\n    --no-such-option 3\n```\n"
    )
    assert _unknown(text, _commands()) == [
        "raykit frobnicate x: no such subcommand",
        "raykit train scene.zarr --steps 2      --no-such-option 3: --no-such-option",
        "raykit convert a b --materialize-rays: --materialize-rays",
        "--no-such-flag",
    ]


def _python_blocks(text: str) -> list[str]:
    return [
        m.group(2)
        for m in re.finditer(r"^(<!-- illustrative -->\n)?```python\n(.*?)^```", text, re.M | re.S)
        if not m.group(1)
    ]


@pytest.fixture(scope="module")
def scene_zarr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny built-in scene in its COLMAP form (sparse points included), converted to scene.zarr."""
    from raykit.converters import convert
    from raykit.testing import render_scene, write_colmap

    folder = tmp_path_factory.mktemp("readme")
    convert(write_colmap(render_scene("tiny", seed=0), folder / "capture"), folder / "scene.zarr")
    return folder


def test_every_python_block_of_the_readme_runs(scene_zarr: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 3 and sum(README_STEPS[0] in b for b in blocks) == 1
    monkeypatch.chdir(scene_zarr)
    namespace: dict[str, Any] = {"__name__": "readme"}
    try:
        for block in blocks:  # in order, in one namespace: later blocks use the store of the first
            exec(compile(block.replace(*README_STEPS), "README.md", "exec"), namespace)
    finally:
        if "loader" in namespace:
            namespace["loader"].close()  # its worker processes
    assert math.isfinite(namespace["loss"].item()) and os.path.getsize("ckpt.pt") > 0
    assert namespace["step"] == 2 and len(namespace["points"].xyz) > 0
    assert namespace["batch"].images.shape[0] == 1 and len(namespace["trainset"]) > 0
