from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import raykit.fileio
from raykit.fileio import (
    UnsafeOutputError,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    bytes_record,
    file_record,
    punch_hole,
    record_size,
    replace_dir,
    sha256_bytes,
    sha256_file,
)


def test_atomic_write_json_round_trip(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "m.json"
    atomic_write_json(target, {"b": 1, "a": [1, 2]})
    assert json.loads(target.read_text()) == {"a": [1, 2], "b": 1}
    assert sorted(p.name for p in target.parent.iterdir()) == ["m.json"]


def test_failed_write_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise RuntimeError("crash mid-write")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_nan_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "n.json", {"x": float("nan")})
    assert list(tmp_path.iterdir()) == []


def test_hashes_agree(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000
    (tmp_path / "d").write_bytes(data)
    assert sha256_file(tmp_path / "d") == sha256_bytes(data) == hashlib.sha256(data).hexdigest()


def test_written_file_has_default_mode(tmp_path: Path) -> None:
    import os

    umask = os.umask(0)
    os.umask(umask)
    atomic_write_json(tmp_path / "m.json", {})
    assert (tmp_path / "m.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_pieces_are_written_in_order_without_sync(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "shard"
    atomic_write_bytes(path, [b"ab", memoryview(b"cd"), b"e"], sync=False)
    assert path.read_bytes() == b"abcde"
    assert [p.name for p in path.parent.iterdir()] == ["shard"]


def test_atomic_directory_replaces_and_cleans_up(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    with atomic_path(final, directory=True) as tmp:
        (tmp / "a").write_text("1")
    with atomic_path(final, directory=True) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["b"]
    with pytest.raises(RuntimeError), atomic_path(final, directory=True) as tmp:
        (tmp / "c").write_text("3")
        raise RuntimeError("killed mid-write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert sorted(p.name for p in final.iterdir()) == ["b"]


def _folder(path: Path, **files: str) -> Path:
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
def test_replace_dir_swaps_in_the_new_folder_and_removes_the_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    if not exchange:  # a system without renameat2: the old folder is renamed aside first
        monkeypatch.setattr(raykit.fileio, "libc_function", lambda name, *args: None)
    dst = tmp_path / "out"
    replace_dir(_folder(tmp_path / "a", x="1"), dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    replace_dir(_folder(tmp_path / "b", y="2"), dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no old folder, no source left
    assert sorted(p.name for p in dst.iterdir()) == ["y"]


def test_replace_dir_restores_the_old_folder_when_the_rename_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(raykit.fileio, "libc_function", lambda name, *args: None)
    dst = _folder(tmp_path / "out", x="1")
    with pytest.raises(FileNotFoundError):
        replace_dir(tmp_path / "missing", dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (dst / "x").read_text() == "1"


@pytest.mark.parametrize("kind", ["symlink to a folder", "dangling symlink", "file"])
def test_replace_dir_refuses_what_is_not_a_real_folder(tmp_path: Path, kind: str) -> None:
    target = _folder(tmp_path / "elsewhere", keep="me")
    dst = tmp_path / "out"
    if kind == "file":
        dst.write_text("data")
    else:
        dst.symlink_to(target if kind == "symlink to a folder" else tmp_path / "gone")
    src = _folder(tmp_path / "new", x="1")
    with pytest.raises(UnsafeOutputError, match="not replaced"):
        replace_dir(src, dst)
    assert (src / "x").exists() and (target / "keep").read_text() == "me"
    assert dst.is_symlink() or dst.read_text() == "data"


def test_file_records_have_one_shape_and_old_records_still_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abcdef")
    record = file_record(path)
    assert record == {"size": 6, "sha256": sha256_bytes(b"abcdef")}
    assert bytes_record([b"abc", b"def"]) == bytes_record(b"abcdef") == record
    assert record_size(record) == 6
    assert record_size({"bytes": 6, "sha256": record["sha256"]}) == 6  # exports/checkpoints before
    for bad in ({}, {"size": -1}, {"size": True}, {"bytes": "6"}):
        assert record_size(bad) is None


def test_punch_hole_frees_blocks_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "scratch.bin"
    data = bytes(range(256)) * (1 << 14)  # 4 MiB
    path.write_bytes(data)
    before = path.stat().st_blocks
    if not punch_hole(path, 1000, 3 << 20):
        pytest.skip("this file system does not punch holes")
    after = path.read_bytes()
    assert path.stat().st_size == len(data) and path.stat().st_blocks < before
    assert after[:1000] == data[:1000] and after[1000 + (3 << 20) :] == data[1000 + (3 << 20) :]
    assert after[1000 : 1000 + (3 << 20)] == bytes(3 << 20)
    assert punch_hole(path, 0, 0) is False  # nothing to free
