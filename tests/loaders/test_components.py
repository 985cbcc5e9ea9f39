"""Masks and depth maps served by the loaders (issue 45): on a capture of the built-in scene with masks
and depth, converted to both layouts, every loaded value equals the store's component after every
transform (gathered by pixel id; levels; undistortion; crops), checked against the reference twins."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raykit.errors import ConfigError
from raykit.image_geometry import (
    pinhole_camera,
    reference_downscale_nearest,
    reference_remap_nearest,
    undistortion_coordinates,
)
from raykit.loaders import EvalLoader, ImageLoader, RayLoader, level_camera
from raykit.store import RayStore, open_store
from raykit.testing import render_scene, scene_depth, scene_mask, write_nerfstudio


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny scene (OPENCV, distorted) as a nerfstudio capture with masks and depth, converted to a
    rays-layout and an images-layout store."""
    from raykit.converters import convert

    root = tmp_path_factory.mktemp("components")
    scene = render_scene("tiny", seed=0, camera_model="OPENCV")
    source = write_nerfstudio(scene, root / "capture", masks=True, depth=True, depth_format="npy")
    convert(source, root / "rays.zarr", threads=1, chunk_rays=512)
    convert(source, root / "images.zarr", threads=1, layout="images")
    return {
        "scene": scene,
        "rays": open_store(root / "rays.zarr"),
        "images": open_store(root / "images.zarr"),
    }


def _components(store: RayStore, name: str) -> dict[str, np.ndarray]:
    return {c: store.read_component(c, name) for c in ("mask", "depth")}


def test_the_store_holds_the_scenes_own_mask_and_depth(capture: dict[str, Any]) -> None:
    scene, store = capture["scene"], capture["images"]
    assert set(store.components) == {"mask", "depth"}
    for i, full in enumerate(scene.names[:3]):
        name = next(n for n in store.table.names if n.endswith(full.replace("/", "_") + ".png"))
        np.testing.assert_array_equal(store.read_component("mask", name), scene_mask(scene, i))
        np.testing.assert_allclose(store.read_component("depth", name), scene_depth(scene, i), rtol=1e-6)


def _check_rays(store: RayStore, batch: Any) -> int:
    """Each ray's mask and depth are its pixel's (``batch.image``, ``batch.pixel``); rays checked."""
    names = store.table.names
    for row in torch.unique(batch.image).tolist():
        rays = (batch.image == row).nonzero()[:, 0]
        x, y = batch.pixel[rays, 0].numpy(), batch.pixel[rays, 1].numpy()
        expected = _components(store, names[row])
        np.testing.assert_array_equal(batch.extra["mask"][rays].numpy(), expected["mask"][y, x])
        np.testing.assert_array_equal(batch.extra["depth"][rays].numpy(), expected["depth"][y, x])
    return len(batch)


