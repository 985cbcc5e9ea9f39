"""The tabulated ray generator gives nerfstudio's ``RayGenerator`` bundles (fields, shapes, dtypes and
values to float32 rounding) for every central camera model, and defers to it for the others."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _nerfstudio() -> None:
    """nerfstudio's cameras and raykit's ray tables for every test here, each test skipping on its
    own when nerfstudio is missing."""
    global \
        Cameras, \
        CameraType, \
        RayGenerator, \
        RaykitDataParserConfig, \
        TABLE_BYTES_PER_PIXEL, \
        TabulatedRayGenerator, \
        perspective_table, \
        reference_table, \
        table_bytes, \
        tabulated_or_stock
    pytest.importorskip("nerfstudio.cameras.cameras")
    from nerfstudio.cameras.cameras import Cameras, CameraType
    from nerfstudio.model_components.ray_generators import RayGenerator

    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
    from raykit.integrations.nerfstudio.rays import (
        TABLE_BYTES_PER_PIXEL,
        TabulatedRayGenerator,
        perspective_table,
        reference_table,
        table_bytes,
        tabulated_or_stock,
    )


def _random_indices(cameras: Cameras, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, len(cameras), (n,), generator=g)
    y = (torch.rand(n, generator=g) * cameras.height[c, 0]).long()
    x = (torch.rand(n, generator=g) * cameras.width[c, 0]).long()
    return torch.stack([c, y, x], dim=1)


def _assert_same_rays(cameras: Cameras, n: int = 3000, seed: int = 0) -> None:
    indices = _random_indices(cameras, n, seed)
    ours, theirs = TabulatedRayGenerator(cameras)(indices), RayGenerator(cameras)(indices)
    for name in ("origins", "directions", "pixel_area", "camera_indices"):
        a, b = getattr(ours, name), getattr(theirs, name)
        assert (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device), name
    assert torch.equal(ours.origins, theirs.origins)
    assert torch.equal(ours.camera_indices, theirs.camera_indices)
    torch.testing.assert_close(ours.directions, theirs.directions, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.pixel_area, theirs.pixel_area, rtol=1e-4, atol=1e-12)
    assert ours.metadata.keys() == theirs.metadata.keys() == {"directions_norm"}
    torch.testing.assert_close(
        ours.metadata["directions_norm"], theirs.metadata["directions_norm"], rtol=1e-6, atol=0
    )
    assert ours.nears is theirs.nears is None and ours.times is theirs.times is None


def _poses(n: int, seed: int) -> torch.Tensor:
    """(n, 3, 4) random rotations and translations."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, 3, 3, generator=g, dtype=torch.float64))
    return torch.cat([q.float(), torch.randn(n, 3, 1, generator=g)], dim=2)


def test_distorted_colmap_cameras_give_nerfstudios_rays(colmap: dict[str, Path]) -> None:
    cameras = RaykitDataParserConfig(data=colmap["store"]).setup().get_dataparser_outputs("train").cameras
    assert cameras.distortion_params is not None and bool(cameras.distortion_params.any())
    _assert_same_rays(cameras)


def test_mixed_models_and_sizes_give_nerfstudios_rays() -> None:
    """Perspective (one distorted), fisheye and equirectangular cameras of three sizes, one table each
    set of intrinsics (the two undistorted perspective cameras share one)."""
    n = 5
    types = [CameraType.PERSPECTIVE, CameraType.PERSPECTIVE, CameraType.PERSPECTIVE, CameraType.FISHEYE]
    types.append(CameraType.EQUIRECTANGULAR)
    width = torch.tensor([[40], [40], [40], [36], [64]])
    height = torch.tensor([[30], [30], [30], [36], [32]])
    fx = torch.tensor([[35.0], [35.0], [35.0], [20.0], [32.0]])
    distortion = torch.zeros(n, 6)
    distortion[2] = torch.tensor([0.05, -0.01, 0.002, 0.0, 0.001, -0.002])
    distortion[3] = torch.tensor([0.02, 0.001, 0.0, 0.0, 0.0, 0.0])
    cameras = Cameras(
        camera_to_worlds=_poses(n, 1), fx=fx, fy=fx * 1.05,
        cx=width / 2.0 + 0.3, cy=height / 2.0 - 0.2, width=width, height=height,
        distortion_params=distortion, camera_type=torch.tensor([[t.value] for t in types]),
    )  # fmt: skip
    cameras.cx[4], cameras.cy[4] = 32.0, 16.0  # equirectangular: principal point at the centre
    assert table_bytes(cameras) == (2 * 40 * 30 + 36 * 36 + 64 * 32) * TABLE_BYTES_PER_PIXEL
    _assert_same_rays(cameras, seed=3)


