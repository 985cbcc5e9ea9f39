"""``raykit poses`` end to end on the textured built-in scene: accuracy, resume, Ctrl-C, convert.

The photos are 24 renders (240 x 240) of the textured scene from two rings of cameras; pycolmap's
poses are compared with the true ones after the best similarity on camera centres.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pycolmap
import pytest
from PIL import Image

from raykit.cli import main
from raykit.colmap_io import read_model
from raykit.conventions import c2w_from_colmap
from raykit.converters import convert
from raykit.errors import ConfigError, ResumeError
from raykit.poses import sfm
from raykit.poses.align import pose_errors
from raykit.poses.estimate import PoseOptions, PoseSummary, estimate_poses
from raykit.store import open_store
from raykit.testing.photos import ScenePhotos, render_photos

N_VIEWS, SIZE = 24, 240
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shoot(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ScenePhotos, list[str]]:
    """The photos written as PNGs, the truth and their names (in pose order)."""
    photos = render_photos(N_VIEWS, SIZE)
    folder = tmp_path_factory.mktemp("shoot") / "photos"
    folder.mkdir()
    names = [f"view_{i:02d}.png" for i in range(N_VIEWS)]
    for name, image in zip(names, photos.images, strict=True):
        Image.fromarray(image).save(folder / name)
    return folder, photos, names


def _estimated_c2w(model: Path, names: list[str]) -> np.ndarray:
    by_name = {image.name: image for image in read_model(model).images.values()}
    return np.stack([c2w_from_colmap(np.array(by_name[n].qvec), np.array(by_name[n].tvec)) for n in names])


def _assert_accurate(model: Path, truth: np.ndarray, names: list[str]) -> None:
    rot_deg, centre_err, extent = pose_errors(_estimated_c2w(model, names), truth)
    assert np.median(rot_deg) <= 1.0, rot_deg
    assert np.median(centre_err) <= 0.02 * extent, centre_err / extent


def test_poses_match_the_true_poses_and_a_rerun_skips_every_stage(
    shoot: tuple[Path, ScenePhotos, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, photos, names = shoot
    out = tmp_path / "out"
    assert main(["poses", str(folder), str(out), "--threads", "2", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"registered {N_VIEWS} of {N_VIEWS} photos" in printed
    assert "mean reprojection error" in printed and "matcher exhaustive" in printed
    assert all(f"{stage} " in printed for stage in ("features", "matching", "mapping"))
    model = out / "sparse" / "0"
    assert sorted(i.name for i in read_model(model).images.values()) == names  # every image registered
    _assert_accurate(model, photos.c2w, names)
    assert (out / "images").is_symlink() and (out / "images").resolve() == folder.resolve()
    record = json.loads((out / "poses.json").read_text())
    assert record["summary"]["registered"] == names and record["summary"]["single_camera"] is True
    before = {p.name: p.read_bytes() for p in model.iterdir()}

    summary = estimate_poses(folder, out, PoseOptions(threads=2))
    assert summary.seconds == {} and summary.skipped == ("features", "matching", "mapping")
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


@pytest.mark.parametrize("single", [True, False])
def test_photos_enter_the_database_in_name_order_slice_by_slice_with_one_camera_when_shared(
    shoot: tuple[Path, ScenePhotos, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, single: bool
) -> None:
    folder, _, names = shoot
    monkeypatch.setattr(sfm, "_IMPORT_SLICE", 5)  # 24 photos: five slices
    database = tmp_path / "database.db"
    sfm.extract(
        database, folder, names, camera_model="SIMPLE_RADIAL", single=single, max_image_size=3200,
        max_features=8192, threads=2, progress=False,
    )  # fmt: skip
    db = pycolmap.Database.open(str(database))
    try:
        images = sorted(db.read_all_images(), key=lambda image: image.image_id)
        assert [image.name for image in images] == names
        assert all(db.exists_keypoints(image.image_id) for image in images)
        assert db.num_cameras() == (1 if single else N_VIEWS) and db.num_frames() == N_VIEWS
    finally:
        db.close()
    with sfm.database_counter(database, "features") as poll:  # the progress bar's count
        assert poll() == N_VIEWS


def _outcome(out: Path) -> tuple[list[str], list[tuple[int, int, bytes]], dict[str, bytes]]:
    """Image names in id order, every verified pair's row, and the model's files."""
    with contextlib.closing(sqlite3.connect(f"file:{out / 'database.db'}?mode=ro", uri=True)) as con:
        ids = [name for (name,) in con.execute("SELECT name FROM images ORDER BY image_id")]
        pairs = con.execute(
            "SELECT pair_id, config, data FROM two_view_geometries ORDER BY pair_id"
        ).fetchall()
    return ids, pairs, {p.name: p.read_bytes() for p in (out / "sparse" / "0").iterdir()}


def test_the_same_photos_and_options_give_the_same_model_in_a_new_or_a_rerun_folder(
    shoot: tuple[Path, ScenePhotos, list[str]], tmp_path: Path
) -> None:
    """Two threads extracting, matching and verifying: byte for byte the same database rows and model.

    (pycolmap numbers photos as its extraction threads finish and seeds each verification thread
    from the clock; raykit imports the photos in name order first and seeds the verification.
    Brute-force matching here: exact by construction, where FAISS's differed in a few stress runs.)
    A folder rerun with another seed or a matcher that pairs fewer photos ends as a new folder would.
    """
    folder, _, names = shoot

    def run(name: str, **options: Any) -> tuple[PoseSummary, tuple[Any, ...]]:
        opts = PoseOptions(threads=2, brute_force_matching=True, **options)
        return estimate_poses(folder, tmp_path / name, opts), _outcome(tmp_path / name)

    _, first = run("a")
    _, again = run("b")
    assert first[0] == names  # numbered in name order
    assert len(first[1]) == N_VIEWS * (N_VIEWS - 1) // 2 and again == first
    summary, reseeded = run("a", seed=1)
    assert set(summary.seconds) == {"matching", "mapping"} and summary.skipped == ("features",)
    assert reseeded[1] != first[1]  # verified again, under seed 1
    fresh = run("c", seed=1)[1]
    assert fresh[1] == reseeded[1] and fresh[2] == reseeded[2]
    summary, fewer = run("b", matcher="sequential")
    assert set(summary.seconds) == {"matching", "mapping"} and len(fewer[1]) < len(first[1])
    fresh = run("d", matcher="sequential")[1]
    assert fresh[1] == fewer[1]  # the same verified pairs
    assert fresh[2] == fewer[2]  # the same model


def test_other_feature_options_need_restart_and_other_matcher_reruns_matching(
    shoot: tuple[Path, ScenePhotos, list[str]], tmp_path: Path
) -> None:
    folder, photos, names = shoot
    out = tmp_path / "out"
    exact = {"threads": 2, "brute_force_matching": True}  # exact matches: the same on every run
    estimate_poses(folder, out, PoseOptions(matcher="sequential", **exact))
    with pytest.raises(ResumeError, match=r"max_features 8192 -> 2048.*--overwrite"):
        estimate_poses(folder, out, PoseOptions(max_features=2048, **exact))
    assert (out / "sparse" / "0").is_dir()  # refused: nothing discarded
    summary = estimate_poses(folder, out, PoseOptions(matcher="exhaustive", **exact))
    assert set(summary.seconds) == {"matching", "mapping"} and summary.skipped == ("features",)
    summary = estimate_poses(folder, out, PoseOptions(max_features=2048, **exact), restart=True)
    assert set(summary.seconds) == {"features", "matching", "mapping"}
    assert len(summary.registered) == N_VIEWS
    _assert_accurate(out / "sparse" / "0", photos.c2w, names)


def test_out_must_be_new_empty_or_made_by_raykit(
    shoot: tuple[Path, ScenePhotos, list[str]], tmp_path: Path
) -> None:
    folder, _, _ = shoot
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not made by raykit poses"):
        estimate_poses(folder, tmp_path, PoseOptions(threads=2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def _features_in_database(database: Path) -> int:
    """Photos whose keypoints are in, read while another process writes; 0 while absent or locked.

    (The photos themselves enter the database first, all at once: their keypoints mark the
    extraction's progress.) Only for a database that no pycolmap in this process has open (two
    SQLite libraries in one process must not share a database file); in-process counts go through
    :func:`_count_features`.
    """
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=0.5)) as con:
            return int(con.execute("SELECT count(*) FROM keypoints").fetchone()[0])
    except sqlite3.Error:
        return 0


def _count_features(database: Path) -> tuple[int, int]:
    """(photos in the database, photos with their keypoints)."""
    db = pycolmap.Database.open(str(database))
    try:
        images = db.read_all_images()
        return len(images), sum(1 for image in images if db.exists_keypoints(image.image_id))
    finally:
        db.close()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_extraction_leaves_a_resumable_state(
    shoot: tuple[Path, ScenePhotos, list[str]], tmp_path: Path
) -> None:
    folder, photos, names = shoot
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "raykit", "poses", str(folder), str(out), "--threads", "1", "--no-progress"]
    # SIGINT at its default in the run: a test suite started in the background (``&`` without job
    # control) ignores SIGINT, and the run would inherit that and never see the Ctrl-C
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint
    )
    # The run holds still (SIGSTOP) while the test counts the photos with features; once some but not all
    # have them, the Ctrl-C is sent while it is stopped, so it lands in the extraction the test saw,
    # whatever the load.
    deadline, seen = time.monotonic() + 120, 0
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(signal.SIGSTOP)
        seen = _features_in_database(out / "database.db")
        if 0 < seen < N_VIEWS:
            proc.send_signal(signal.SIGINT)  # pending until the run continues
            proc.send_signal(signal.SIGCONT)
            break
        proc.send_signal(signal.SIGCONT)
        assert seen < N_VIEWS, "the extraction ended between two counts of the test"
        time.sleep(0.01)
    assert 0 < seen < N_VIEWS, f"no count during the extraction (last {seen}; run rc {proc.poll()})"
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "raykit: interrupted" in err
    photos_in, interrupted_at = _count_features(out / "database.db")
    assert photos_in == N_VIEWS and 0 < interrupted_at < N_VIEWS
    record = json.loads((out / "poses.json").read_text())
    assert record["stages"]["features"]["done"] is False and not (out / "sparse" / "0").exists()

    summary = estimate_poses(folder, out, PoseOptions(threads=2))
    assert "features" in summary.seconds and len(summary.registered) == N_VIEWS
    assert _count_features(out / "database.db") == (N_VIEWS, N_VIEWS)  # resumed: no photo twice
    _assert_accurate(out / "sparse" / "0", photos.c2w, names)


def test_convert_from_photos_with_undistort(
    shoot: tuple[Path, ScenePhotos, list[str]], tmp_path: Path
) -> None:
    folder, _, _ = shoot
    dst = tmp_path / "scene.zarr"
    opts = PoseOptions(undistort=True)
    store = convert(folder, dst, source="photos", poses=opts, threads=2, split="every:8")
    cache = tmp_path / "scene.zarr.poses"
    assert (cache / "sparse" / "0" / "cameras.bin").is_file()
    assert (cache / "undistorted" / "sparse" / "cameras.bin").is_file()
    assert sum(info.n_images for info in store.splits.values()) == N_VIEWS
    assert set(store.table_arrow.column("model").to_pylist()) == {"PINHOLE"}
    assert open_store(dst, verify=True).fingerprint == store.fingerprint


def test_convert_cli_from_photos(shoot: tuple[Path, ScenePhotos, list[str]], tmp_path: Path) -> None:
    folder, _, _ = shoot
    dst = tmp_path / "scene.zarr"
    argv = ["convert", str(folder), str(dst), "--from", "photos", "--threads", "2", "--no-progress"]
    assert main([*argv, "--max-features", "4096", "--camera-model", "SIMPLE_PINHOLE"]) == 0
    record = json.loads((tmp_path / "scene.zarr.poses" / "poses.json").read_text())
    assert record["stages"]["features"]["key"]["max_features"] == 4096
    store = open_store(dst)
    assert sum(info.n_images for info in store.splits.values()) == N_VIEWS
    assert set(store.table_arrow.column("model").to_pylist()) == {"SIMPLE_PINHOLE"}


def test_unregistered_photos_are_listed_and_left_out(
    shoot: tuple[Path, ScenePhotos, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, photos, names = shoot
    mixed = tmp_path / "mixed"
    shutil.copytree(folder, mixed)
    noise = np.random.default_rng(5).integers(0, 256, (2, SIZE, SIZE, 3), dtype=np.uint8)
    for i, image in enumerate(noise):
        Image.fromarray(image).save(mixed / f"zz_stray_{i}.png")
    out = tmp_path / "out"
    assert main(["poses", str(mixed), str(out), "--threads", "2", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"registered {N_VIEWS} of {N_VIEWS + 2} photos" in printed
    assert "not registered (left out): zz_stray_0.png, zz_stray_1.png" in printed
    assert sorted(i.name for i in read_model(out / "sparse" / "0").images.values()) == names
    _assert_accurate(out / "sparse" / "0", photos.c2w, names)
