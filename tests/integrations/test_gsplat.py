"""The gsplat adapter: items and parser attributes as gsplat's simple_trainer reads them, consistent
``K`` / ``camtoworld`` / ``points`` / ``depths``, seeded crops, and gsplat's world normalisation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from raykit.converters import convert
from raykit.errors import ConfigError
from raykit.integrations.gsplat import Dataset, Parser, align_principal_axes, similarity_from_cameras
from raykit.store import open_store
from raykit.testing import render_scene, write_colmap


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gsplat")
    write_colmap(render_scene("tiny", camera_model="OPENCV"), root / "capture", alpha=False)
    convert(root / "capture", root / "scene.zarr", layout="images")
    return root / "scene.zarr"


@pytest.mark.parametrize("normalize", [False, True])
def test_points_project_through_K_and_camtoworld_to_their_pixels(store: Path, normalize: bool) -> None:
    parser = Parser(str(store), normalize=normalize)
    dataset = Dataset(parser, "train", load_depths=True)
    assert len(dataset) > 0
    for item in range(len(dataset)):
        data = dataset[item]
        K, c2w = data["K"].double(), data["camtoworld"].double()
        assert data["K"].dtype == torch.float32 and data["K"].shape == (3, 3)
        assert data["camtoworld"].shape == (4, 4) and data["image"].dtype == torch.float32
        assert data["image_id"] == item and float(data["image"].max()) > 1.0  # 0..255
        h, w = data["image"].shape[:2]
        assert data["points"].shape[0] == data["depths"].shape[0] > 0
        # each point seen from the camera: some sparse point lies at depth along the pixel's ray
        rays = torch.cat(
            [data["points"].double(), torch.ones(len(data["points"]), 1, dtype=torch.float64)], 1
        )
        cam = (torch.linalg.inv(K) @ rays.T).T * data["depths"].double()[:, None]
        world = cam @ c2w[:3, :3].T + c2w[:3, 3]
        nearest = torch.cdist(world, torch.from_numpy(parser.points).double()).min(1).values
        assert float(nearest.max()) < 1e-4 * max(1.0, parser.scene_scale)
        assert bool(((data["points"] >= 0) & (data["points"] < torch.tensor([w, h]))).all())


def test_parser_attributes(store: Path) -> None:
    parser = Parser(str(store))
    table = open_store(store).table
    assert parser.camtoworlds.shape == (len(table.names), 4, 4)
    assert np.array_equal(parser.camtoworlds, table.c2w)
    assert set(parser.Ks_dict) == set(parser.imsize_dict) == set(parser.camera_ids)
    assert parser.points.dtype == np.float32 and parser.points_rgb.dtype == np.uint8
    assert parser.points.shape == parser.points_rgb.shape and parser.scene_scale > 0
    assert all(len(p) == 0 for p in parser.params_dict.values())  # images are served undistorted


def test_patch_crops_are_windows_of_the_image_with_shifted_K(store: Path) -> None:
    parser = Parser(str(store))
    full, patched = Dataset(parser, "train"), Dataset(parser, "train", patch_size=16, seed=3)
    a, b = full[0], patched[0]
    assert b["image"].shape == (16, 16, 3)
    x0, y0 = int(a["K"][0, 2] - b["K"][0, 2]), int(a["K"][1, 2] - b["K"][1, 2])
    assert torch.equal(b["image"], a["image"][y0 : y0 + 16, x0 : x0 + 16])
    again = Dataset(parser, "train", patch_size=16, seed=3)[0]
    assert torch.equal(again["K"], b["K"])  # seeded


def test_normalisation_is_gsplats(store: Path) -> None:
    raw, normal = Parser(str(store)), Parser(str(store), normalize=True)
    moved = raw.points.astype(np.float64) @ normal.transform[:3, :3].T + normal.transform[:3, 3]
    assert np.allclose(moved, normal.points, atol=1e-5)
    rotations = normal.camtoworlds[:, :3, :3]
    assert np.allclose(rotations @ rotations.transpose(0, 2, 1), np.eye(3), atol=1e-9)
    first = similarity_from_cameras(raw.camtoworlds)
    scale = np.cbrt(np.linalg.det(first[:3, :3]))
    centres = raw.camtoworlds[:, :3, 3] @ first[:3, :3].T + first[:3, 3]
    assert np.median(np.linalg.norm(centres, axis=1)) == pytest.approx(1.0)  # median camera distance 1
    assert scale > 0
    axes = align_principal_axes(normal.points.astype(np.float64))
    assert np.allclose(axes[:3, :3], np.eye(3), atol=1e-6)  # already on its principal axes


def test_missing_split_is_one_line(store: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"gsplat adapter: .*no split 'holdout'; the store has \['test', 'train'\]"
    ):
        Dataset(Parser(str(store)), "holdout")


def test_loader_serves_the_same_images(store: Path) -> None:
    dataset = Dataset(Parser(str(store)), "train")
    with dataset.loader(shuffle=False) as loader:
        batch = next(iter(loader))
    assert torch.equal((batch.images[0] * 255).round(), dataset[0]["image"])


def test_loss_view_sampling_through_the_dataset(store: Path) -> None:
    dataset = Dataset(Parser(str(store)), "train", sampling="loss")
    with pytest.raises(ConfigError, match="no loader"):
        dataset.observe(None, torch.zeros(1))  # type: ignore[arg-type]
    with dataset.loader() as loader:
        assert loader.config.sampling.kind == "loss"  # type: ignore[union-attr]
        target = loader.source.names[0]  # the one view with a loss: drawn far more than 1 / n
        drawn = []
        for _ in range(6):
            for batch in loader:
                assert batch.prob is not None
                drawn += batch.names
                dataset.observe(batch, torch.tensor([1.0 if n == target else 0.0 for n in batch.names]))
        with pytest.raises(ConfigError, match=r"shape \(1,\)"):
            dataset.observe(batch, torch.zeros(2))
    late = drawn[len(drawn) // 2 :]
    assert late.count(target) > 2 * len(late) / loader.plan.n_images
    with pytest.raises(ConfigError, match="sampling"):
        Dataset(Parser(str(store)), "train", sampling="best")


def test_data_factor_serves_the_level_with_its_exact_K(store: Path) -> None:
    full, half = Dataset(Parser(str(store))), Dataset(Parser(str(store), factor=2))
    a, b = full[0], half[0]
    h, w = a["image"].shape[:2]
    assert b["image"].shape == (h // 2, w // 2, 3)
    want = a["K"].double().clone()
    want[:2] /= 2  # a continuous coordinate p becomes p / 2 (convert --downscale's convention)
    assert torch.allclose(b["K"].double(), want, atol=1e-5)
    camera_id = half.parser.camera_ids[int(half.indices[0])]
    assert half.parser.imsize_dict[camera_id] == (w // 2, h // 2)
    with pytest.raises(ConfigError, match=r"factor: expected a positive integer, got 0"):
        Parser(str(store), factor=0)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_get_disjoint_shares_each_epoch(store: Path, world_size: int) -> None:
    parser = Parser(str(store))
    n = len(Dataset(parser))
    for epoch in range(3):
        shares = []
        for rank in range(world_size):
            dataset = Dataset(parser, world_size=world_size, rank=rank, seed=5)
            dataset.set_epoch(epoch)
            ids = [dataset[i]["image_id"] for i in range(len(dataset))]
            assert len(ids) == n // world_size
            shares.append(set(ids))
            with dataset.loader(shuffle=True) as loader:  # the loader's epoch 0 share is the same
                if epoch == 0:
                    rows = {int(r) for batch in loader for r in batch.image}
                    assert rows == {int(parser.split_indices("train")[i]) for i in ids}
        assert len(set().union(*shares)) == world_size * (n // world_size)  # disjoint
