"""Neural 3D Video captures (issue 58): ``poses_bounds.npy`` + ``camNN.mp4`` decoded with PyAV; rays
from LLFF's rows, time / camera / frame columns, frame range and stride, the test camera, dropping a
camera only when asked, colours within the codec's tolerance, and one line per bad input."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raykit.cli import main
from raykit.converters import convert
from raykit.converters.video import _READERS, VideoFrame
from raykit.errors import ConfigError, SourceError
from raykit.loaders import image_rays
from raykit.store import open_store
from raykit.testing.dynamic import rgb_over_white, write_video

TOLERANCE = 1  # colour levels: libx264rgb at crf 0 is lossless (rgb24 in, rgb24 out)


def _llff_rays(row: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pixel's (origin, unit direction) from one ``poses_bounds`` row alone: columns down, right,
    back, centre, (H, W, f); pixel centres at +0.5, looking along -back, the principal point centred."""
    pose = row[:15].reshape(3, 5)
    down, right, back, centre = pose[:, 0], pose[:, 1], pose[:, 2], pose[:, 3]
    focal = pose[2, 4] * width / pose[1, 4]
    ys, xs = np.mgrid[0:height, 0:width].reshape(2, -1) + 0.5
    world = ((xs - width / 2) / focal)[:, None] * right + ((ys - height / 2) / focal)[:, None] * down - back
    return np.tile(centre, (len(world), 1)), world / np.linalg.norm(world, axis=1, keepdims=True)


def _check_rays(store: Any, rows: np.ndarray) -> None:
    for name, cam in zip(store.table.names, store.table.rig_camera.tolist(), strict=True):
        h, w, _ = store.image_shape(name)
        origins, directions = _llff_rays(rows[cam], w, h)
        batch = image_rays(store, name)
        torch.testing.assert_close(batch.origins.double(), torch.from_numpy(origins), atol=1e-5, rtol=0)
        torch.testing.assert_close(batch.directions.double(), torch.from_numpy(directions), atol=1e-5, rtol=0)


def test_rays_times_and_splits_follow_the_capture(n3dv: dict[str, Any]) -> None:
    store, scene = n3dv["store"], n3dv["scene"]
    rows = np.load(n3dv["capture"] / "poses_bounds.npy")
    _check_rays(store, rows)
    table = store.table
    train = [f"{f:05d}/cam{c:02d}" for f in range(6) for c in range(1, 4)]  # time-major, as decoded
    assert table.names == train + [f"{f:05d}/cam00" for f in range(6)]
    rows_of = zip(table.names, table.splits, table.time, table.rig_camera, table.frame_index, strict=True)
    for name, split, t, cam, frame in rows_of:
        assert name == f"{frame:05d}/cam{cam:02d}" and t == pytest.approx(frame / 5)
        assert split == ("test" if cam == 0 else "train")
        assert image_rays(store, name).near[0] == pytest.approx(rows[cam, 15], rel=1e-6)
        view = next(
            i
            for i in range(len(scene.names))
            if scene.camera_index[i] == cam and scene.frame_index[i] == frame
        )
        rendered = rgb_over_white(scene.images[view]).astype(int)
        stored = store.read_image(name)[..., :3].astype(int)
        assert np.abs(stored - rendered).max() <= TOLERANCE
    assert not _READERS  # every decoder closed after its last frame


def test_frame_range_stride_test_camera_and_dropped_camera(n3dv: dict[str, Any], tmp_path: Path) -> None:
    store = convert(
        n3dv["capture"], tmp_path / "s.zarr", frame_start=1, frame_stop=5, frame_stride=2,
        test_camera="cam02", drop_cameras="cam03", layout="images",
    )  # fmt: skip
    table = store.table
    assert sorted(zip(table.frame_index.tolist(), table.rig_camera.tolist(), strict=True)) == [
        (f, c) for f in (1, 3) for c in (0, 1, 2)
    ]
    assert sorted(set(table.time.tolist())) == pytest.approx([0.2, 0.6])  # over the whole video: f / 5
    splits = dict(zip(table.names, table.splits, strict=True))
    assert {s for n, s in splits.items() if n.endswith("cam02")} == {"test"}
    assert {s for n, s in splits.items() if not n.endswith("cam02")} == {"train"}
    _check_rays(store, np.load(n3dv["capture"] / "poses_bounds.npy"))


