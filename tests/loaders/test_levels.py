"""Resolution levels: ``ImageLoader(downscale=k)`` / ``set_downscale`` against reference twins.

The pixels of level k follow one rule (``raykit.imagedecode``): JPEG at k = 2, 4, 8 is libjpeg-turbo's
scaled decode, exactly Pillow's ``draft`` (``reference_decode_scaled``); everything else is the area
filter of ``raykit convert --downscale`` (``downscale_area_reference``, a loop per output pixel), which
is also what a store converted with ``--downscale k`` holds. Cameras are the full camera cropped to the
level's blocks and scaled by 1/k, checked against ``convert --downscale``'s cameras to 1e-9.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raykit.converters import convert
from raykit.errors import ConfigError
from raykit.imagedecode import (
    decode_image_scaled,
    downscale_area,
    downscale_area_reference,
    reference_decode_image,
    reference_decode_scaled,
)
from raykit.loaders import ImageLoader

DATA = Path(__file__).resolve().parents[1] / "data"
PLANT = sorted((DATA / "plant_capture" / "images").glob("*.jpg"))


@pytest.mark.parametrize("factor", [2, 4, 8, 16, 3])
def test_jpeg_levels_are_pillows_draft_or_the_area_rule(factor: int) -> None:
    data = PLANT[0].read_bytes()
    got = decode_image_scaled(data, factor)
    assert np.array_equal(got, reference_decode_scaled(data, factor))
    full = reference_decode_image(data)
    assert got.shape == (full.shape[0] // factor, full.shape[1] // factor, 3)
    area = downscale_area(full, factor)  # its loop twin: tests/converters/test_images.py
    difference = np.abs(got.astype(int) - area.astype(int))
    if factor == 3:  # not a power of two: the area rule exactly
        assert difference.max() == 0
    else:  # the scaled IDCT is close to, not equal to, the box average (imagedecode's docstring)
        assert difference.mean() < 2.5 and difference.max() <= 48


@pytest.mark.parametrize("factor", [2, 3])
def test_png_levels_are_the_area_rule_exactly(factor: int) -> None:
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (21, 31, 4), dtype=np.uint8)  # sizes no factor divides: rows left out
    buffer = io.BytesIO()
    Image.fromarray(rgba).save(buffer, format="PNG")
    got = decode_image_scaled(buffer.getvalue(), factor)
    blocks = rgba[: 21 // factor * factor, : 31 // factor * factor]
    assert np.array_equal(got, downscale_area_reference(blocks, factor))


@pytest.fixture(scope="module")
def plant_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The first four plant photos: full resolution, and converted with ``--downscale 2`` / ``4``."""
    root = tmp_path_factory.mktemp("levels")
    capture = root / "capture"
    (capture / "images").mkdir(parents=True)
    for path in PLANT[:4]:
        shutil.copy(path, capture / "images" / path.name)
    meta = json.loads((DATA / "plant_capture" / "transforms.json").read_text())
    keep = {f"images/{p.name}" for p in PLANT[:4]}
    meta["frames"] = [f for f in meta["frames"] if f["file_path"].removeprefix("./") in keep]
    (capture / "transforms.json").write_text(json.dumps(meta))
    out = {}
    for factor in (1, 2, 4):
        with pytest.warns(Warning, match="scaled uniformly"):
            convert(capture, root / f"x{factor}.zarr", layout="images", downscale=factor, progress=False)
        out[factor] = root / f"x{factor}.zarr"
    return out


def _all(loader: ImageLoader) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {b.names[0]: (b.images[0].numpy(), b.K[0].numpy()) for b in loader}  # type: ignore[index]


