"""``raykit-data`` against nerfstudio's own parsers on the same capture: rays (nerfstudio's
``RayGenerator`` on both outputs, related by the similarity each parser's normalisation implies),
image sizes and pixels; splits, scene box, points; bad input refused in one line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raykit.errors import CameraError, ConfigError
from raykit.store import open_store

from .conftest import similarity


@pytest.fixture(autouse=True)
def _nerfstudio() -> None:
    """nerfstudio's parsers and raykit's (which subclass them) for every test here, each test skipping
    on its own when nerfstudio is missing (the README's test command installs it)."""
    global ns_parsers, ColmapDataParserConfig, NerfstudioDataParserConfig, InputDataset, RayGenerator
    global RaykitDataParserConfig, RaykitDataset
    ns_parsers = pytest.importorskip("nerfstudio.data.dataparsers.blender_dataparser")
    from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
    from nerfstudio.data.datasets.base_dataset import InputDataset
    from nerfstudio.model_components.ray_generators import RayGenerator

    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
    from raykit.integrations.nerfstudio.dataset import RaykitDataset


def _rays(outputs: Any, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every pixel's ray of image ``index``: origins, directions (H * W, 3) float64."""
    cameras = outputs.cameras
    h, w = int(cameras.height[index]), int(cameras.width[index])
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    indices = torch.stack([torch.full_like(ys, index), ys, xs], -1).reshape(-1, 3)
    bundle = RayGenerator(cameras)(indices)
    return bundle.origins.double(), bundle.directions.double()


def _compare(ours: Any, theirs: Any, store_path: Path, atol: float = 1e-5) -> int:
    """Asserts rays, sizes and pixels agree for every image of ``ours`` (matched by name); count."""
    world_from_source = open_store(store_path).world_from_source
    ours_from_source = similarity(ours.dataparser_transform, ours.dataparser_scale) @ world_from_source
    to_theirs = torch.from_numpy(
        similarity(theirs.dataparser_transform, theirs.dataparser_scale) @ np.linalg.inv(ours_from_source)
    )
    their_files = [Path(str(f)).with_suffix("").as_posix() for f in theirs.image_filenames]
    ours_set, theirs_set = RaykitDataset(ours), InputDataset(theirs)
    for i, name in enumerate(ours.metadata["raykit_names"]):
        stem = Path(name).with_suffix("").as_posix()
        (j,) = [k for k, f in enumerate(their_files) if f.endswith("/" + stem)]
        assert (
            ours.cameras.width[i] == theirs.cameras.width[j]
            and ours.cameras.height[i] == theirs.cameras.height[j]
        )
        o1, d1 = _rays(ours, i)
        o2, d2 = _rays(theirs, j)
        moved_d = torch.nn.functional.normalize(d1 @ to_theirs[:3, :3].T, dim=-1)
        torch.testing.assert_close(o1 @ to_theirs[:3, :3].T + to_theirs[:3, 3], o2, atol=atol, rtol=0)
        torch.testing.assert_close(moved_d, d2, atol=atol, rtol=0)
        assert torch.equal(ours_set.get_image_uint8(i), theirs_set.get_image_uint8(j))
        assert torch.equal(ours_set[i]["image"], theirs_set[j]["image"])
    return len(ours.metadata["raykit_names"])


@pytest.mark.parametrize("form", ["rays", "images", "wds"])
def test_blender_capture_agrees_with_nerfstudio_blender(lego: dict[str, Any], form: str) -> None:
    theirs = ns_parsers.BlenderDataParserConfig(data=lego["capture"]).setup()
    ours = RaykitDataParserConfig(data=lego[form]).setup()
    for split in ("train", "val"):
        assert (
            _compare(ours.get_dataparser_outputs(split), theirs.get_dataparser_outputs(split), lego[form])
            == 1
        )
    out = ours.get_dataparser_outputs("train")
    assert torch.equal(out.alpha_color, torch.ones(3))
    assert out.cameras.distortion_params.shape == (1, 6) and not out.cameras.distortion_params.any()


def test_colmap_capture_with_distortion_agrees_with_nerfstudio_colmap(colmap: dict[str, Path]) -> None:
    theirs = ColmapDataParserConfig(
        data=colmap["capture"], colmap_path=Path("sparse/0"), images_path=Path("images"), eval_mode="all",
        downscale_factor=1,
    ).setup().get_dataparser_outputs("train")  # fmt: skip
    parser = RaykitDataParserConfig(
        data=colmap["store"], orientation_method="up", center_method="poses", auto_scale_poses=True
    ).setup()
    n = sum(
        _compare(parser.get_dataparser_outputs(split), theirs, colmap["store"]) for split in ("train", "test")
    )
    assert n == len(theirs.image_filenames)
    ours = parser.get_dataparser_outputs("train")
    k1, k2, p1, p2 = open_store(colmap["store"]).table.cameras[0].params[4:]
    assert ours.cameras.distortion_params[0].tolist() == pytest.approx([k1, k2, 0, 0, p1, p2])
    # the sparse points in the same frame as theirs (nerfstudio reads the same points3D.bin)
    theirs_xyz = theirs.metadata["points3D_xyz"].double()
    assert ours.metadata["points3D_xyz"].shape == theirs_xyz.shape
    assert torch.equal(ours.metadata["points3D_rgb"], theirs.metadata["points3D_rgb"])


def test_nerfstudio_data_capture_agrees_with_nerfstudio_data(ns_data: dict[str, Path]) -> None:
    theirs = NerfstudioDataParserConfig(
        data=ns_data["capture"] / "transforms.json", eval_mode="all", downscale_factor=1
    ).setup().get_dataparser_outputs("train")  # fmt: skip
    parser = RaykitDataParserConfig(
        data=ns_data["store"], orientation_method="up", center_method="poses", auto_scale_poses=True
    ).setup()
    n = sum(
        _compare(parser.get_dataparser_outputs(split), theirs, ns_data["store"])
        for split in ("train", "test")
    )
    assert n == len(theirs.image_filenames)


def test_scene_box_and_points_follow_the_parser_frame(colmap: dict[str, Path]) -> None:
    plain = RaykitDataParserConfig(data=colmap["store"]).setup().get_dataparser_outputs("train")
    scaled = (
        RaykitDataParserConfig(data=colmap["store"], scale_factor=2.0).setup().get_dataparser_outputs("train")
    )
    torch.testing.assert_close(scaled.scene_box.aabb, 2 * plain.scene_box.aabb)
    torch.testing.assert_close(scaled.metadata["points3D_xyz"], 2 * plain.metadata["points3D_xyz"])
    store = open_store(colmap["store"])
    expected = store.sparse_points().xyz.astype(np.float32)
    assert np.allclose(plain.metadata["points3D_xyz"].numpy(), expected)


def test_stock_dataset_reads_pixels_from_the_store_without_files(lego: dict[str, Any]) -> None:
    """nerfstudio's own ``InputDataset`` on raykit-data outputs: the 'filenames' are in-memory files."""
    out = RaykitDataParserConfig(data=lego["images"]).setup().get_dataparser_outputs("train")
    assert not any(isinstance(f, str | os.PathLike) for f in out.image_filenames)
    store = open_store(lego["images"])
    pixels = store.read_image(out.metadata["raykit_names"][0])
    assert np.array_equal(InputDataset(out).get_numpy_image(0), pixels)


def test_url_location_survives_nerfstudio_path(lego: dict[str, Any]) -> None:
    from raykit.integrations.nerfstudio.store_files import store_location

    assert store_location(Path("http://host:8000/scene.zarr")) == "http://host:8000/scene.zarr"
    assert store_location(Path("s3://bucket/scene")) == "s3://bucket/scene"
    assert store_location(lego["rays"]) == str(lego["rays"])


def _listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_not_a_store_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    before = _listing(tmp_path)
    with pytest.raises(ConfigError, match=r"raykit-data: .*photos: not a raykit store") as info:
        RaykitDataParserConfig(data=tmp_path / "photos").setup()
    assert "\n" not in str(info.value) and _listing(tmp_path) == before


def test_missing_split_is_one_line(colmap: dict[str, Path]) -> None:
    parser = RaykitDataParserConfig(data=colmap["store"], eval_split="holdout").setup()
    with pytest.raises(
        ConfigError, match=r"no split 'holdout' for nerfstudio's 'val' split; the store has"
    ) as info:
        parser.get_dataparser_outputs("val")
    assert "\n" not in str(info.value)
    default = RaykitDataParserConfig(data=colmap["store"]).setup()  # no "val": nerfstudio's val is "test"
    assert default.get_dataparser_outputs("val").metadata["raykit_split"] == "test"


def test_unusable_camera_model_is_one_line(tmp_path: Path) -> None:
    from raykit.cameras import Camera
    from raykit.store import ImageRecord, SceneInfo, write_store

    camera = Camera("FOV", 8, 6, (10.0, 10.0, 4.0, 3.0, 0.5), label="camera 1 (fov.png)")
    image = np.zeros((6, 8, 3), np.uint8)
    record = ImageRecord("fov.png", "train", camera, np.eye(4), 0.1, 5.0, "mem://fov", _Constant(image))
    write_store(tmp_path / "fov.zarr", [record], scene=SceneInfo())
    before = _listing(tmp_path)
    with pytest.raises(
        CameraError, match=r"image fov.png: camera model FOV has no nerfstudio equivalent"
    ) as info:
        RaykitDataParserConfig(data=tmp_path / "fov.zarr").setup().get_dataparser_outputs("train")
    assert "\n" not in str(info.value) and _listing(tmp_path) == before


class _Constant:
    """A picklable ``load()`` returning fixed pixels."""

    def __init__(self, image: np.ndarray) -> None:
        self.image = image

    def __call__(self) -> np.ndarray:
        return self.image