def test_scaled_frames_scale_the_focal_with_a_warning(n3dv: dict[str, Any], tmp_path: Path) -> None:
    capture = tmp_path / "c"
    shutil.copytree(n3dv["capture"], capture)
    rows = np.load(capture / "poses_bounds.npy")
    rows[:, [4, 9, 14]] *= 2  # hwf of 64x64 frames: the videos are half that size
    np.save(capture / "poses_bounds.npy", rows)
    with pytest.warns(
        UserWarning,
        match=r"cam00.mp4: frames are 32x32, poses_bounds.npy's hwf says 64x64 \(4 of 4 cameras\): "
        r"focal scaled by 0.5",
    ):
        store = convert(capture, tmp_path / "s.zarr", frame_stop=2)
    _check_rays(store, rows)


def _bad(n3dv: dict[str, Any], tmp_path: Path, change: Any, **options: Any) -> list[str]:
    capture = tmp_path / "bad"
    shutil.copytree(n3dv["capture"], capture)
    change(capture)
    with pytest.raises(SourceError) as info:
        convert(capture, tmp_path / "out.zarr", **options)
    assert not (tmp_path / "out.zarr").exists()
    return info.value.problems


def _frames(n: int, size: tuple[int, int] = (32, 32)) -> list[np.ndarray]:
    return [np.full((*size, 3), 10 * k, np.uint8) for k in range(n)]


