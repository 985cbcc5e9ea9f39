"""Camera models against pycolmap (the oracle), round trips, validation, scaling and pixels_to_rays."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pycolmap
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raykit.camera_models import Dual
from raykit.cameras import (
    CAMERA_MODELS,
    Camera,
    direction_lut,
    pixel_grid,
    pixels_to_rays,
    project,
    unproject,
    unproject_valid,
)
from raykit.errors import CameraError, RaykitError

MODELS = list(CAMERA_MODELS)

# Half-ranges of the random distortion parameters: small enough that every model is invertible over
# the whole image, large enough that distortion moves corners by several pixels.
PARAM_RANGES = {
    "SIMPLE_RADIAL": [0.1],
    "RADIAL": [0.1, 0.02],
    "OPENCV": [0.1, 0.02, 0.002, 0.002],
    "OPENCV_FISHEYE": [0.05, 0.01, 0.002, 0.0005],
    "FULL_OPENCV": [0.1, 0.02, 0.002, 0.002, 0.005, 0.01, 0.01, 0.005],
    "SIMPLE_RADIAL_FISHEYE": [0.05],
    "RADIAL_FISHEYE": [0.05, 0.01],
    "THIN_PRISM_FISHEYE": [0.05, 0.01, 0.001, 0.001, 0.002, 0.0005, 0.001, 0.001],
    "RAD_TAN_THIN_PRISM_FISHEYE": [
        0.05,
        0.01,
        0.002,
        5e-4,
        1e-4,
        2e-5,
        0.001,
        0.001,
        0.001,
        5e-4,
        0.001,
        5e-4,
    ],
    "SIMPLE_DIVISION": [0.15],
    "DIVISION": [0.15],
}


def random_camera(model: str, seed: int, width: int = 37, height: int = 23) -> Camera:
    """A valid camera of ``model`` with random intrinsics and distortion (deterministic in ``seed``)."""
    rng = np.random.default_rng(seed)
    spec = CAMERA_MODELS[model]
    size = max(width, height)
    focal = list(rng.uniform(0.9, 1.3, len(spec.focal_idx)) * size)
    pp = [width / 2 + rng.uniform(-0.05, 0.05) * width, height / 2 + rng.uniform(-0.05, 0.05) * height]
    if model == "FOV":
        extra = [rng.uniform(0.3, 1.2)]
    elif model == "EUCM":
        extra = [rng.uniform(0.0, 1.0), rng.uniform(0.5, 1.2)]
    else:
        extra = [rng.uniform(-r, r) for r in PARAM_RANGES.get(model, [])]
    return Camera(model, width, height, tuple(focal + pp + extra), camera_id=seed, label="random")


def image_points(camera: Camera, seed: int = 0) -> np.ndarray:
    """(M, 2) float64: every pixel centre, the four image corners and random continuous points."""
    centers = pixel_grid(camera.width, camera.height).reshape(-1, 2).numpy() + 0.5
    w, h = camera.width, camera.height
    corners = np.array([[0.0, 0.0], [w, 0.0], [0.0, h], [w, h]])
    rand = np.random.default_rng(seed).uniform([0, 0], [w, h], size=(64, 2))
    return np.concatenate([centers, corners, rand])


def colmap_camera(camera: Camera) -> pycolmap.Camera:
    return pycolmap.Camera(
        model=camera.model, width=camera.width, height=camera.height, params=list(camera.params)
    )


def colmap_rays(camera: Camera, xy: np.ndarray) -> np.ndarray:
    uv = np.asarray(colmap_camera(camera).cam_from_img(xy))
    rays = np.concatenate([uv, np.ones_like(uv[:, :1])], axis=1)
    return rays / np.linalg.norm(rays, axis=1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("model", MODELS)
def test_unproject_matches_pycolmap(model: str, seed: int) -> None:
    camera = random_camera(model, seed)
    xy = image_points(camera, seed)
    rays, valid = unproject_valid(camera, torch.from_numpy(xy))
    assert bool(valid.all())
    np.testing.assert_allclose(rays.numpy(), colmap_rays(camera, xy), rtol=0, atol=1e-6)


@pytest.mark.parametrize("model", MODELS)
def test_project_matches_pycolmap(model: str) -> None:
    camera = random_camera(model, 3)
    # Points in front of the camera: unprojected image points at random depths.
    xy = image_points(camera, 3)
    depth = np.random.default_rng(3).uniform(0.5, 5.0, size=(len(xy), 1))
    points = unproject(camera, torch.from_numpy(xy)).numpy() * depth
    expected = np.asarray(colmap_camera(camera).img_from_cam(points))
    np.testing.assert_allclose(project(camera, torch.from_numpy(points)).numpy(), expected, atol=1e-9)


@pytest.mark.parametrize("model", MODELS)
def test_unproject_project_round_trip(model: str) -> None:
    camera = random_camera(model, 4)
    xy = torch.from_numpy(image_points(camera, 4))
    rays = unproject(camera, xy)
    torch.testing.assert_close(
        torch.linalg.vector_norm(rays, dim=-1), torch.ones(len(xy), dtype=torch.float64)
    )
    assert float((project(camera, rays) - xy).abs().max()) < 1e-4
    # float32 keeps the dtype and agrees with float64 to float32 precision.
    rays32 = unproject(camera, xy.float())
    assert rays32.dtype == torch.float32
    assert float((rays32.double() - rays).abs().max()) < 1e-5
    assert float((project(camera, rays32) - xy.float()).abs().max()) < 5e-3


@settings(max_examples=40, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    seed=st.integers(0, 2**31 - 1),
    width=st.integers(1, 64),
    height=st.integers(1, 64),
    fx=st.floats(0.0, 1.0),
    fy=st.floats(0.0, 1.0),
)
def test_round_trip_property(model: str, seed: int, width: int, height: int, fx: float, fy: float) -> None:
    camera = random_camera(model, seed, width, height)
    xy = torch.tensor([[fx * width, fy * height]], dtype=torch.float64)
    rays, valid = unproject_valid(camera, xy)
    assert bool(valid.all())
    assert float((project(camera, rays) - xy).abs().max()) < 1e-4
    # A ray and any positive multiple of it project to the same pixel.
    assert float((project(camera, rays * 7.5) - xy).abs().max()) < 1e-4


@pytest.mark.parametrize("model", ["SIMPLE_FISHEYE", "OPENCV_FISHEYE", "RAD_TAN_THIN_PRISM_FISHEYE", "EUCM"])
def test_fisheye_beyond_90_degrees(model: str) -> None:
    base = random_camera(model, 5, 64, 64)
    # A short focal length puts the image corners ~130 degrees off-axis; distortion is kept mild so
    # the model stays invertible that far out.
    spec = CAMERA_MODELS[model]
    params = [0.05 * p if i in spec.extra_idx else p for i, p in enumerate(base.params)]
    for i in spec.focal_idx:
        params[i] = 22.0 if model == "EUCM" else 20.0
    if model == "EUCM":
        params[4:] = [0.6, 1.0]  # reaches beyond 90 degrees for normalised radii in (1.67, 2.24)
    camera = Camera(model, 64, 64, tuple(params))
    xy = torch.from_numpy(image_points(camera))
    rays, valid = unproject_valid(camera, xy)
    assert bool(valid.all())
    assert float(rays[:, 2].min()) < 0, "expected rays behind the image plane"
    assert float((project(camera, rays) - xy).abs().max()) < 1e-4
    # Within 80 degrees of the axis pycolmap's normalised coordinates still apply.
    front = (rays[:, 2] > math.cos(math.radians(80))).numpy()
    np.testing.assert_allclose(rays.numpy()[front], colmap_rays(camera, xy.numpy()[front]), atol=1e-6)


@pytest.mark.parametrize("omega", [0.0, 0.005, -0.7, 0.7])
def test_fov_taylor_branches_match_pycolmap(omega: float) -> None:
    camera = Camera("FOV", 30, 20, (25.0, 26.0, 14.7, 10.2, omega))
    # Points within 0.01 focal lengths of the principal point take COLMAP's small-radius branch.
    near_axis = np.array([[14.7, 10.2], [14.8, 10.25], [14.6, 10.1]])
    xy = np.concatenate([image_points(camera), near_axis])
    rays = unproject(camera, torch.from_numpy(xy))
    np.testing.assert_allclose(rays.numpy(), colmap_rays(camera, xy), atol=1e-6)
    expected = np.asarray(colmap_camera(camera).img_from_cam(rays.numpy() * 2.0))
    np.testing.assert_allclose(project(camera, rays * 2.0).numpy(), expected, atol=1e-9)
    assert float((project(camera, rays) - torch.from_numpy(xy)).abs().max()) < 1e-4


@pytest.mark.parametrize(
    "model",
    [
        m
        for m in MODELS
        if CAMERA_MODELS[m].extra_idx and CAMERA_MODELS[m].family in ("perspective", "fisheye")
    ],
)
def test_distortion_jacobian_matches_finite_differences(model: str) -> None:
    spec = CAMERA_MODELS[model]
    camera = random_camera(model, 11)
    extra = tuple(camera.params[i] for i in spec.extra_idx)
    u, v = (
        torch.linspace(-0.8, 0.8, 9, dtype=torch.float64),
        torch.linspace(0.7, -0.6, 9, dtype=torch.float64),
    )
    du, dv = spec.distortion(Dual(u, 1.0, 0.0), Dual(v, 0.0, 1.0), extra)  # type: ignore[misc]
    h = 1e-6
    for d, (plus, minus) in (
        ("du", (spec.distortion(u + h, v, extra), spec.distortion(u - h, v, extra))),  # type: ignore[misc]
        ("dv", (spec.distortion(u, v + h, extra), spec.distortion(u, v - h, extra))),  # type: ignore[misc]
    ):
        for k, out in enumerate((du, dv)):
            numeric = (plus[k] - minus[k]) / (2 * h)
            torch.testing.assert_close(getattr(out, d) + 0 * u, numeric, atol=1e-7, rtol=0)


def test_project_marks_points_behind_perspective_camera() -> None:
    camera = random_camera("OPENCV", 0)
    out = project(camera, torch.tensor([[0.1, 0.2, -1.0], [0.1, 0.2, 1.0]], dtype=torch.float64))
    assert bool(torch.isnan(out[0]).all()) and bool(torch.isfinite(out[1]).all())


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"model": "OPENCV", "params": (1.0, 1.0, 2.0)}, "expects 8 params"),
        ({"model": "PINHOLE", "params": (0.0, 10.0, 5.0, 5.0)}, "positive focal length fx"),
        ({"model": "SIMPLE_PINHOLE", "params": (-3.0, 5.0, 5.0)}, "positive focal length f"),
        ({"model": "PINHOLE", "params": (10.0, 10.0, float("nan"), 5.0)}, "cx must be finite"),
        ({"model": "SIMPLE_RADIAL", "params": (10.0, 5.0, 5.0, float("inf"))}, "k must be finite"),
        ({"model": "PINHOLE_FANCY", "params": (10.0, 5.0, 5.0)}, "unknown camera model 'PINHOLE_FANCY'"),
        ({"model": 17, "params": (10.0, 5.0, 5.0)}, "unknown camera model id 17"),
        ({"model": "PINHOLE", "params": (10.0, 10.0, 5.0, 5.0), "width": 0}, "positive integer width"),
        ({"model": "PINHOLE", "params": (10.0, 10.0, 5.0, 5.0), "height": 2.5}, "positive integer height"),
        ({"model": "PINHOLE", "params": ("a", 10.0, 5.0, 5.0)}, "params must be numbers"),
        ({"model": "EUCM", "params": (10.0, 10.0, 5.0, 5.0, 1.5, 1.0)}, "0 <= alpha <= 1"),
        ({"model": "FOV", "params": (10.0, 10.0, 5.0, 5.0, 4.0)}, "|omega| < pi"),
    ],
)
def test_invalid_camera_names_camera_and_problem(kwargs: dict, problem: str) -> None:
    args = {"width": 10, "height": 10, "camera_id": 7, "label": "cameras.txt", **kwargs}
    with pytest.raises(CameraError) as info:
        Camera(**args)
    message = str(info.value)
    assert "camera 7 (cameras.txt)" in message and problem in message
    assert isinstance(info.value, RaykitError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("model", MODELS)
def test_registry_matches_colmap(model: str) -> None:
    spec = CAMERA_MODELS[model]
    assert int(pycolmap.CameraModelId.__members__[model].value) == spec.model_id
    info = pycolmap.Camera.create_from_model_name(1, model, 100.0, 64, 48).params_info
    assert tuple(p.strip() for p in info.split(",")) == spec.param_names


@pytest.mark.parametrize("model", MODELS)
def test_dict_round_trip_and_model_id(model: str) -> None:
    camera = random_camera(model, 6)
    assert Camera.from_dict(camera.to_dict()) == camera
    assert pickle.loads(pickle.dumps(camera)) == camera  # loader workers receive cameras pickled
    by_id = Camera(camera.model_id, camera.width, camera.height, camera.params)  # type: ignore[arg-type]
    assert by_id.model == model
    assert Camera.from_dict({k: v for k, v in camera.to_dict().items() if k != "model"}) == camera
    with pytest.raises(CameraError, match="has id"):
        Camera.from_dict({**camera.to_dict(), "model_id": (camera.model_id + 1) % 17})


@pytest.mark.parametrize("model", MODELS)
def test_scaled_rescales_image_coordinates(model: str) -> None:
    camera = random_camera(model, 7, width=40, height=24)
    small = camera.scaled(4)
    assert (small.width, small.height) == (10, 6)
    # A continuous image coordinate p becomes p / factor: same rays through corresponding points.
    xy = torch.from_numpy(image_points(camera))
    torch.testing.assert_close(unproject(small, xy / 4), unproject(camera, xy), atol=1e-9, rtol=0)
    # The centre of a small pixel is the centre of the 4x4 block of large pixels it covers.
    lut_small = direction_lut(small, torch.float64)
    block_center = torch.tensor([[4 * 3 + 2.0, 4 * 2 + 2.0]], dtype=torch.float64)
    torch.testing.assert_close(lut_small[2, 3], unproject(camera, block_center)[0], atol=1e-9, rtol=0)
    assert camera.scaled(1) == camera


def test_scaled_rejects_inexact_factors() -> None:
    camera = random_camera("PINHOLE", 0, width=30, height=20)
    assert camera.scaled(2.5).width == 12
    for factor in (4, 0, -1, float("nan")):
        with pytest.raises(CameraError):
            camera.scaled(factor)


def test_intrinsics_and_pinhole_flag() -> None:
    camera = Camera("OPENCV", 40, 30, (50.0, 60.0, 20.0, 15.0, 0.0, 0.0, 0.0, 0.0))
    np.testing.assert_array_equal(camera.K(), [[50.0, 0, 20.0], [0, 60.0, 15.0], [0, 0, 1]])
    assert camera.is_pinhole
    assert not Camera("OPENCV", 40, 30, (50.0, 60.0, 20.0, 15.0, 0.1, 0.0, 0.0, 0.0)).is_pinhole
    assert not Camera("SIMPLE_FISHEYE", 40, 30, (50.0, 20.0, 15.0)).is_pinhole
    assert Camera("SIMPLE_PINHOLE", 40, 30, (50.0, 20.0, 15.0)).focal == (50.0, 50.0)


@pytest.mark.parametrize("model", ["PINHOLE", "OPENCV", "FISHEYE", "FULL_OPENCV"])
def test_direction_lut_is_memoised_unproject_of_pixel_centres(model: str) -> None:
    camera = random_camera(model, 8)
    lut = direction_lut(camera, torch.float64)
    assert lut.shape == (camera.height, camera.width, 3)
    assert direction_lut(camera, torch.float64) is lut
    centers = pixel_grid(camera.width, camera.height).double() + 0.5
    torch.testing.assert_close(lut, unproject(camera, centers), atol=1e-12, rtol=0)
    torch.testing.assert_close(direction_lut(camera).double(), lut, atol=1e-7, rtol=0)


def _pose(seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    c2w = np.eye(4)
    c2w[:3, :3] = q * np.sign(np.linalg.det(q))
    c2w[:3, 3] = rng.normal(size=3)
    return torch.from_numpy(c2w)


@pytest.mark.parametrize("model", ["PINHOLE", "OPENCV", "OPENCV_FISHEYE", "EUCM"])
def test_pixels_to_rays_project_back_to_pixel_centres(model: str) -> None:
    camera = random_camera(model, 9)
    c2w = _pose(9)
    pixels = pixel_grid(camera.width, camera.height).reshape(-1, 2)
    origins, directions, z_scale = pixels_to_rays(camera, c2w, pixels)
    assert origins.dtype == torch.float64
    torch.testing.assert_close(origins, c2w[:3, 3].expand(len(pixels), 3))
    torch.testing.assert_close(
        torch.linalg.vector_norm(directions, dim=-1), torch.ones(len(pixels), dtype=torch.float64)
    )
    # A point at distance t along the ray, taken back to the camera frame, has depth t * z_scale and
    # projects to the pixel's centre.
    t = 3.0
    cam_points = (origins + t * directions - c2w[:3, 3]) @ c2w[:3, :3]
    torch.testing.assert_close(cam_points[:, 2], t * z_scale)
    torch.testing.assert_close(project(camera, cam_points), pixels.double() + 0.5, atol=1e-6, rtol=0)
    # Per-ray poses give the same result as one shared pose.
    per_ray = pixels_to_rays(camera, c2w.expand(len(pixels), 4, 4), pixels)
    torch.testing.assert_close(per_ray[1], directions)


def test_pixels_to_rays_pinhole_fast_path_matches_unproject() -> None:
    camera = Camera("OPENCV", 20, 10, (18.0, 19.0, 9.5, 5.5, 0.0, 0.0, 0.0, 0.0))
    pixels = pixel_grid(20, 10).reshape(-1, 2)
    _, directions, _ = pixels_to_rays(camera, np.eye(4), pixels)
    assert directions.dtype == torch.float32
    torch.testing.assert_close(directions, unproject(camera, pixels.double() + 0.5).float())


def test_pixels_to_rays_rejects_bad_pixels() -> None:
    camera = random_camera("OPENCV", 0)
    with pytest.raises(CameraError, match="outside"):
        pixels_to_rays(camera, torch.eye(4), torch.tensor([[camera.width, 0]]))
    with pytest.raises(CameraError, match="integer pixels"):
        pixels_to_rays(camera, torch.eye(4), torch.tensor([[1.0, 0.0]]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", MODELS)
def test_cuda_matches_cpu(model: str) -> None:
    camera = random_camera(model, 10)
    xy = torch.from_numpy(image_points(camera))
    rays = unproject(camera, xy)
    rays_cuda = unproject(camera, xy.cuda())
    assert rays_cuda.device.type == "cuda"
    torch.testing.assert_close(rays_cuda.cpu(), rays, atol=1e-9, rtol=0)
    torch.testing.assert_close(project(camera, rays.cuda()).cpu(), project(camera, rays), atol=1e-9, rtol=0)
    lut = direction_lut(camera, torch.float32, "cuda")
    torch.testing.assert_close(lut.cpu(), direction_lut(camera, torch.float32), atol=1e-6, rtol=0)
