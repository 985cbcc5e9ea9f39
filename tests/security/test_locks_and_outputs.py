"""Lock files and outputs on a shared machine (issue 60): a planted lock file (a symlink, a hard link, a
FIFO, another user's file) is refused in one line and never written through; an output never replaces
a FIFO, a device, a folder or one of the command's own inputs."""

from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import raykit.cli
from raykit.errors import ConfigError, StoreError
from raykit.fileio import (
    UnsafeOutputError,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    check_output,
    output_problem,
)
from raykit.locks import lock_owner, read_lock, store_lock
from raykit.profiling.cli import BenchConfig

SECRET = b"the victim's file: a lock must never truncate nor write it\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(SECRET)
    return victim


def _plant(lock: Path, kind: str, victim: Path) -> None:
    lock.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "dangling symlink":
        lock.symlink_to(victim.parent / "created-through-the-link")
    elif kind == "hard link":
        os.link(victim, lock)
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "folder":
        lock.mkdir()


KINDS = ["symlink", "dangling symlink", "hard link", "fifo", "folder"]


@pytest.mark.parametrize("kind", KINDS)
def test_store_lock_never_writes_through_a_planted_lock(tmp_path: Path, kind: str) -> None:
    victim = _victim(tmp_path)
    dst = tmp_path / "out"
    _plant(tmp_path / "out.lock", kind, victim)
    with pytest.raises(StoreError) as caught, store_lock(dst):
        pytest.fail("the lock was taken")
    message = str(caught.value)
    assert "\n" not in message and "out.lock" in message
    assert victim.read_bytes() == SECRET and stat.S_IMODE(victim.stat().st_mode) != 0
    assert not (tmp_path / "created-through-the-link").exists()
    assert os.path.lexists(tmp_path / "out.lock")  # left as it was, for its owner to see


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_store_lock_refuses_another_users_lock_file(tmp_path: Path) -> None:
    lock = tmp_path / "out.lock"
    lock.write_bytes(SECRET)
    os.chown(lock, 54321, 54321)
    with pytest.raises(StoreError, match="owned by uid 54321"), store_lock(tmp_path / "out"):
        pytest.fail("the lock was taken")
    assert lock.read_bytes() == SECRET


def test_store_lock_still_takes_over_its_own_stale_lock(tmp_path: Path) -> None:
    (tmp_path / "out.lock").write_text('{"pid": 1, "host": "elsewhere"}')
    with pytest.warns(Warning, match="stale lock"), store_lock(tmp_path / "out") as path:
        assert read_lock(path)["pid"] == os.getpid() and lock_owner(path) is not None
    assert not (tmp_path / "out.lock").exists()