def test_bad_inputs_are_one_line_each(n3dv: dict[str, Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad"

    def remove(capture: Path) -> None:
        (capture / "cam03.mp4").unlink()

    other = tmp_path / "1" / "bad"
    assert _bad(n3dv, tmp_path / "1", remove) == [
        f"{other / 'poses_bounds.npy'}: 4 rows but 3 camNN.mp4 videos in {other}"
    ]
    assert _bad(n3dv, tmp_path, lambda c: (c / "cam01.mp4").write_bytes(b"not a video" * 100)) == [
        f"{bad / 'cam01.mp4'}: cannot decode video (" + _bad_message(bad / "cam01.mp4")
    ]
    shutil.rmtree(bad)
    assert _bad(n3dv, tmp_path, lambda c: write_video(c / "cam02.mp4", _frames(5))) == [
        f"{bad / 'cam02.mp4'}: 5 frames, but cam00.mp4 has 6"
    ]
    shutil.rmtree(bad)
    assert _bad(n3dv, tmp_path, lambda c: write_video(c / "cam02.mp4", _frames(6, (32, 48)))) == [
        f"{bad / 'cam02.mp4'}: frames are 48x32, but cam00.mp4's are 32x32",
    ]
    shutil.rmtree(bad)
    assert _bad(n3dv, tmp_path, lambda c: None, frame_stop=9) == [
        f"{bad / 'cam00.mp4'}: 6 frames, fewer than the 9 asked (frame_stop)"
    ]


def _bad_message(path: Path) -> str:
    with pytest.raises(SourceError) as info:
        from raykit.converters.video import probe_video

        probe_video(path)
    return str(info.value).split(": cannot decode video (", 1)[1]


def test_a_video_shorter_than_its_header_is_one_line(n3dv: dict[str, Any]) -> None:
    path = str(n3dv["capture"] / "cam01.mp4")
    with pytest.raises(SourceError) as info:
        VideoFrame(path, 7, (0, 8, 1))()
    assert info.value.problems == [f"{path}: video ends after 6 frames; the conversion reads frames up to 7"]
    assert not _READERS
    first = rgb_over_white(n3dv["scene"].images[1])  # camera 1 at time 0
    assert np.abs(VideoFrame(path, 0, (0, 1, 1))().astype(int) - first).max() <= TOLERANCE


def test_options_are_checked(n3dv: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"drop_cameras: .* has no cam13.mp4 \(its cameras: cam00, cam01"):
        convert(n3dv["capture"], tmp_path / "a", drop_cameras="cam13")
    with pytest.raises(ConfigError, match=r"test_camera: .* has no cam7\.mp4"):
        convert(n3dv["capture"], tmp_path / "a", test_camera="cam7")
    with pytest.raises(ConfigError, match=r"frame_start < frame_stop"):
        convert(n3dv["capture"], tmp_path / "a", frame_start=3, frame_stop=3)
    lego = Path(__file__).resolve().parents[1] / "data" / "lego_tiny"
    with pytest.raises(ConfigError, match=r"frame_stride: Neural 3D Video \(n3dv\) options, got a blender"):
        convert(lego, tmp_path / "a", frame_stride=2)


def test_cli_makes_detects_and_converts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capture = tmp_path / "cap"
    assert main(["scene", "make", str(capture), "--format", "n3dv"]) == 0
    assert sorted(p.name for p in capture.iterdir() if not p.name.startswith(".")) == [
        "cam00.mp4", "cam01.mp4", "cam02.mp4", "cam03.mp4", "poses_bounds.npy",
    ]  # fmt: skip
    out = tmp_path / "s.zarr"
    assert main(["convert", str(capture), str(out), "--frame-stop", "2", "--drop-cameras", "cam01"]) == 0
    store = open_store(out)
    assert store.manifest["source"]["format"] == "n3dv" and len(store.table.names) == 6
    assert main(["convert", str(capture), str(tmp_path / "x"), "--drop-cameras", "cam00"]) == 2
    assert "raykit: error: drop_cameras: cam00 is the test camera" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("codec", "ext", "exact"),
    [("webp", "webp", True), ("png", "png", True), ("jpeg", "jpg", False), ("lz4", "rkpx", True),
     ("raw", "rkpx", True)],
)  # fmt: skip
def test_frames_go_into_the_images_layout_through_the_codec_picked(
    n3dv: dict[str, Any], tmp_path: Path, codec: str, ext: str, exact: bool
) -> None:
    from raykit.store import validate_store

    store = convert(n3dv["capture"], tmp_path / "s.zarr", layout="images", image_codec=codec, frame_stop=2)
    assert store.manifest["layout"]["image_codec"] == codec
    assert set(store.index["train"]["image_format"]) == {ext}
    assert validate_store(tmp_path / "s.zarr", deep=True) == []
    rays = n3dv["store"]
    errors = np.stack(
        [
            np.abs(store.read_image(name).astype(int) - rays.read_image(name).astype(int))
            for name in store.table.names
        ]
    )
    if exact:
        assert errors.max() == 0
    else:  # JPEG quality 95, 4:4:4, on sharp 32x32 frames
        assert 0 < errors.mean() <= 3 and errors.max() <= 32


@pytest.mark.parametrize("codec", ["webp", "raw"])  # raw: encoding and writing shards as one pipeline
def test_each_video_is_decoded_once_in_order(
    n3dv: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str
) -> None:
    """Time-major table order and one forward-only decoder per video: with 4 threads, each video is
    opened once to probe it and once to decode it, never again (no seeking back)."""
    import av

    opened: list[str] = []
    real = av.open

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(Path(str(path)).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(av, "open", counting)
    convert(n3dv["capture"], tmp_path / "s.zarr", threads=4, layout="images", image_codec=codec)
    assert sorted(opened) == sorted([f"cam{c:02d}.mp4" for c in range(4)] * 2)
    assert not _READERS


@pytest.mark.parametrize("options", [{}, {"layout": "images", "image_codec": "raw", "threads": 2}])
def test_a_video_cut_short_fails_the_conversion_in_one_line(
    n3dv: dict[str, Any], tmp_path: Path, options: dict[str, Any]
) -> None:
    """Its header (written first: ``faststart``) still says 6 frames; decoding finds fewer, in the
    writer: one line for all its frames, nothing left behind."""
    import av

    def cut(capture: Path) -> None:
        path = capture / "cam02.mp4"
        with av.open(str(path), "w", options={"movflags": "faststart"}) as container:
            stream = container.add_stream("libx264rgb", rate=30, options={"crf": "0"})
            stream.pix_fmt, stream.width, stream.height = "rgb24", 32, 32
            rng = np.random.default_rng(0)
            for _ in range(6):
                pixels = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
                container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
            container.mux(stream.encode())
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * 0.6)])

    problems = _bad(n3dv, tmp_path, cut, **options)
    assert len(problems) == 1
    assert problems[0].startswith(f"{tmp_path / 'bad' / 'cam02.mp4'}: video ends after ")
    assert problems[0].endswith(" frames; the conversion reads frames up to 5")
    assert not (tmp_path / "out.zarr.partial").exists() and not _READERS
