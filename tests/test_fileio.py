from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from raykit.fileio import (
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    punch_hole,
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
