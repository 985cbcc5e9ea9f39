"""raykit camera models in nerfstudio's terms: the rays nerfstudio's ``Cameras`` make from the mapped
camera are raykit's own rays for every model nerfstudio can represent; the others are refused."""

from __future__ import annotations

import pytest
import torch

from raykit.cameras import CAMERA_MODELS, Camera, unproject
from raykit.errors import CameraError
from raykit.integrations.camera_map import NERFSTUDIO_MODELS, nerfstudio_intrinsics

PARAMS = {
    "SIMPLE_PINHOLE": (40.0, 16.0, 12.0),
    "PINHOLE": (40.0, 42.0, 16.0, 12.0),
    "SIMPLE_RADIAL": (40.0, 16.0, 12.0, -0.1),
    "RADIAL": (40.0, 16.0, 12.0, -0.1, 0.02),
    "OPENCV": (40.0, 42.0, 16.0, 12.0, -0.1, 0.02, 0.001, -0.002),
    "FULL_OPENCV": (40.0, 42.0, 16.0, 12.0, -0.1, 0.02, 0.001, -0.002, 0.003, 0.0, 0.0, 0.0),
    "OPENCV_FISHEYE": (20.0, 21.0, 16.0, 12.0, 0.05, -0.01, 0.002, -0.0005),
    "SIMPLE_RADIAL_FISHEYE": (20.0, 16.0, 12.0, 0.05),
    "RADIAL_FISHEYE": (20.0, 16.0, 12.0, 0.05, -0.01),
    "SIMPLE_FISHEYE": (20.0, 16.0, 12.0),
    "FISHEYE": (20.0, 21.0, 16.0, 12.0),
}


def test_distortion_vector_order_is_k1_k2_k3_k4_p1_p2() -> None:
    mapped = nerfstudio_intrinsics(Camera("OPENCV", 32, 24, PARAMS["OPENCV"]))
    assert mapped.distortion == (-0.1, 0.02, 0.0, 0.0, 0.001, -0.002) and mapped.camera_type == "PERSPECTIVE"
    fisheye = nerfstudio_intrinsics(Camera("OPENCV_FISHEYE", 32, 24, PARAMS["OPENCV_FISHEYE"]))
    assert fisheye.distortion == (0.05, -0.01, 0.002, -0.0005, 0.0, 0.0) and fisheye.camera_type == "FISHEYE"


@pytest.mark.parametrize("model", sorted(NERFSTUDIO_MODELS))
def test_nerfstudio_rays_equal_raykit_rays(model: str) -> None:
    cameras_mod = pytest.importorskip("nerfstudio.cameras.cameras")
    camera = Camera(model, 32, 24, PARAMS[model])
    k = nerfstudio_intrinsics(camera)
    ns = cameras_mod.Cameras(
        camera_to_worlds=torch.eye(4)[:3][None], fx=k.fx, fy=k.fy, cx=k.cx, cy=k.cy, width=32, height=24,
        distortion_params=torch.tensor([k.distortion]), camera_type=cameras_mod.CameraType[k.camera_type],
    )  # fmt: skip
    ys, xs = torch.meshgrid(torch.arange(4, 20), torch.arange(4, 28), indexing="ij")
    coords = torch.stack([ys, xs], -1).reshape(-1, 2).float() + 0.5  # nerfstudio's (y, x) pixel centres
    bundle = ns.generate_rays(camera_indices=0, coords=coords)
    theirs = bundle.directions.double()
    ours = unproject(camera, coords.flip(-1).double())  # (x, y) image coordinates, OpenCV camera frame
    ours = ours * torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64)  # OpenCV -> OpenGL camera axes
    torch.testing.assert_close(theirs, torch.nn.functional.normalize(ours, dim=-1), atol=2e-5, rtol=0)


@pytest.mark.parametrize("model", sorted(set(CAMERA_MODELS) - set(NERFSTUDIO_MODELS)))
def test_other_models_are_refused_in_one_line_naming_the_model(model: str) -> None:
    spec = CAMERA_MODELS[model]
    params = tuple([30.0] * 4 + [0.0] * (len(spec.param_names) - 4))[: len(spec.param_names)]
    if model == "EUCM":
        params = (30.0, 30.0, 16.0, 12.0, 0.5, 1.0)
    camera = Camera(model, 32, 24, params, label="cam.txt")
    with pytest.raises(
        CameraError, match=rf"cam.txt: camera model {model} has no nerfstudio equivalent"
    ) as info:
        nerfstudio_intrinsics(camera)
    assert "\n" not in str(info.value)


def test_full_opencv_rational_terms_are_refused() -> None:
    params = (*PARAMS["FULL_OPENCV"][:9], 0.01, 0.0, 0.0)
    with pytest.raises(CameraError, match="FULL_OPENCV with rational terms k4 != 0"):
        nerfstudio_intrinsics(Camera("FULL_OPENCV", 32, 24, params))