def test_reading_a_planted_lock_never_blocks(tmp_path: Path) -> None:
    """``raykit info`` looks a lock's owner up: a lock that is a symlink to a FIFO is not opened."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "out.lock").symlink_to(tmp_path / "pipe")
    found: list[object] = []
    reader = threading.Thread(target=lambda: found.append((read_lock(tmp_path / "out.lock"),)), daemon=True)
    reader.start()
    reader.join(30)
    assert found == [({},)], "read_lock blocked on a FIFO behind a symlink"
    assert lock_owner(tmp_path / "out.lock") is None


def _spec(path: Path) -> Path:
    path.write_text(
        'seeds = [0]\n[grid]\nsampler = ["stratified"]\n[[captures]]\nscene = "tiny"\nname = "t"\n'
    )
    return path


@pytest.mark.parametrize("command", ["run", "sweep", "convert"])
def test_commands_refuse_a_symlinked_lock_in_one_line(tmp_path: Path, capsys, command: str) -> None:
    """``raykit run`` (OUT/run.lock), ``raykit sweep`` (OUT/sweep.lock) and ``raykit convert``
    (DST.lock): one ``raykit: error:`` line naming the lock, exit status 2, the target untouched."""
    victim = _victim(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    if command == "convert":
        from raykit.testing import render_scene, write_blender

        write_blender(render_scene("tiny", seed=0), src)
        lock, argv = (
            tmp_path / "s.zarr.lock",
            ["convert", str(src), str(tmp_path / "s.zarr"), "--no-progress"],
        )
    elif command == "run":
        lock, argv = tmp_path / "out" / "run.lock", ["run", str(src), str(tmp_path / "out")]
    else:
        spec = _spec(tmp_path / "spec.toml")
        lock, argv = tmp_path / "out" / "sweep.lock", ["sweep", str(spec), str(tmp_path / "out")]
    _plant(lock, "symlink", victim)
    status = raykit.cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2, lines
    assert len(lines) == 1 and lines[0].startswith("raykit: error: ") and str(lock) in lines[0], lines
    assert "symlink" in lines[0]
    assert victim.read_bytes() == SECRET and lock.is_symlink()


# ---- outputs ---------------------------------------------------------------------------------------


def _specials(tmp_path: Path) -> dict[str, Path]:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link-to-fifo").symlink_to(tmp_path / "fifo")
    found = {
        "fifo": tmp_path / "fifo",
        "folder": tmp_path / "folder",
        "link to a fifo": tmp_path / "link-to-fifo",
    }
    if os.geteuid() == 0:  # a device node inside the temporary folder (never a system one)
        os.mknod(tmp_path / "device", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        found["device"] = tmp_path / "device"
    return found


def _kinds(paths: dict[str, Path]) -> dict[str, int]:
    return {name: stat.S_IFMT(os.lstat(path).st_mode) for name, path in paths.items()}


def test_atomic_writes_never_replace_a_special_file(tmp_path: Path) -> None:
    specials = _specials(tmp_path)
    before = _kinds(specials)
    for name, path in specials.items():
        for write in (
            lambda p: atomic_write_bytes(p, b"x"),
            lambda p: atomic_write_json(p, {"a": 1}),
        ):
            with pytest.raises(UnsafeOutputError) as caught:
                write(path)
            assert str(path) in str(caught.value) and "\n" not in str(caught.value), name
    assert _kinds(specials) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in specials.values())  # no temp


def test_atomic_directory_never_replaces_a_file_or_a_link(tmp_path: Path) -> None:
    (tmp_path / "afile").write_bytes(SECRET)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for target in ("afile", "link"):
        with pytest.raises(UnsafeOutputError), atomic_path(tmp_path / target, directory=True) as tmp:
            (tmp / "x").write_bytes(b"x")
    assert (tmp_path / "afile").read_bytes() == SECRET and (tmp_path / "link").is_symlink()
    with atomic_path(tmp_path / "real", directory=True) as tmp:  # its own folder: replaced as before
        (tmp / "x").write_bytes(b"x")
    assert [p.name for p in (tmp_path / "real").iterdir()] == ["x"]


def test_symlink_to_a_regular_file_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "out.json").symlink_to(victim)
    atomic_write_json(tmp_path / "out.json", {"a": 1})
    assert victim.read_bytes() == SECRET and not (tmp_path / "out.json").is_symlink()


def test_an_output_is_never_one_of_the_inputs(tmp_path: Path) -> None:
    image = tmp_path / "in" / "r_0.png"
    image.parent.mkdir()
    image.write_bytes(SECRET)
    (tmp_path / "alias.png").symlink_to(image)
    os.link(image, tmp_path / "hard.png")
    for output in (image, tmp_path / "alias.png", tmp_path / "hard.png", tmp_path / "in" / "new.json"):
        folder_input = [tmp_path / "in"] if output.name == "new.json" else [image]
        with pytest.raises(UnsafeOutputError, match="one of this command's inputs"):
            check_output(output, inputs=folder_input)
    assert output_problem(tmp_path / "other.json", inputs=[image, tmp_path / "in"]) is None
    assert image.read_bytes() == SECRET


def _pngs(folder: Path, seeds: range) -> None:
    folder.mkdir(parents=True)
    for i in seeds:
        pixels = np.random.default_rng(i).integers(0, 256, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"r_{i}.png")


def test_evaluate_output_refuses_special_files_and_inputs(tmp_path: Path, capsys) -> None:
    _pngs(tmp_path / "pred", range(2))
    _pngs(tmp_path / "gt", range(2))
    (tmp_path / "specials").mkdir()
    specials = _specials(tmp_path / "specials")
    before = _kinds(specials)
    images = {p: p.read_bytes() for p in [*tmp_path.glob("pred/*"), *tmp_path.glob("gt/*")]}
    for output in [*specials.values(), tmp_path / "pred" / "r_0.png", tmp_path / "gt" / "r_1.png"]:
        argv = [
            "evaluate",
            str(tmp_path / "pred"),
            str(tmp_path / "gt"),
            "--no-lpips",
            "--output",
            str(output),
        ]
        status = raykit.cli.main(argv)
        lines = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and str(output) in lines[0], (output, lines)
    assert _kinds(specials) == before
    assert {p: p.read_bytes() for p in images} == images
    ok = tmp_path / "pred" / "results.json"  # beside the predictions, not one of them: written
    assert raykit.cli.main(["evaluate", str(tmp_path / "pred"), str(tmp_path / "gt"), "--no-lpips",
                            "--output", str(ok)]) == 0  # fmt: skip
    assert ok.is_file()


def test_bench_outputs_refuse_special_files_and_the_store(tmp_path: Path) -> None:
    specials = _specials(tmp_path)
    store = tmp_path / "s.zarr"
    store.mkdir()
    (store / "manifest.json").write_bytes(SECRET)
    for flag in ("json", "png"):
        for output in [*specials.values(), store / "manifest.json", store / "new.png"]:
            with pytest.raises(ConfigError, match=re.escape(f"--{flag} {output}")):
                BenchConfig(store=str(store), **{flag: str(output)})
    assert (store / "manifest.json").read_bytes() == SECRET
