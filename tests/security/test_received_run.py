"""``raykit run`` on a received store, and into folders that are not its own.

The report embeds only the PNGs the pipeline wrote in ``OUT/figures``, and every name from the store
lands in a code span that shows it literally (report.md) or as escaped text (report.html): an image
name that spells markdown image syntax cannot turn the report into a file reader. A folder that is not
a run folder of raykit's own is refused before anything in it is touched; a second ``raykit run`` into
an OUT that another one is writing is refused by ``OUT/run.lock``.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from raykit.cameras import Camera
from raykit.locks import store_lock
from raykit.store import ImageRecord, SceneInfo, write_store

from .conftest import SECRET, _pixels, cli

ROOT = Path(__file__).resolve().parents[2]
FLAGS = [
    "--batch-size=128", "--levels=2", "--base-resolution=8", "--max-resolution=16", "--features=2",
    "--hidden=16", "--n-samples=16", "--occ-resolution=16", "--march-steps=32", "--occ-warmup-steps=2",
    "--bench-batches=2", "--ckpt-every=2", "--log-every=2", "--device=cpu", "--threads=1", "--no-progress",
    "--samplers=occupancy", "--steps=4",
]  # fmt: skip


def _names(secret: Path) -> list[str]:
    """Test image names that spell markdown images of a file outside the store, or break code spans."""
    return [f"a/![x]({secret}).png", "b`![y](../../secret)`.png", "c``d\n\n![z](figures/../../secret).png"]


def _run(
    src: Path, out: Path, *flags: str, wait: bool = True
) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "raykit", "run", str(src), str(out), *FLAGS, *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="session")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``raykit run`` of a store whose test images have hostile names (one sampler, 4 steps)."""
    root = tmp_path_factory.mktemp("hostile")
    secret = root / "secret"
    secret.write_bytes(SECRET)
    camera = Camera("PINHOLE", 12, 8, (14.0, 14.0, 6.0, 4.0))
    names = [f"img_{i}.png" for i in range(4)] + _names(secret)
    records = []
    for i, name in enumerate(names):
        c2w = np.eye(4)
        c2w[:3, 3] = (0.1 * i, 0.0, 3.0)
        split = "train" if i < 4 else "test"
        records.append(
            ImageRecord(name, split, camera, c2w, 0.5, 6.0, f"mem://{i}", functools.partial(_pixels, i))
        )
    write_store(root / "store", records, scene=SceneInfo(), backend="zarr", chunk_rays=64)
    done = _run(root / "store", root / "out")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]  # type: ignore[union-attr]
    return {"root": root, "store": root / "store", "out": root / "out", "secret": secret}


def test_hostile_names_do_not_make_the_report_embed_anything(hostile_run: dict[str, Path]) -> None:
    out = hostile_run["out"]
    page = (out / "report.html").read_text()
    images = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]*)"', page)
    figures = {p.name for p in (out / "figures").iterdir()}
    assert len(images) == page.count("<img") == 5
    for _, data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG")
        assert any(base64.b64decode(data) == (out / "figures" / f).read_bytes() for f in figures)
    assert base64.b64encode(SECRET)[:16].decode() not in page
    for name in _names(hostile_run["secret"]):
        shown = name.replace("\n", "\\n")
        assert f"<code>{shown.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')}</code>" in page


def test_report_md_keeps_each_hostile_name_in_one_code_span(hostile_run: dict[str, Path]) -> None:
    markdown_it = pytest.importorskip("markdown_it")  # an independent CommonMark parser (via rich)
    text = (hostile_run["out"] / "report.md").read_text()
    html = markdown_it.MarkdownIt("commonmark").render(text)
    sources = re.findall(r'<img src="([^"]*)"', html)
    assert sources and all(re.fullmatch(r"figures/[a-z]+\.png", s) for s in sources), sources
    for name in _names(hostile_run["secret"]):
        code = name.replace("\n", "\\n").replace("&", "&amp;").replace('"', "&quot;")
        assert f"<code>{code}</code>" in html, name


def test_run_into_a_folder_that_is_not_a_run_folder_refuses(
    hostile_run: dict[str, Path], tmp_path: Path, capsys
) -> None:
    out = tmp_path / "mine"
    (out / "store").mkdir(parents=True)
    (out / "store" / "precious.txt").write_text("user data")
    (out / "runs" / "occupancy").mkdir(parents=True)
    before = sorted(str(p) for p in out.rglob("*"))
    code, lines = cli(["run", str(hostile_run["store"]), str(out), *FLAGS], capsys)
    assert code == 2 and len(lines) == 1 and "not a raykit run folder" in lines[0] and str(out) in lines[0]
    assert sorted(str(p) for p in out.rglob("*")) == before


def test_a_second_run_into_one_out_is_refused_and_a_stale_lock_taken_over(
    hostile_run: dict[str, Path], capsys
) -> None:
    out = hostile_run["out"]
    with store_lock(out, path=out / "run.lock", what="run folder"):  # another `raykit run` writing OUT
        started = time.monotonic()
        code, lines = cli(["run", str(hostile_run["store"]), str(out), *FLAGS], capsys)
        assert time.monotonic() - started < 10
    assert code == 2 and len(lines) == 1, lines
    assert "another process is writing this run folder" in lines[0] and f"pid {os.getpid()}" in lines[0]
    records = json.loads((out / "pipeline.json").read_text())["stages"]
    assert all(r["status"] == "done" for r in records.values())
    # A lock left by a killed run (its flock gone with it): reported, taken over, the run goes on; its
    # own run folder is accepted (and up to date).
    (out / "run.lock").write_text(json.dumps({"pid": 999999, "host": "gone", "started": "then"}))
    done = _run(hostile_run["store"], out)
    assert done.returncode == 0 and "stale lock" in done.stderr and "pid 999999" in done.stderr  # type: ignore[union-attr]
    assert "ran: nothing, all up to date" in done.stdout  # type: ignore[union-attr]
    assert not (out / "run.lock").exists()


def test_records_pointing_outside_out_are_refused(hostile_run: dict[str, Path], capsys) -> None:
    """A run folder's records name the files its later stages read: a forged path leading out of OUT
    (here the renders the report would paste into its figure) is refused with one line."""
    path = hostile_run["out"] / "pipeline.json"
    original = path.read_bytes()
    data = json.loads(original)
    data["stages"]["train-occupancy"]["result"]["renders"] = [str(hostile_run["secret"])]
    try:
        path.write_text(json.dumps(data))
        code, lines = cli(["run", str(hostile_run["store"]), str(hostile_run["out"]), *FLAGS], capsys)
    finally:
        path.write_bytes(original)
    errors = [line for line in lines if line.startswith("raykit: error:")]
    assert code == 2 and len(errors) == 1 and "must lie in" in errors[0], lines
    assert not lines[-1].startswith("==> render")
