"""COLMAP model I/O against pycolmap (the oracle): pycolmap writes -> raykit reads, and the reverse."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pycolmap
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raykit.camera_models import CAMERA_MODELS
from raykit.colmap_io import (
    ColmapCamera,
    ColmapImage,
    Reconstruction,
    read_model,
    write_model,
)
from raykit.errors import CameraError, SourceError

NAMES = ["a b/c d.png", "sub/dir/img 001.jpg", "x.png", "deep/er/Ünïcode name.PNG", "plain.jpg"]


def _random_params(model: str, rng: np.random.Generator, w: int, h: int) -> list[float]:
    spec = CAMERA_MODELS[model]
    params = list(rng.uniform(-0.05, 0.05, spec.num_params))
    for i in spec.focal_idx:
        params[i] = float(rng.uniform(40, 90))
    params[spec.pp_idx[0]], params[spec.pp_idx[1]] = w / 2 + rng.uniform(-2, 2), h / 2 + rng.uniform(-2, 2)
    return params


def make_pycolmap(seed: int = 0, spaces: bool = True) -> pycolmap.Reconstruction:
    """Several camera models, random poses, non-contiguous ids, tracks, trivial rigs and frames."""
    rng = np.random.default_rng(seed)
    rec = pycolmap.Reconstruction()
    models = list(CAMERA_MODELS)
    cam_ids = [int(i) for i in rng.choice(np.arange(1, 1000), size=len(models), replace=False)]
    for cid, model in zip(cam_ids, models, strict=True):
        w, h = int(rng.integers(20, 200)), int(rng.integers(20, 200))
        camera = pycolmap.Camera(model=model, width=w, height=h, params=_random_params(model, rng, w, h))
        camera.camera_id = cid
        rec.add_camera_with_trivial_rig(camera)
    image_ids = [int(i) for i in rng.choice(np.arange(1, 10_000), size=len(NAMES) * 2, replace=False)]
    for k, iid in enumerate(image_ids):
        name = NAMES[k % len(NAMES)].replace(".", f"_{k}.", 1)
        if not spaces:
            name = name.replace(" ", "_")
        image = pycolmap.Image(name=name, camera_id=cam_ids[k % len(cam_ids)], image_id=iid)
        n = int(rng.integers(0, 6))
        image.points2D = pycolmap.Point2DList([pycolmap.Point2D(rng.uniform(0, 50, 2)) for _ in range(n)])
        q = rng.normal(size=4)
        pose = pycolmap.Rigid3d(pycolmap.Rotation3d(q / np.linalg.norm(q)), rng.normal(size=3))
        rec.add_image_with_trivial_frame(image, pose)
    for _ in range(7):
        pid = rec.add_point3D(rng.normal(size=3), pycolmap.Track(), rng.integers(0, 256, 3).astype(np.uint8))
        for iid in rng.choice(image_ids, size=3, replace=False):
            image = rec.image(int(iid))
            free = [j for j, p in enumerate(image.points2D) if not p.has_point3D()]
            if free:
                rec.add_observation(pid, pycolmap.TrackElement(int(iid), free[0]))
    return rec


def assert_matches_pycolmap(ours: Reconstruction, ref: pycolmap.Reconstruction, names: bool = True) -> None:
    assert sorted(ours.cameras) == sorted(ref.cameras)
    for cid, cam in ref.cameras.items():
        mine = ours.cameras[cid]
        assert (mine.model, mine.width, mine.height) == (cam.model.name, cam.width, cam.height)
        assert mine.params == tuple(cam.params)
    assert sorted(ours.images) == sorted(ref.images)
    for iid, image in ref.images.items():
        mine = ours.images[iid]
        assert mine.name == image.name if names else mine.name.split()[0] == image.name
        assert mine.camera_id == image.camera_id
        xyzw = image.cam_from_world().rotation.quat
        assert np.array_equal(mine.qvec, [xyzw[3], *xyzw[:3]])
        assert np.array_equal(mine.tvec, image.cam_from_world().translation)
        assert np.allclose(mine.c2w(), np.vstack([image.cam_from_world().inverse().matrix(), [0, 0, 0, 1]]))
        assert mine.points2d is not None and mine.point3d_ids is not None
        assert np.array_equal(mine.points2d, np.array([p.xy for p in image.points2D]).reshape(-1, 2))
        ids = [p.point3D_id if p.has_point3D() else -1 for p in image.points2D]
        assert mine.point3d_ids.tolist() == ids
    assert sorted(ours.points3d) == sorted(ref.points3D)
    for pid, point in ref.points3D.items():
        mine_p = ours.points3d[pid]
        assert np.array_equal(mine_p.xyz, point.xyz) and mine_p.rgb == tuple(point.color)
        assert mine_p.track.tolist() == [[e.image_id, e.point2D_idx] for e in point.track.elements]
    assert sorted(ours.rigs) == sorted(ref.rigs) and sorted(ours.frames) == sorted(ref.frames)
    for fid, frame in ref.frames.items():
        assert ours.frames[fid].rig_id == frame.rig_id
        assert sorted(d[2] for d in ours.frames[fid].data_ids) == sorted(d.id for d in frame.data_ids)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[pycolmap.Reconstruction, Path, Path]:
    rec = make_pycolmap()
    root = tmp_path_factory.mktemp("pycolmap")
    (root / "bin").mkdir()
    (root / "txt").mkdir()
    rec.write_binary(str(root / "bin"))
    rec.write_text(str(root / "txt"))
    return rec, root / "bin", root / "txt"


@pytest.mark.parametrize("form", ["bin", "txt"])
def test_reads_what_pycolmap_writes(written: tuple, form: str) -> None:
    ref, bin_dir, txt_dir = written
    assert_matches_pycolmap(read_model(bin_dir if form == "bin" else txt_dir), ref)


def test_binary_and_text_read_equal(written: tuple) -> None:
    _, bin_dir, txt_dir = written
    assert read_model(bin_dir) == read_model(txt_dir)


@pytest.mark.parametrize("binary", [True, False])
def test_pycolmap_reads_what_raykit_writes(tmp_path: Path, binary: bool) -> None:
    # COLMAP's own text reader keeps only the first word of a name, so text uses names without spaces.
    ref = make_pycolmap(seed=1, spaces=binary)
    src = tmp_path / "src"
    src.mkdir()
    ref.write_binary(str(src))
    ours = read_model(src)
    write_model(ours, tmp_path / "out", binary=binary)
    back = pycolmap.Reconstruction(str(tmp_path / "out"))
    assert_matches_pycolmap(ours, back)
    assert read_model(tmp_path / "out") == ours


def test_non_trivial_rig_round_trips(tmp_path: Path) -> None:
    rec = pycolmap.Reconstruction()
    for cid in (1, 2, 3):
        rec.add_camera(
            pycolmap.Camera(model="PINHOLE", width=64, height=48, params=[50, 51, 32, 24], camera_id=cid)
        )
    rig = pycolmap.Rig(rig_id=10)
    cam = pycolmap.SensorType.CAMERA
    rig.add_ref_sensor(pycolmap.sensor_t(type=cam, id=1))
    rig.add_sensor(
        pycolmap.sensor_t(type=cam, id=2),
        pycolmap.Rigid3d(pycolmap.Rotation3d([0, 0, 0.6, 0.8]), [0.1, 0, 0]),
    )
    rig.add_sensor(pycolmap.sensor_t(type=cam, id=3), None)
    rec.add_rig(rig)
    frame = pycolmap.Frame(frame_id=20, rig_id=10)
    for cid, iid in ((1, 100), (2, 101)):
        frame.add_data_id(pycolmap.data_t(sensor_id=pycolmap.sensor_t(type=cam, id=cid), id=iid))
    frame.rig_from_world = pycolmap.Rigid3d(pycolmap.Rotation3d([0, 0, 0, 1]), [0, 0, 1])
    rec.add_frame(frame)
    for iid, cid in ((100, 1), (101, 2)):
        rec.add_image(pycolmap.Image(name=f"img{iid}.png", camera_id=cid, image_id=iid, frame_id=20))
    for binary in (True, False):
        out = tmp_path / str(binary)
        out.mkdir()
        rec.write_binary(str(out)) if binary else rec.write_text(str(out))
        ours = read_model(out)
        sensors = ours.rigs[10].sensors
        assert ours.rigs[10].ref_sensor == ("CAMERA", 1)
        assert [(s.sensor_id, s.qvec is None) for s in sensors] == [(2, False), (3, True)]
        assert np.allclose(sensors[0].qvec, [0.8, 0, 0, 0.6]) and np.allclose(sensors[0].tvec, [0.1, 0, 0])
        assert ours.frames[20].data_ids == (("CAMERA", 1, 100), ("CAMERA", 2, 101))
        write_model(ours, tmp_path / f"again{binary}", binary=not binary)
        assert read_model(tmp_path / f"again{binary}") == ours
        assert_matches_pycolmap(ours, pycolmap.Reconstruction(str(tmp_path / f"again{binary}")))


def test_legacy_model_without_rigs_and_frames(tmp_path: Path) -> None:
    rec = Reconstruction(
        {4: ColmapCamera(4, "SIMPLE_RADIAL", 30, 20, (25.0, 15.0, 10.0, 0.01))},
        {9: ColmapImage(9, (1.0, 0.0, 0.0, 0.0), (0.0, 0.0, 2.0), 4, "one.png")},
        {},
        {},
        {},
    )
    written = write_model(rec, tmp_path)
    assert sorted(p.name for p in written) == ["cameras.bin", "images.bin", "points3D.bin"]
    back = read_model(tmp_path)
    assert (
        back.cameras == rec.cameras and back.images[9].name == "one.png" and back.images[9].num_points2d == 0
    )
    ref = pycolmap.Reconstruction(str(tmp_path))
    assert ref.images[9].name == "one.png" and ref.cameras[4].params.tolist() == [25.0, 15.0, 10.0, 0.01]


def test_write_rejects_bad_camera(tmp_path: Path) -> None:
    rec = Reconstruction({1: ColmapCamera(1, "PINHOLE", 30, 20, (25.0, 15.0, 10.0))}, {}, {}, {}, {})
    with pytest.raises(CameraError, match="expected 4 params"):
        write_model(rec, tmp_path)


# ------------------------------------------------------------------------------------------ bad input


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("name", ["cameras", "images", "points3D", "rigs", "frames"])
def test_truncated_binary_names_file_and_offset(written: tuple, tmp_path: Path, name: str) -> None:
    _, bin_dir, _ = written
    size = (bin_dir / f"{name}.bin").stat().st_size
    for cut in sorted({3, 8, 13, size // 2, size - 1}):
        model = _copy(bin_dir, tmp_path / f"m{cut}")
        path = model / f"{name}.bin"
        path.write_bytes(path.read_bytes()[:cut])
        with pytest.raises(SourceError) as info:
            read_model(model)
        assert any(f"{name}.bin" in p and "byte" in p and "expected" in p for p in info.value.problems)


def test_trailing_bytes_and_unknown_model_id(written: tuple, tmp_path: Path) -> None:
    _, bin_dir, _ = written
    model = _copy(bin_dir, tmp_path / "m")
    images = model / "images.bin"
    images.write_bytes(images.read_bytes() + b"\0\0")
    cameras = model / "cameras.bin"
    data = bytearray(cameras.read_bytes())
    data[12:16] = (99).to_bytes(4, "little", signed=True)  # first camera's model id
    cameras.write_bytes(bytes(data))
    with pytest.raises(SourceError) as info:
        read_model(model)
    problems = info.value.problems
    assert any("cameras.bin" in p and "unknown camera model id 99" in p for p in problems)
    assert any("images.bin" in p and "trailing bytes" in p for p in problems)


def test_malformed_text_reports_every_line(written: tuple, tmp_path: Path) -> None:
    _, _, txt_dir = written
    model = _copy(txt_dir, tmp_path / "m")
    cams = (model / "cameras.txt").read_text().splitlines()
    cams[3] = cams[3].split()[0] + " NOT_A_MODEL 10 10 1 2 3"
    cams[4] = " ".join(cams[4].split()[:-1])  # one parameter missing
    (model / "cameras.txt").write_text("\n".join(cams) + "\n")
    pts = (model / "points3D.txt").read_text().splitlines()
    pts[3] = pts[3].replace(" ", " x", 1)
    (model / "points3D.txt").write_text("\n".join(pts) + "\n")
    with pytest.raises(SourceError) as info:
        read_model(model)
    problems = info.value.problems
    assert any("cameras.txt:4:" in p and "NOT_A_MODEL" in p for p in problems)
    assert any("cameras.txt:5:" in p and "expected" in p and "params" in p for p in problems)
    assert any("points3D.txt:4:" in p and "expected X" in p for p in problems)


def test_missing_files_dangling_ids_and_bad_poses(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"expected cameras\.bin or cameras\.txt"):
        read_model(tmp_path)
    rec = Reconstruction(
        {1: ColmapCamera(1, "PINHOLE", 30, 20, (25.0, 25.0, 15.0, 10.0))},
        {
            2: ColmapImage(2, (1.0, 0.0, 0.0, 0.0), (0.0, 0.0, 2.0), 7, "a.png"),
            3: ColmapImage(3, (0.0, 0.0, 0.0, 0.0), (float("nan"), 0.0, 2.0), 1, "b.png"),
        },
        {},
        {},
        {},
    )
    write_model(rec, tmp_path, binary=False)
    with pytest.raises(SourceError) as info:
        read_model(tmp_path)
    assert len(info.value.problems) == 2
    assert "image 2 (a.png): refers to camera 7" in info.value.problems[0]
    assert "image 3 (b.png): expected a finite pose" in info.value.problems[1]
    assert read_model(tmp_path, validate=False).images[3].name == "b.png"


@pytest.mark.parametrize("form", ["bin", "txt"])
def test_random_corruption_raises_only_source_error(written: tuple, tmp_path: Path, form: str) -> None:
    _, bin_dir, txt_dir = written
    model = _copy(bin_dir if form == "bin" else txt_dir, tmp_path / "m")
    originals = {p: p.read_bytes() for p in model.iterdir()}
    rng = np.random.default_rng(7)
    outcomes = set()
    for _ in range(60):
        path = list(originals)[int(rng.integers(len(originals)))]
        data = bytearray(originals[path])
        for pos in rng.integers(0, len(data), size=int(rng.integers(1, 4))):
            data[pos] = int(rng.integers(0, 256))
        path.write_bytes(bytes(data))
        try:
            read_model(model)
            outcomes.add("ok")
        except SourceError as exc:
            assert exc.problems and all(str(model) in p for p in exc.problems)
            outcomes.add("error")
        path.write_bytes(originals[path])
    assert "error" in outcomes


@pytest.mark.parametrize("form", ["bin", "txt"])
def test_skipping_points2d_keeps_everything_else(written: tuple, form: str) -> None:
    _, bin_dir, txt_dir = written
    full = read_model(bin_dir if form == "bin" else txt_dir)
    light = read_model(bin_dir if form == "bin" else txt_dir, load_points2d=False)
    assert all(im.points2d is None and im.point3d_ids is None for im in light.images.values())
    assert light.cameras == full.cameras and light.points3d == full.points3d and light.frames == full.frames
    for iid, image in full.images.items():
        assert (light.images[iid].name, light.images[iid].qvec, light.images[iid].tvec) == (
            image.name,
            image.qvec,
            image.tvec,
        )


_NAME = st.text(st.sampled_from("abcXYZ019 _-./éü"), min_size=1, max_size=12).map(lambda s: s.strip() or "x")
_FLOAT = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def _reconstructions(draw: st.DrawFn) -> Reconstruction:
    cameras = {}
    for cid in draw(st.sets(st.integers(1, 2**31), min_size=1, max_size=3)):
        model = draw(st.sampled_from(list(CAMERA_MODELS)))
        params = tuple(
            draw(
                st.lists(
                    _FLOAT, min_size=CAMERA_MODELS[model].num_params, max_size=CAMERA_MODELS[model].num_params
                )
            )
        )
        cameras[cid] = ColmapCamera(
            cid, model, draw(st.integers(1, 10**5)), draw(st.integers(1, 10**5)), params
        )
    images = {}
    for k, iid in enumerate(draw(st.sets(st.integers(1, 2**31), max_size=4))):
        n = draw(st.integers(0, 3))
        xy = np.array(draw(st.lists(_FLOAT, min_size=2 * n, max_size=2 * n)), dtype=np.float64).reshape(n, 2)
        ids = np.array(draw(st.lists(st.integers(-1, 2**40), min_size=n, max_size=n)), dtype=np.int64)
        q, t = (
            tuple(draw(st.lists(_FLOAT, min_size=4, max_size=4))),
            tuple(draw(st.lists(_FLOAT, min_size=3, max_size=3))),
        )
        name = f"{k}/{draw(_NAME)}"
        images[iid] = ColmapImage(iid, q, t, draw(st.sampled_from(sorted(cameras))), name, xy, ids)  # type: ignore[arg-type]
    return Reconstruction(cameras, images, {}, {}, {})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rec=_reconstructions())
def test_write_read_round_trip_is_exact(tmp_path: Path, rec: Reconstruction) -> None:
    for binary in (True, False):
        out = tmp_path / ("bin" if binary else "txt")
        shutil.rmtree(out, ignore_errors=True)
        write_model(rec, out, binary=binary)
        assert read_model(out, validate=False) == rec