def test_cameras_it_cannot_tabulate_use_nerfstudios_generator() -> None:
    poses = _poses(2, 2)
    common = {"fx": 30.0, "fy": 30.0, "cx": 20.0, "cy": 15.0, "width": 40, "height": 30}
    ods = Cameras(camera_to_worlds=poses, camera_type=CameraType.OMNIDIRECTIONALSTEREO_L, **common)
    timed = Cameras(camera_to_worlds=poses, times=torch.tensor([[0.0], [1.0]]), **common)
    plain = Cameras(camera_to_worlds=poses, **common)
    assert table_bytes(ods) is None and table_bytes(timed) is None
    for cameras, budget in ((ods, 1 << 30), (timed, 1 << 30), (plain, 40 * 30 * TABLE_BYTES_PER_PIXEL - 1)):
        assert type(tabulated_or_stock(cameras, budget)) is RayGenerator
    assert isinstance(tabulated_or_stock(plain, 40 * 30 * TABLE_BYTES_PER_PIXEL), TabulatedRayGenerator)
    with pytest.raises(ValueError, match="RayGenerator"):
        TabulatedRayGenerator(timed)


def test_undistorted_perspective_tables_are_nerfstudios_own(lego: dict[str, Path]) -> None:
    """The written-out perspective table equals the one nerfstudio's generate_rays makes."""
    cameras = RaykitDataParserConfig(data=lego["rays"]).setup().get_dataparser_outputs("train").cameras
    assert int(cameras.camera_type[0]) == CameraType.PERSPECTIVE.value
    for ours, theirs in zip(perspective_table(cameras[0:1]), reference_table(cameras[0:1]), strict=True):
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    _assert_same_rays(cameras, seed=5)


def test_ray_bundle_equals_nerfstudios_constructor() -> None:
    """The bundle built without the broadcasting pass has every field, value and the batch shape of
    the one nerfstudio's constructor builds, and behaves as one (slicing, ``to``, ``flatten``)."""
    from nerfstudio.cameras.rays import RayBundle

    from raykit.integrations.nerfstudio.rays import ray_bundle

    g = torch.Generator().manual_seed(3)
    n = 257
    fields = (
        torch.rand(n, 3, generator=g),
        torch.rand(n, 3, generator=g),
        torch.rand(n, 1, generator=g),
        torch.randint(0, 9, (n, 1), generator=g),
        torch.rand(n, 1, generator=g),
    )
    ours = ray_bundle(*fields)
    theirs = RayBundle(
        origins=fields[0],
        directions=fields[1],
        pixel_area=fields[2],
        camera_indices=fields[3],
        metadata={"directions_norm": fields[4]},
    )
    assert ours.shape == theirs.shape == (n,)
    for name in ("origins", "directions", "pixel_area", "camera_indices", "nears", "fars", "times"):
        a, b = getattr(ours, name), getattr(theirs, name)
        assert (a is None and b is None) or torch.equal(a, b), name
    assert ours.metadata.keys() == theirs.metadata.keys() == {"directions_norm"}
    assert torch.equal(ours.metadata["directions_norm"], theirs.metadata["directions_norm"])
    assert torch.equal(ours[10:20].directions, theirs[10:20].directions) and ours[10:20].shape == (10,)
    assert torch.equal(ours.to("cpu").origins, theirs.origins) and ours.flatten().shape == (n,)
    # other shapes take nerfstudio's constructor (which broadcasts them)
    odd = ray_bundle(fields[0], fields[1], fields[2], fields[3], torch.rand(1, 1, generator=g))
    assert odd.metadata["directions_norm"].shape == (n, 1)
