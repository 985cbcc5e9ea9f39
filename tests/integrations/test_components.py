"""Masks and depth maps in the integrations (issue 45): the nerfstudio datamanagers put them where
nerfstudio's models read them (``mask`` bool, ``depth_image`` float32 (..., 1) in nerfstudio's units) and
the gsplat adapter fills ``mask`` and real depth points; values equal the store's components after the
level and the undistortion (reference twins)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raykit.converters import convert
from raykit.image_geometry import (
    pinhole_camera,
    reference_downscale_nearest,
    reference_remap_nearest,
    undistortion_coordinates,
)
from raykit.loaders import level_camera
from raykit.store import RayStore, open_store
from raykit.testing import render_scene, write_nerfstudio


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny scene (OPENCV) as a nerfstudio capture with masks and depth, in both layouts."""
    root = tmp_path_factory.mktemp("masked")
    source = write_nerfstudio(
        render_scene("tiny", camera_model="OPENCV"), root / "capture", masks=True, depth=True
    )
    convert(source, root / "rays.zarr", threads=1)
    convert(source, root / "images.zarr", threads=1, layout="images")
    return {"capture": root / "capture", "rays": root / "rays.zarr", "images": root / "images.zarr"}


def _served(store: RayStore, name: str, key: str, level: int = 1, undistort: bool = True) -> np.ndarray:
    row = store.image_index(name)
    camera = level_camera(store.table.cameras[store.table.camera_index[row]], level)
    array = store.read_component(key, name)
    array = reference_downscale_nearest(array, level) if level > 1 else array
    if undistort and not camera.is_pinhole:
        array = reference_remap_nearest(array, undistortion_coordinates(camera, pinhole_camera(camera)))
    return array


@pytest.mark.parametrize(("layout", "drop"), [("rays", False), ("images", False), ("rays", True)])
def test_ray_datamanager_serves_mask_and_depth_image_per_ray(
    masked: dict[str, Path], layout: str, drop: bool
) -> None:
    """With ``drop_masked`` (the default) only the rays the masks use are served, as nerfstudio's pixel
    sampler samples inside masks; without, every ray with its mask."""
    pytest.importorskip("nerfstudio")
    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
    from raykit.integrations.nerfstudio.ray_datamanager import RaykitDataManagerConfig

    parser = RaykitDataParserConfig(data=masked[layout], scale_factor=0.5)
    manager = RaykitDataManagerConfig(
        dataparser=parser, train_num_rays_per_batch=600, eval_num_rays_per_batch=600, drop_masked=drop
    ).setup(device="cpu")
    store = open_store(masked[layout])
    names = manager.train_dataset.names
    for step in range(3):
        bundle, batch = manager.next_train(step)
        mask, depth, indices = batch["mask"], batch["depth_image"], batch["indices"]
        n = len(indices)
        assert n < 600 if drop else n == 600  # the scene's background is outside its masks
        assert len(bundle) == len(batch["image"]) == n and (bool(mask.all()) or not drop)
        assert mask.shape == (n, 1) and mask.dtype == torch.bool
        assert depth.shape == (n, 1) and depth.dtype == torch.float32
        for (camera, y, x), used, z in zip(
            indices.tolist(), mask[:, 0].tolist(), depth[:, 0].tolist(), strict=True
        ):
            name = names[camera]
            assert used == bool(store.read_component("mask", name)[y, x] > 0)
            assert z == pytest.approx(float(store.read_component("depth", name)[y, x]) * 0.5, rel=1e-6)
    _, evaluation = manager.next_eval(0)
    assert evaluation["mask"].shape[1] == 1 and (bool(evaluation["mask"].all()) or not drop)
    camera, item = manager.next_eval_image(0)  # nerfstudio's eval dataloader: RaykitDataset.get_data
    name = manager.eval_dataset.names[int(item["image_idx"])]
    assert item["mask"].shape == (*item["image"].shape[:2], 1) and item["mask"].dtype == torch.bool
    np.testing.assert_array_equal(item["mask"][..., 0].numpy(), store.read_component("mask", name) > 0)
    np.testing.assert_allclose(item["depth_image"][..., 0].numpy(), store.read_component("depth", name) * 0.5)


def test_image_datamanager_serves_them_undistorted_at_each_level(masked: dict[str, Path]) -> None:
    pytest.importorskip("nerfstudio")
    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
    from raykit.integrations.nerfstudio.image_datamanager import RaykitImageDataManagerConfig, level_at

    config = RaykitImageDataManagerConfig(
        dataparser=RaykitDataParserConfig(data=masked["images"]), num_downscales=1, resolution_schedule=2
    )
    manager = config.setup(device="cpu")
    store = open_store(masked["images"])
    for step in range(4):
        _, data = manager.next_train(step)
        level = level_at(step, 1, 2)
        name = manager.train_dataset.names[data["image_idx"]]
        assert data["mask"].shape == (*data["image"].shape[:2], 1) and data["mask"].dtype == torch.bool
        assert data["depth_image"].shape == data["mask"].shape and data["depth_image"].dtype == torch.float32
        np.testing.assert_array_equal(data["mask"][..., 0].numpy(), _served(store, name, "mask", level) > 0)
        np.testing.assert_array_equal(
            data["depth_image"][..., 0].numpy(), _served(store, name, "depth", level)
        )
    parser = RaykitDataParserConfig(data=masked["images"], components=())
    plain = RaykitImageDataManagerConfig(dataparser=parser).setup(device="cpu")
    assert set(plain.next_train(0)[1]) == {"image_idx", "image"}


@pytest.mark.parametrize("normalize", [False, True])
def test_gsplat_dataset_fills_mask_and_real_depths(masked: dict[str, Path], normalize: bool) -> None:
    from raykit.integrations.gsplat import Dataset, Parser

    parser = Parser(str(masked["images"]), normalize=normalize, factor=2)
    store = parser.store
    dataset = Dataset(parser, "train", load_depths=True)
    item = dataset[1]
    name = parser.image_names[int(dataset.indices[1])]
    mask = _served(store, name, "mask", 2)
    depth = _served(store, name, "depth", 2)
    assert item["mask"].dtype == torch.bool and item["mask"].shape == item["image"].shape[:2]
    np.testing.assert_array_equal(item["mask"].numpy(), mask > 0)
    ys, xs = np.nonzero(depth > 0)
    np.testing.assert_array_equal(
        item["points"].numpy(), np.stack([xs + 0.5, ys + 0.5], 1).astype(np.float32)
    )
    scale = parser.world_scale
    assert (scale != pytest.approx(1.0)) == normalize
    np.testing.assert_allclose(item["depths"].numpy(), depth[ys, xs] * scale, rtol=1e-6)
    patched = Dataset(parser, "train", patch_size=8, load_depths=False)[1]
    assert patched["mask"].shape == (8, 8) and "points" not in patched


def test_gsplat_dataset_without_depth_maps_projects_the_sparse_points(colmap: dict[str, Any]) -> None:
    from raykit.integrations.gsplat import Dataset, Parser

    item = Dataset(Parser(str(colmap["store"])), "train", load_depths=True)[0]
    assert "mask" not in item and item["points"].shape[1] == 2 and len(item["depths"]) == len(item["points"])
