"""Schema records, pid encoding, manifest header checks, and the info/validate/copy commands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raykit.errors import ConfigError, StoreCorruptError, StoreVersionError
from raykit.store import SceneInfo, SplitInfo, decode_pids, encode_pids, write_store
from raykit.store.cli import register
from raykit.store.files import check_manifest_header
from raykit.store.schema import FORMAT_NAME, FORMAT_VERSION


@given(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 50)), min_size=1, max_size=8), st.data())
def test_pids_round_trip(sizes: list[tuple[int, int]], data: st.DataObject) -> None:
    width = np.array([w for w, _ in sizes], dtype=np.int64)
    height = np.array([h for _, h in sizes], dtype=np.int64)
    offset = np.concatenate([[0], np.cumsum(width * height)[:-1]])
    image = np.array(data.draw(st.lists(st.integers(0, len(sizes) - 1), min_size=1, max_size=20)))
    x = np.array([data.draw(st.integers(0, int(width[i]) - 1)) for i in image])
    y = np.array([data.draw(st.integers(0, int(height[i]) - 1)) for i in image])
    pid = encode_pids(offset, width, image, np.stack([x, y], 1))
    assert pid.dtype == np.uint32
    back_image, back_pixel = decode_pids(offset, width, pid)
    np.testing.assert_array_equal(back_image, image)
    np.testing.assert_array_equal(back_pixel, np.stack([x, y], 1))


def test_records_round_trip_and_validate() -> None:
    scene = SceneInfo(
        "w", np.eye(4) * 2 + np.diag([0, 0, 0, -1]), "m", {"a": 1}, ((0, 0, 0), (1, 2, 3)), 0.1, 9
    )
    assert SceneInfo.from_dict(json.loads(json.dumps(scene.to_dict()))) == scene
    split = SplitInfo("train", 100, 2, 32, True, 7)
    assert SplitInfo.from_dict(split.to_dict()) == split and split.n_chunks == 4
    assert split.chunk_range(3) == (96, 100)
    with pytest.raises(ConfigError, match="4x4"):
        SceneInfo(world_from_source=np.eye(3))
    with pytest.raises(ConfigError, match="bounds"):
        SceneInfo(bounds=((1, 0, 0), (0, 0, 0)))


def test_manifest_header() -> None:
    check_manifest_header({"format": FORMAT_NAME, "format_version": FORMAT_VERSION}, "m.json")
    with pytest.raises(StoreVersionError, match=r"m\.json: store format version 99 is newer"):
        check_manifest_header({"format": FORMAT_NAME, "format_version": 99}, "m.json")
    with pytest.raises(StoreCorruptError, match="expected format"):
        check_manifest_header({"format": "zip", "format_version": 1}, "m.json")


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raykit")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_cli_info_validate_copy(
    tmp_path: Path, records, scene: SceneInfo, capsys: pytest.CaptureFixture
) -> None:
    store = write_store(tmp_path / "z", records, scene=scene, chunk_rays=64, shard_chunks=2)
    assert _run(["info", str(tmp_path / "z"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n_rays"] == sum(r.camera.width * r.camera.height for r in records)
    assert summary["cameras"]["n_images"] == len(records) and summary["bytes_per_ray"] > 0
    assert _run(["info", str(tmp_path / "z")]) == 0 and "bytes/ray" in capsys.readouterr().out
    assert _run(["copy", str(tmp_path / "z"), str(tmp_path / "w"), "--format", "wds"]) == 0
    assert store.fingerprint in capsys.readouterr().out
    assert _run(["validate", str(tmp_path / "w")]) == 0
    assert _run(["validate", str(tmp_path / "w"), "--deep"]) == 0
    shard = next(p for p in sorted((tmp_path / "w" / "wds").iterdir()))
    data = bytearray(shard.read_bytes())
    data[700] ^= 0xFF
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    for deep in ([], ["--deep"]):
        assert _run(["validate", str(tmp_path / "w"), *deep]) == 1
        out = capsys.readouterr().out
        assert "FAIL" in out and shard.name in out


def test_info_and_loader_workers_import_no_torch(tmp_path: Path, records, scene: SceneInfo) -> None:
    """``raykit info``, ``raykit validate`` and what a loader's worker process imports (its entry
    point, the chunk sources, reading a chunk) start without torch, which takes seconds to import."""
    import subprocess
    import sys

    write_store(tmp_path / "z", records, scene=scene, chunk_rays=64, shard_chunks=2)
    code = (
        "import contextlib, io, sys\n"
        "from raykit.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    status = main(['info', {str(tmp_path / 'z')!r}])\n"
        f"    status += main(['validate', {str(tmp_path / 'z')!r}])\n"
        "from raykit.loaders.processes import serve\n"
        "from raykit.loaders.source import StoreSource\n"
        "from raykit.loaders.fetcher import ChunkFetcher\n"
        "from raykit.store import open_store\n"
        f"raw = StoreSource(open_store({str(tmp_path / 'z')!r}), 'train').read_chunk(0)\n"
        "print(status, len(raw.pid), 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    status, rays, torch_imported = done.stdout.split()
    assert (status, torch_imported) == ("0", "False") and int(rays) > 0
