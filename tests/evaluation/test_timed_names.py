"""Renders of a store with times are named by camera and time (``render_stem``), and ``raykit evaluate``
matches them to the store's views: a multi-view video's rig cameras (``cam01_t0.5000``) and a D-NeRF
capture's one moving camera (``r_0_t0.2500``); a static store keeps the image names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import raykit.cli
from raykit.cameras import Camera
from raykit.errors import SourceError
from raykit.evaluation import find_pairs, render_stem, view_time
from raykit.store import ImageRecord, SceneInfo, open_store, write_store

SIZE = 8
# name, split, time, rig camera
VIEWS = [("r_0.png", "test", 0.25, 1), ("r_1.png", "test", 0.5, 1), ("r_2.png", "test", 0.25, 2)]


def _pixels(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)


def _store(path: Path, rig: bool = True, timed: bool = True) -> Path:
    camera = Camera("PINHOLE", SIZE, SIZE, (8.0, 8.0, SIZE / 2, SIZE / 2))
    records = []
    for i, (name, split, time, cam) in enumerate([("t.png", "train", 0.0, 0), *VIEWS]):
        c2w = np.eye(4)
        c2w[0, 3] = i
        records.append(
            ImageRecord(name, split, camera, c2w, 0.5, 5.0, f"mem://{i}", lambda i=i: _pixels((i - 1) % 99),
                        time=time if timed else None, camera_index=cam if timed and rig else None)
        )  # fmt: skip
    bounds = SceneInfo(bounds=((-1.0,) * 3, (1.0,) * 3))
    write_store(path, records, scene=bounds, backend="zarr", chunk_rays=256)
    return path


def _renders(folder: Path, stems: list[str]) -> Path:
    folder.mkdir(parents=True)
    for i, stem in enumerate(stems):
        Image.fromarray(_pixels(i)).save(folder / f"{i:03d}_{stem}.png")
    return folder


@pytest.mark.parametrize(
    ("rig", "stems"),
    [
        (True, ["cam01_t0.2500", "cam01_t0.5000", "cam02_t0.2500"]),
        (False, ["r_0_t0.2500", "r_1_t0.5000", "r_2_t0.2500"]),
    ],
)
def test_timed_renders_are_named_by_camera_and_time_and_match(
    tmp_path: Path, rig: bool, stems: list[str]
) -> None:
    store = open_store(_store(tmp_path / "store", rig=rig))
    names = store.images("test")
    assert [render_stem(store, n) for n in names] == stems
    assert view_time(store, names[1]) == ("cam01" if rig else None, 0.5)
    pred = _renders(tmp_path / "renders", stems)
    pairs = find_pairs(str(pred), f"{store.url}:test").pairs
    assert [(p.name, Path(p.pred.label).name) for p in pairs] == [
        (Path(n).stem, f"{i:03d}_{s}.png") for i, (n, s) in enumerate(zip(names, stems, strict=True))
    ]
    out = tmp_path / "results.json"
    assert (
        raykit.cli.main(["evaluate", str(pred), f"{store.url}:test", "--no-lpips", "--output", str(out)]) == 0
    )
    assert [im["psnr"] for im in json.loads(out.read_text())["images"]] == [None] * 3  # identical images


def test_a_static_store_keeps_image_names_and_a_wrong_time_matches_nothing(tmp_path: Path) -> None:
    store = open_store(_store(tmp_path / "static", timed=False))
    assert [render_stem(store, n) for n in store.images("test")] == ["r_0", "r_1", "r_2"]
    assert view_time(store, "r_0.png") is None
    timed = open_store(_store(tmp_path / "timed"))
    pred = _renders(tmp_path / "renders", ["cam01_t0.2500", "cam01_t0.7500", "cam02_t0.2500"])
    with pytest.raises(SourceError, match=r"a prediction with no ground-truth image 001_cam01_t0\.7500"):
        find_pairs(str(pred), f"{timed.url}:test")
