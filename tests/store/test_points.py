"""Sparse points: COLMAP ``points3D`` stored in the world frame, checksummed, in info/validate/copy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from raykit.colmap_io import read_model
from raykit.converters import convert
from raykit.errors import StoreCorruptError
from raykit.store import open_store
from raykit.store.cli import register
from raykit.store.points import POINTS_FILE
from raykit.store.validate import validate_store
from raykit.store.write import copy_store
from raykit.testing import render_scene, write_colmap


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="raykit")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


@pytest.fixture(scope="module")
def colmap_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("points")
    write_colmap(render_scene("tiny", seed=0), root / "cap", n_points=300)
    convert(root / "cap", root / "store", normalize="unit-box")
    return root / "cap", root / "store"


def test_points_are_the_models_in_the_world_frame(colmap_store: tuple[Path, Path]) -> None:
    cap, dst = colmap_store
    rec = read_model(cap / "sparse" / "0")
    store = open_store(dst)
    points = store.sparse_points()
    assert points is not None and len(points) == len(rec.points3d) == 300
    ids = sorted(rec.points3d)
    np.testing.assert_array_equal(points.point_id, ids)
    m = store.world_from_source
    source_xyz = np.array([rec.points3d[i].xyz for i in ids])
    np.testing.assert_allclose(points.xyz, source_xyz @ m[:3, :3].T + m[:3, 3], atol=1e-12)
    assert not np.allclose(m, np.eye(4))  # unit-box: a real similarity was applied
    np.testing.assert_array_equal(points.rgb, [rec.points3d[i].rgb for i in ids])
    np.testing.assert_array_equal(points.track_length, [len(rec.points3d[i].track) for i in ids])
    # The world-frame points project into the images that observe them, like the source points did.
    c2w = store.table.c2w[0]
    depth = (points.xyz - c2w[:3, 3]) @ c2w[:3, 2]
    assert float(np.median(depth)) > 0
    assert store.manifest["points"] == {"path": POINTS_FILE, "n_points": 300}
    assert POINTS_FILE in store.files


def test_info_validate_and_copy_cover_points(
    colmap_store: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _, dst = colmap_store
    assert _run(["info", str(dst), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"]["n_points"] == 300 and len(summary["points"]["bounds"]) == 2
    assert _run(["info", str(dst)]) == 0 and "300 sparse points" in capsys.readouterr().out
    assert validate_store(dst) == []
    copy = copy_store(dst, tmp_path / "copy", backend="wds")
    assert copy.files[POINTS_FILE] == open_store(dst).files[POINTS_FILE]
    assert copy.fingerprint == open_store(dst).fingerprint


def test_damaged_points_file_is_reported(colmap_store: tuple[Path, Path], tmp_path: Path) -> None:
    _, dst = colmap_store
    damaged = tmp_path / "damaged"
    copy_store(dst, damaged, backend="zarr")
    path = damaged / POINTS_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    problems = validate_store(damaged)
    assert len(problems) == 1 and POINTS_FILE in problems[0] and "checksum" in problems[0]
    with pytest.raises(StoreCorruptError, match=POINTS_FILE):
        _ = open_store(damaged).points


def test_stores_without_points_have_none(tmp_path: Path, records, scene) -> None:
    from raykit.store import write_store

    store = write_store(tmp_path / "s", records, scene=scene, chunk_rays=64)
    assert store.points is None and "points" not in store.manifest and POINTS_FILE not in store.files


def test_an_images_layout_store_keeps_the_points(colmap_store: tuple[Path, Path], tmp_path: Path) -> None:
    cap, dst = colmap_store
    convert(cap, tmp_path / "images", normalize="unit-box", layout="images")
    rays, images = open_store(dst), open_store(tmp_path / "images")
    assert images.layout("train") == "images"
    a, b = rays.sparse_points(), images.sparse_points()
    assert a is not None and b is not None
    np.testing.assert_array_equal(a.xyz, b.xyz)
    np.testing.assert_array_equal(a.rgb, b.rgb)
    assert images.manifest["points"] == rays.manifest["points"]
    assert validate_store(tmp_path / "images") == []


def test_a_copy_to_the_other_layout_keeps_the_points(colmap_store: tuple[Path, Path], tmp_path: Path) -> None:
    _, dst = colmap_store
    copy_store(dst, tmp_path / "images", backend="wds", layout="images")
    copy_store(tmp_path / "images", tmp_path / "rays", backend="zarr", layout="rays")
    src = open_store(dst).sparse_points()
    for path in (tmp_path / "images", tmp_path / "rays"):
        copied = open_store(path).sparse_points()
        assert src is not None and copied is not None
        np.testing.assert_array_equal(src.xyz, copied.xyz)


def test_from_table_reads_sliced_and_chunked_tables() -> None:
    """``SparsePoints.from_table`` takes each row's xyz and rgb of a sliced or multi-chunk table (as
    ``flatten`` would give them, without it)."""
    import pyarrow as pa

    from raykit.store.points import SparsePoints

    rng = np.random.default_rng(0)
    points = SparsePoints(
        np.arange(7),
        rng.random((7, 3)),
        rng.integers(0, 255, (7, 3)).astype(np.uint8),
        rng.random(7),
        np.arange(7),
    )
    table = points.to_table()
    chunked = pa.concat_tables([table.slice(1, 2), table.slice(4, 3)])
    for part, rows in ((table.slice(2, 4), slice(2, 6)), (chunked, [1, 2, 4, 5, 6])):
        got = SparsePoints.from_table(part)
        assert np.array_equal(got.xyz, points.xyz[rows]) and np.array_equal(got.rgb, points.rgb[rows])
        assert np.array_equal(got.point_id, points.point_id[rows])
