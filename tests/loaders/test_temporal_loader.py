"""The temporal weights as a store component (``raykit add-component STORE temporal``) and as the
``RayLoader(sampling="temporal")`` stage, on a tiny multi-view video store (4 cameras x 8 times)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import raykit.cli
from raykit.errors import ConfigError
from raykit.loaders import ImageLoader, RayLoader
from raykit.store import ImageRecord, RawRays, SceneInfo, open_store, validate_store, write_store
from raykit.temporal_weights import TemporalWeightsConfig, temporal_weights

from .conftest import chi_square_p

CONFIG = TemporalWeightsConfig(shift=2, factor=2)
BATCH = 2048


def _rgb(image: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(image[..., :3])


@functools.cache
def _scene() -> Any:
    from raykit.testing import render_dynamic

    return render_dynamic(n_cameras=4, n_times=8)


def write_video_store(path: Path, indexed: bool = True) -> Path:
    """The built-in dynamic scene as a multi-view video store (images layout), camera and frame index
    per image when ``indexed`` (else time only)."""
    scene = _scene()
    records = []
    for i, name in enumerate(scene.names):
        index = {"camera_index": int(scene.camera_index[i]), "frame_index": int(scene.frame_index[i])}
        load = functools.partial(_rgb, scene.images[i])
        view = (name, scene.splits[i], scene.cameras[i], scene.c2w[i], None, None, "", load)
        records.append(ImageRecord(*view, time=float(scene.times[i]), **(index if indexed else {})))
    write_store(path, records, scene=SceneInfo(), layout="images", chunk_rays=1024)
    return path


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from raykit.converters.weights import add_temporal_weights

    path = write_video_store(tmp_path_factory.mktemp("video") / "video.zarr")
    add_temporal_weights(path, CONFIG)
    return path


def test_weights_are_each_cameras_temporal_weights(video: Path) -> None:
    store = open_store(video)
    table = store.table
    assert table.rig_camera is not None and table.frame_index is not None
    for kind in ("isg", "ist"):
        info = store.components[kind]
        assert (info.dtype, info.factor, info.source["gamma"], info.source["shift"]) == (
            "float16",
            2,
            0.02,
            2,
        )
    for camera in range(4):
        rows = sorted(np.flatnonzero(table.rig_camera == camera), key=lambda r: table.frame_index[r])
        expected = temporal_weights((store.read_image(table.names[r])[..., :3] for r in rows), CONFIG)
        for t, row in enumerate(rows):
            for kind in ("isg", "ist"):
                got = store.read_component(kind, table.names[row])
                assert got.dtype == np.float16 and np.array_equal(got, getattr(expected, kind)[t])
    assert validate_store(video, deep=True) == []


def _raw_loader(video: Path, **options: Any) -> RayLoader:
    return RayLoader(video, "train", BATCH, 3, make_batch=lambda raw: raw, device="cpu", **options)


def take(loader: RayLoader, n: int) -> list[Any]:
    """The loader's next ``n`` batches, over as many epochs as it takes."""
    out: list[Any] = []
    while len(out) < n:
        out += [raw for raw, _ in zip(loader, range(n - len(out)), strict=False)]
    return out


def _cells(video: Path, raw: RawRays) -> tuple[np.ndarray, np.ndarray]:
    """Each ray's camera-table row and weight cell (row-major in its frame's weight map)."""
    table = open_store(video).table
    image, xy = table.decode(raw.pid)
    w = table.width[image] // CONFIG.factor
    return image, (xy[:, 1] // CONFIG.factor) * w + xy[:, 0] // CONFIG.factor


def _law(video: Path, kind: str) -> dict[int, np.ndarray]:
    """The split's frames' (train rows -> flat weight map) normalised to the split's total."""
    store = open_store(video)
    maps = {int(r): store.read_component(kind, store.table.names[r]).astype(np.float64).reshape(-1)
            for r in store.split_rows("train")}  # fmt: skip
    total = sum(m.sum() for m in maps.values())
    return {r: m / total for r, m in maps.items()}


def test_draws_follow_isg_then_ist_from_ist_step(video: Path) -> None:
    switch = 37  # inside a group (of an epoch's 13 batches): the group is split where the schedule switches
    loader = _raw_loader(video, sampling={"kind": "temporal", "ist_step": switch})
    batches = take(loader, 2 * switch)  # epochs of 13 batches: the schedule counts over epochs
    laws = {kind: _law(video, kind) for kind in ("isg", "ist")}
    for kind, part in (("isg", batches[:switch]), ("ist", batches[switch:])):
        raw = RawRays.concat(part)
        image, cell = _cells(video, raw)
        law = laws[kind]
        prob = np.array([law[r][c] for r, c in zip(image.tolist(), cell.tolist(), strict=True)])
        np.testing.assert_allclose(raw.extra["prob"], prob / CONFIG.factor**2, rtol=1e-6)  # its own law's
        rows = sorted(law)
        offsets = np.cumsum([0] + [len(law[r]) for r in rows])
        at = {r: offsets[i] for i, r in enumerate(rows)}
        flat = np.array([at[r] for r in image.tolist()]) + cell
        observed = np.bincount(flat, minlength=offsets[-1]).astype(np.float64)
        for other in ("isg", "ist"):
            expected = len(raw.pid) * np.concatenate([laws[other][r] for r in rows])
            if other != kind and observed[expected == 0].any():
                continue  # drawn where the other law has no mass: rejected outright
            p = chi_square_p(observed, expected)
            assert p > 1e-4 if other == kind else p < 1e-12  # the law drawn, and the power to tell


def test_resume_is_exact_and_ranks_draw_apart(video: Path) -> None:
    options = {"sampling": {"kind": "temporal", "ist_step": 12}}
    first = _raw_loader(video, **options)
    stream = iter(first)
    for _ in range(5):
        next(stream)
    state = first.state_dict()
    expected = [next(stream) for _ in range(8)] + take(first, 10)  # a group's end, the switch, an epoch's
    again = _raw_loader(video, **options)
    again.load_state_dict(state)
    got = take(again, 18)
    for a, b in zip(expected, got, strict=True):
        assert np.array_equal(a.pid, b.pid) and np.array_equal(a.rgba, b.rgba)
        assert np.array_equal(a.extra["prob"], b.extra["prob"])
    ranks = [next(iter(_raw_loader(video, rank=r, world_size=2, **options))).pid for r in (0, 1)]
    alone = next(iter(_raw_loader(video, **options))).pid
    assert not np.array_equal(ranks[0], ranks[1]) and not np.array_equal(ranks[0], alone)


def test_stores_without_indices_or_weights_are_one_line(
    video: Path, stores: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = write_video_store(tmp_path / "plain.zarr", indexed=False)
    assert raykit.cli.main(["add-component", str(plain), "temporal"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"raykit: error: {plain}: ISG/IST weights need a multi-view video store (camera and frame index per "
        "image)"
    ]
    assert "isg" not in open_store(plain).components
    with pytest.raises(ConfigError, match=r"raykit add-component .* temporal"):
        _raw_loader(plain, sampling="temporal")
    with pytest.raises(ConfigError, match="images-layout split"):
        RayLoader(stores["zarr"], "train", 64, 0, sampling="temporal")  # a rays-layout store
    with pytest.raises(ConfigError, match="use RayLoader"):
        ImageLoader(video, "train", 2, sampling="temporal")