@pytest.mark.parametrize("layout", ["rays", "images"])
@pytest.mark.parametrize("held", ["memory", "scratch", "per-image"])
def test_ray_loader_gathers_each_rays_values_by_pixel_id(
    capture: dict[str, Any], layout: str, held: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = capture[layout]
    # 64 MiB holds the split's components in memory; 48 x 48 x 5 x 3 bytes does not (a scratch file);
    # without room for a scratch file, per image through an LRU
    cache_bytes = 64 << 20 if held == "memory" else 48 * 48 * 5 * 3
    if held == "per-image":
        monkeypatch.setattr("raykit.loaders.components.SCRATCH_SPARE", 1 << 62)
    no_room = held == "per-image"
    with (
        pytest.warns(RuntimeWarning, match="no room for a scratch file")
        if no_room
        else contextlib.nullcontext()
    ):
        loader = RayLoader(store, "train", 1000, 3, num_workers=0, cache_bytes=cache_bytes)
    with loader:
        assert loader.components == ("mask", "depth")
        checked = sum(_check_rays(store, batch) for batch in loader)
        assert checked == len(loader) * 1000
        gather = loader._gather
        assert gather is not None and gather.flat_kind == (None if held == "per-image" else held)
        if layout == "rays":  # chunks take their values from the staged components, in rank order
            staged = loader.cache.staged.staged  # type: ignore[attr-defined]
            assert (set(staged) == {"train"}) == (held != "per-image")
            if held == "scratch":
                assert isinstance(staged["train"]["depth"].base, np.memmap)
            assert gather._flat is None  # never needed
        else:
            assert (gather._flat is None) == (held == "per-image")
            if held == "scratch":
                assert gather._flat is not None and isinstance(gather._flat.base, np.memmap)
        batch = next(iter(loader))
        assert batch.extra["mask"].dtype == torch.uint8 and batch.extra["depth"].dtype == torch.float32


def test_ray_loader_components_resume_and_opt_out(capture: dict[str, Any]) -> None:
    store = capture["images"]
    with RayLoader(store, "train", 500, 1, num_workers=0, cache="node") as loader:
        stream = iter(loader)
        next(stream)
        state = loader.state_dict()
        expected = next(stream)
    with RayLoader(store, "train", 500, 1, num_workers=0) as resumed:
        resumed.load_state_dict(state)
        again = next(iter(resumed))
    for key in ("mask", "depth"):
        assert torch.equal(again.extra[key], expected.extra[key])
    _check_rays(store, again)
    with RayLoader(store, "test", 500, 1, num_workers=0, shuffle=False) as held_out:  # rows not from 0
        assert held_out._gather is not None and held_out._gather.base > 0
        assert sum(_check_rays(store, batch) for batch in held_out) == len(held_out) * 500
    with RayLoader(store, "train", 500, 1, num_workers=0, components=()) as plain:
        assert plain.components == () and next(iter(plain)).extra == {}
    with RayLoader(store, "train", 500, 1, num_workers=0, components=("depth",)) as depth_only:
        assert set(next(iter(depth_only)).extra) == {"depth"}


def test_ray_loader_with_a_worker_process(capture: dict[str, Any]) -> None:
    store = capture["rays"]
    with RayLoader(store, "train", 2000, 0, num_workers=1) as loader:
        assert sum(_check_rays(store, batch) for batch in loader) == len(loader) * 2000


def test_components_option_is_checked(capture: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="components: expected None or distinct names"):
        RayLoader(capture["rays"], "train", 100, components=("normals",))
    with pytest.raises(ConfigError, match="components: expected None or distinct names"):
        ImageLoader(capture["rays"], "train", components="mask")  # type: ignore[arg-type]
    from tests.loaders.conftest import build_store

    bare = build_store(tmp_path / "bare", "zarr")
    with pytest.raises(ConfigError, match="no component 'mask' to serve"):
        ImageLoader(bare, "train", components=("mask",))
    with RayLoader(bare, "train", 16, num_workers=0) as loader:  # by default: what the store has
        assert loader.components == () and next(iter(loader)).extra == {}


def _served(store: RayStore, name: str, level: int, undistort: bool) -> dict[str, np.ndarray]:
    """A component as ImageLoader must serve it: the twins of the level and of the undistortion."""
    row = store.image_index(name)
    camera = level_camera(store.table.cameras[store.table.camera_index[row]], level)
    out = {}
    for key, full in _components(store, name).items():
        array = reference_downscale_nearest(full, level) if level > 1 else full
        if undistort and not camera.is_pinhole:
            array = reference_remap_nearest(array, undistortion_coordinates(camera, pinhole_camera(camera)))
        out[key] = array
    return out


@pytest.mark.parametrize("layout", ["rays", "images"])
def test_image_loader_serves_components_through_levels_undistortion_and_crops(
    capture: dict[str, Any], layout: str
) -> None:
    store = capture[layout]
    with ImageLoader(store, "train", 2, 0, undistort=True, downscale=2, crop=(16, 20)) as loader:
        for level in (2, 1):
            loader.set_downscale(level)
            for batch in loader:
                assert batch.mask is not None and batch.depth is not None
                assert batch.mask.shape == batch.images.shape[:3] and batch.mask.dtype == torch.uint8
                assert batch.depth.dtype == torch.float32
                for b, name in enumerate(batch.names):
                    x0, y0 = batch.crop_origin[b].tolist()
                    expected = _served(store, name, level, True)
                    window = (slice(y0, y0 + 16), slice(x0, x0 + 20))
                    np.testing.assert_array_equal(batch.mask[b].numpy(), expected["mask"][window])
                    np.testing.assert_array_equal(batch.depth[b].numpy(), expected["depth"][window])


def test_image_loader_schedule_and_whole_images(capture: dict[str, Any]) -> None:
    store = capture["images"]
    schedule = lambda step: 4 if step < 3 else 1  # noqa: E731
    with ImageLoader(store, "train", 1, 0, downscale=schedule, components=("mask",)) as loader:
        for step, batch in zip(range(6), loader.forever(), strict=False):
            level = schedule(step)
            assert batch.depth is None
            expected = _served(store, batch.names[0], level, False)["mask"]
            np.testing.assert_array_equal(batch.mask[0].numpy(), expected)
    with ImageLoader(store, "train", 1, 0, components=()) as plain:
        batch = next(iter(plain))
        assert batch.mask is None and batch.depth is None


def test_eval_loader_rays_carry_the_images_components(capture: dict[str, Any]) -> None:
    store = capture["rays"]
    for image in EvalLoader(store, "test"):
        expected = _components(store, image.name)
        np.testing.assert_array_equal(image.rays.extra["mask"].numpy(), expected["mask"].reshape(-1))
        np.testing.assert_array_equal(image.rays.extra["depth"].numpy(), expected["depth"].reshape(-1))
        piece = next(image.batches(100))
        assert piece.extra["mask"].shape == (100,)
    assert next(iter(EvalLoader(store, "test", components=()))).rays.extra == {}


def test_image_loader_with_a_worker_process_and_resume(capture: dict[str, Any]) -> None:
    store = capture["images"]
    with ImageLoader(store, "train", 1, 5, num_workers=1, undistort=True) as loader:
        stream = iter(loader)
        next(stream)
        state = loader.state_dict()
        expected = next(stream)
    with ImageLoader(store, "train", 1, 5, undistort=True) as resumed:
        resumed.load_state_dict(state)
        again = next(iter(resumed))
    assert again.names == expected.names
    assert torch.equal(again.mask, expected.mask) and torch.equal(again.depth, expected.depth)
    np.testing.assert_array_equal(again.mask[0].numpy(), _served(store, again.names[0], 1, True)["mask"])


@pytest.mark.parametrize("block_bits,ahead", [(8, 0), (13, 0), (13, 1 << 24)])
def test_gather_over_some_rows_finds_each_rays_image(
    capture: dict[str, Any], block_bits: int, ahead: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows a flat gather decodes for a batch (``_reached``: blocks of pixel ids, some a few images
    wide; with ``LOAD_AHEAD_BYTES``, the following rows too) hold every ray's image and only wanted
    rows; values equal the store's, and every wanted row decoded once all are reached."""
    from raykit.loaders import component_gather
    from raykit.loaders.component_gather import ComponentGather

    monkeypatch.setattr(component_gather, "LOAD_AHEAD_BYTES", ahead)

    store = capture["rays"]
    rows = store.split_rows("train")[::2]  # every other image: the rows between are not wanted
    gather = ComponentGather(store, ("mask", "depth"), rows, 64 << 20)
    assert gather.flat is not None
    gather.block_bits = block_bits
    offsets, sizes = np.asarray(store.table.pixel_offset), np.asarray(store.table.n_pixels)
    pid = np.concatenate([offsets[r] + np.arange(sizes[r]) for r in rows]).astype(np.uint32)
    rng = np.random.default_rng(0)
    for batch in np.array_split(rng.permutation(pid), 7):
        reached = gather._reached(batch.astype(np.intp) - gather.base)
        assert set(gather.rows_of(batch).tolist()) <= set(reached.tolist()) <= set(rows.tolist())
        values = gather.values(batch)
        for row in np.unique(gather.rows_of(batch)).tolist():
            take = gather.rows_of(batch) == row
            local = batch[take].astype(np.int64) - offsets[row]
            expected = _components(store, store.table.names[row])
            np.testing.assert_array_equal(values["mask"][take], expected["mask"].reshape(-1)[local])
            np.testing.assert_array_equal(values["depth"][take], expected["depth"].reshape(-1)[local])
    assert gather.complete and gather.loaded[rows].all() and gather.loaded.sum() == len(rows)


def test_scratch_arrays_leave_no_file_behind(
    capture: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Components held in a scratch file: the file is unlinked from the start (nothing to clean up
    after a crash), yet the loader's values are right; the arrays are mapped, not the process's heap."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    store = capture["rays"]
    with RayLoader(store, "train", 1000, 3, num_workers=0, cache_bytes=48 * 48 * 5 * 3) as loader:
        assert sum(_check_rays(store, batch) for batch in loader) == len(loader) * 1000
        staged = loader.cache.staged.staged["train"]  # type: ignore[attr-defined]
        assert all(isinstance(array.base, np.memmap) for array in staged.values())
        assert list(scratch.iterdir()) == []