@pytest.mark.filterwarnings("ignore:.*scaled uniformly")
@pytest.mark.parametrize("factor", [2, 4])
def test_levels_agree_with_convert_downscale(plant_stores: dict[int, Path], factor: int) -> None:
    with ImageLoader(plant_stores[1], "train", shuffle=False, downscale=factor) as loader:
        levels = _all(loader)
    with ImageLoader(plant_stores[factor], "train", shuffle=False) as loader:
        converted = _all(loader)
    assert levels.keys() == converted.keys() and levels
    for name, (pixels, K) in levels.items():
        np.testing.assert_allclose(K.astype(np.float64), converted[name][1], rtol=0, atol=1e-9)
        assert pixels.shape == converted[name][0].shape
        # JPEG: DCT-domain level vs convert's area filter of the full decode: close, not equal
        assert float(np.abs(pixels - converted[name][0]).mean()) < 2.5 / 255


@pytest.mark.filterwarnings("ignore:.*scaled uniformly")
def test_set_downscale_keeps_order_and_position_and_one_budget(plant_stores: dict[int, Path]) -> None:
    with ImageLoader(plant_stores[1], "train", seed=3) as full:
        order = [b.names[0] for b in full] + [b.names[0] for b in full]
    with ImageLoader(plant_stores[1], "train", seed=3, downscale=4) as loader:
        first = [(b.names[0], tuple(b.images.shape)) for b in loader]
        assert loader.cache_stats().items == len(first)
        state = loader.state_dict()
        loader.set_downscale(2)
        second = [(b.names[0], tuple(b.images.shape)) for b in loader]
        assert loader.cache_stats().items == len(second)  # level 4 freed, level 2 cached
        assert loader.state_dict()["epoch"] == state["epoch"] + 1
    assert [n for n, _ in first + second] == order
    h, w = first[0][1][1:3]
    assert second[0][1][1:3] == (2 * h, 2 * w)


@pytest.mark.filterwarnings("ignore:.*scaled uniformly")
def test_bad_downscale_is_one_line(plant_stores: dict[int, Path]) -> None:
    with pytest.raises(ConfigError, match=r"downscale: expected a positive integer, got 0"):
        ImageLoader(plant_stores[1], "train", downscale=0)
    with ImageLoader(plant_stores[1], "train", crop=(100, 100)) as loader:
        with pytest.raises(ConfigError, match=r"crop 100x100 .* larger than"):
            loader.set_downscale(8)
        assert loader.downscale == 1


@pytest.mark.filterwarnings("ignore:.*scaled uniformly")
def test_a_downscale_schedule_sets_each_batchs_level_and_resumes(plant_stores: dict[int, Path]) -> None:
    with ImageLoader(plant_stores[1], "train", seed=5) as full:
        order = [b.names[0] for _ in range(3) for b in full]
        height, width = full.source.full_shapes[0][:2]
        n = full.plan.n_batches
    assert n >= 2

    def schedule(step: int) -> int:  # changes within the first epoch and where the second ends
        return 4 if step < n - 1 else 2 if step < 2 * n else 1

    with ImageLoader(plant_stores[1], "train", seed=5, downscale=schedule) as loader:
        assert loader.downscale == 4 and loader.step() == 0
        served, states = [], []
        for _ in range(3):
            for batch in loader:
                served.append((batch.names[0], tuple(batch.images.shape[1:3])))
                states.append(loader.state_dict())
        assert loader.step() == 3 * n
    assert [name for name, _ in served] == order  # the order does not depend on the level
    levels = [schedule(step) for step in range(3 * n)]
    assert [shape for _, shape in served] == [(height // k, width // k) for k in levels]
    assert {shape for _, shape in served} == {(height // k, width // k) for k in (4, 2, 1)}
    with ImageLoader(plant_stores[1], "train", seed=5, downscale=schedule) as resumed:
        resumed.load_state_dict(states[n])  # mid-way through the second epoch, at level 2
        rest = [(b.names[0], tuple(b.images.shape[1:3])) for _ in range(2) for b in resumed]
    assert rest == served[n + 1 :]
    with pytest.raises(ConfigError, match=r"downscale: expected a positive integer, got 0"):
        ImageLoader(plant_stores[1], "train", downscale=lambda step: 0)
