"""raykit's datamanagers return what nerfstudio's own return (types, keys, shapes, dtypes, devices),
and a datamanager restored from a checkpoint gives the same next batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raykit.errors import ConfigError
from raykit.loaders import RayLoader


@pytest.fixture(autouse=True)
def _nerfstudio() -> None:
    """nerfstudio's classes and raykit's datamanagers (which subclass them) for every test here, each
    test skipping on its own when nerfstudio is missing (the README's test command installs it)."""
    pytest.importorskip(
        "nerfstudio", reason="nerfstudio is not installed (the README's test command installs it)"
    )
    global VanillaDataManagerConfig, FullImageDatamanagerConfig, BlenderDataParserConfig, RayGenerator
    global RaykitDataParserConfig, RaykitImageDataManagerConfig, RaykitDataManagerConfig
    from nerfstudio.data.datamanagers.base_datamanager import VanillaDataManagerConfig
    from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig
    from nerfstudio.data.dataparsers.blender_dataparser import BlenderDataParserConfig
    from nerfstudio.model_components.ray_generators import RayGenerator

    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
    from raykit.integrations.nerfstudio.image_datamanager import RaykitImageDataManagerConfig
    from raykit.integrations.nerfstudio.ray_datamanager import RaykitDataManagerConfig


def _shape(value: Any) -> Any:
    """A batch's structure: tensors as (shape, dtype, device), containers recursively."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__"):
        fields = {k: getattr(value, k) for k in value.__dataclass_fields__}
        return (type(value).__name__, {k: _shape(v) for k, v in fields.items() if v is not None})
    return type(value).__name__


def _rays_manager(store: Path, rays: int = 500, sampling: str = "uniform") -> Any:
    parser = RaykitDataParserConfig(data=store)
    return RaykitDataManagerConfig(
        dataparser=parser, train_num_rays_per_batch=rays, eval_num_rays_per_batch=rays, sampling=sampling
    ).setup(device="cpu")


def _left_quarter_loss(pixel_x: torch.Tensor, width: int) -> torch.Tensor:
    """A loss of 1 on the left quarter of every image, 0 elsewhere."""
    return (pixel_x < width // 4).to(torch.float32)


@pytest.mark.parametrize("form", ["rays", "images"])
def test_ray_datamanager_loss_sampling_is_the_loaders(lego: dict[str, Any], form: str) -> None:
    """``sampling="loss"``: each batch is the one ``RayLoader(sampling="loss")`` gives for the same seed
    and the same fed-back losses (ranks of the loader, not a sampler of the datamanager's own), carries
    the draw's ``prob`` and ``weight``, and after the map's first rebuild draws the lossy quarter more."""
    ours = _rays_manager(lego[form], sampling="loss")
    with pytest.raises(ConfigError, match="no training batch"):
        ours.observe(torch.zeros(500))
    store = ours.dataparser.store
    width = int(store.table.width[0])
    reference = RayLoader(store, "train", 500, 0, sampling="loss")
    stream = reference.forever()
    left = []
    for step in range(100):
        _, batch = ours.next_train(step)
        theirs = next(stream)
        assert torch.equal(batch["indices"][:, 2], theirs.pixel[:, 0]), step
        assert torch.equal(batch["indices"][:, 1], theirs.pixel[:, 1]), step
        assert batch["prob"].shape == batch["weight"].shape == (500, 1)
        torch.testing.assert_close(batch["prob"][:, 0], theirs.extra["prob"].to(torch.float32))
        loss = _left_quarter_loss(batch["indices"][:, 2], width)
        ours.observe(loss[:, None])  # nerfstudio's (N, 1) form
        reference.observe(theirs, loss)
        left.append(float(loss.mean()))
    with pytest.raises(ConfigError, match="one per ray"):
        ours.observe(torch.zeros(3))
    assert np.mean(left[:20]) < 0.35 < 0.45 < np.mean(left[-20:])  # uniform: 0.25


def test_ray_datamanager_feeds_back_nerfactos_per_ray_loss(lego: dict[str, Any]) -> None:
    """``observe_outputs``: the per-ray loss fed back is the squared error nerfacto's loss averages
    (through the model's background blending when it has one); uniform sampling ignores it."""
    ours = _rays_manager(lego["rays"], sampling="loss")
    _, batch = ours.next_train(0)
    fed: list[torch.Tensor] = []
    ours.train_loader.observe = lambda rays, losses: fed.append(torch.as_tensor(losses))
    rgb = torch.rand(len(batch["image"]), 3)
    ours.observe_outputs(None, {"rgb": rgb})
    expected = ((rgb - batch["image"][:, :3]) ** 2).mean(-1)
    torch.testing.assert_close(fed[0], expected)
    plain = _rays_manager(lego["rays"])
    plain.next_train(0)
    plain.train_loader.observe = lambda rays, losses: fed.append(losses)
    plain.observe_outputs(None, {"rgb": rgb})
    assert len(fed) == 1


@pytest.mark.parametrize("form", ["rays", "images"])
def test_ray_datamanager_batches_match_vanilla(lego: dict[str, Any], form: str) -> None:
    theirs = VanillaDataManagerConfig(
        dataparser=BlenderDataParserConfig(data=lego["capture"]), train_num_rays_per_batch=500,
        eval_num_rays_per_batch=500,
    ).setup(device="cpu")  # fmt: skip
    ours = _rays_manager(lego[form])
    for method in ("next_train", "next_eval", "next_eval_image"):
        assert _shape(getattr(ours, method)(0)) == _shape(getattr(theirs, method)(0)), method
    assert len(ours.fixed_indices_eval_dataloader) == len(theirs.fixed_indices_eval_dataloader)


def test_ray_datamanager_pixels_and_rays_are_the_stores(lego: dict[str, Any]) -> None:
    """Each ray's colour is its pixel's (nerfstudio's own image tensor at [camera, y, x])."""
    ours = _rays_manager(lego["rays"])
    bundle, batch = ours.next_train(0)
    image = ours.train_dataset[0]["image"]
    c, y, x = batch["indices"].unbind(-1)
    assert torch.equal(batch["image"], image[y, x]) and bool((c == 0).all())
    expected = RayGenerator(ours.train_dataset.cameras)(batch["indices"])  # nerfstudio's own
    assert torch.equal(bundle.origins, expected.origins)
    assert torch.equal(bundle.camera_indices, expected.camera_indices)
    torch.testing.assert_close(bundle.directions, expected.directions, rtol=0, atol=1e-6)
    torch.testing.assert_close(bundle.pixel_area, expected.pixel_area, rtol=1e-5, atol=0)
    torch.testing.assert_close(
        bundle.metadata["directions_norm"], expected.metadata["directions_norm"], rtol=0, atol=1e-6
    )


def test_ray_datamanager_restored_from_checkpoint_gives_the_same_next_batch(
    lego: dict[str, Any], tmp_path: Path
) -> None:
    first = _rays_manager(lego["rays"])
    for step in range(3):
        first.next_train(step)
    first.next_eval_image(0)
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    expected = first.next_train(3)[1], first.next_eval_image(1)[1]
    restored = _rays_manager(lego["rays"])
    restored.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=False))
    got = restored.next_train(3)[1], restored.next_eval_image(1)[1]
    assert torch.equal(got[0]["indices"], expected[0]["indices"]) and torch.equal(
        got[0]["image"], expected[0]["image"]
    )
    assert got[1]["image_idx"] == expected[1]["image_idx"]


@pytest.mark.parametrize("image_type", ["float32", "uint8"])
def test_image_datamanager_matches_full_image_datamanager(lego: dict[str, Any], image_type: str) -> None:
    theirs = FullImageDatamanagerConfig(
        dataparser=BlenderDataParserConfig(data=lego["capture"]),
        cache_images="gpu",  # "cpu" pins memory, which needs an accelerator
        cache_images_type=image_type,
    ).setup(device="cpu")  # fmt: skip
    ours = RaykitImageDataManagerConfig(
        dataparser=RaykitDataParserConfig(data=lego["images"]), cache_images_type=image_type
    ).setup(device="cpu")  # fmt: skip
    for method in ("next_train", "next_eval", "next_eval_image"):
        a, b = getattr(ours, method)(0), getattr(theirs, method)(0)
        assert _shape(a) == _shape(b), method
        assert a[0].metadata == b[0].metadata and torch.equal(a[1]["image"], b[1]["image"]), method
    assert [_shape(item) for item in ours.fixed_indices_eval_dataloader] == [
        _shape(item) for item in theirs.fixed_indices_eval_dataloader
    ]


def test_image_datamanager_undistorts_to_pinhole_cameras(colmap: dict[str, Path]) -> None:
    ours = RaykitImageDataManagerConfig(dataparser=RaykitDataParserConfig(data=colmap["store"])).setup(
        device="cpu"
    )
    camera, data = ours.next_train(0)
    assert not camera.distortion_params.any()
    assert data["image"].shape == (int(camera.height), int(camera.width), 3)
    distorted = ours.train_dataset.cameras[data["image_idx"]]
    assert distorted.distortion_params.any() and float(camera.fx) == pytest.approx(float(distorted.fx))


def test_image_datamanager_restored_from_checkpoint_gives_the_same_next_batch(
    colmap: dict[str, Path],
) -> None:
    def manager() -> Any:
        return RaykitImageDataManagerConfig(dataparser=RaykitDataParserConfig(data=colmap["store"])).setup(
            device="cpu"
        )

    first = manager()
    for step in range(3):
        first.next_train(step)
    state = first.state_dict()
    expected = first.next_train(3)
    restored = manager()
    restored.load_state_dict(state)
    got = restored.next_train(3)
    assert got[1]["image_idx"] == expected[1]["image_idx"] and torch.equal(
        got[1]["image"], expected[1]["image"]
    )


def test_inference_mode_loads_a_training_checkpoint(lego: dict[str, Any]) -> None:
    """ns-render and the viewer build the datamanager in "inference" mode (no loaders) and load the
    checkpoint's pipeline state into it."""
    state = _rays_manager(lego["rays"]).state_dict()
    parser = RaykitDataParserConfig(data=lego["rays"])
    viewer = RaykitDataManagerConfig(dataparser=parser).setup(device="cpu", test_mode="inference")
    viewer.load_state_dict(state)
    assert viewer.state_dict()["_extra_state"] == {} and len(viewer.train_dataset) == 1


def test_image_datamanager_follows_splatfactos_resolution_schedule(colmap: dict[str, Path]) -> None:
    from raykit.integrations.nerfstudio.image_datamanager import level_at

    config = RaykitImageDataManagerConfig(
        dataparser=RaykitDataParserConfig(data=colmap["store"]), num_downscales=2, resolution_schedule=2
    )
    ours = config.setup(device="cpu")
    full = RaykitImageDataManagerConfig(dataparser=RaykitDataParserConfig(data=colmap["store"])).setup(
        device="cpu"
    )
    for step in range(6):
        camera, data = ours.next_train(step)
        _, whole = full.next_train(step)
        level = level_at(step, 2, 2)
        assert level == [4, 4, 2, 2, 1, 1][step]
        assert data["image_idx"] == whole["image_idx"]  # the same order at every level
        height, width = int(camera.height), int(camera.width)  # full size: splatfacto scales it
        assert data["image"].shape == (height // level, width // level, 3)
        if level == 1:
            assert torch.equal(data["image"], whole["image"])
