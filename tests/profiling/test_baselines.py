"""The baselines' plain ray generator against raykit's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raykit.cameras import Camera
from raykit.errors import CameraError
from raykit.profiling.baselines import NerfstudioStyleRays
from raykit.rays import RayGenerator


def _random_poses(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    poses = np.tile(np.eye(4), (n, 1, 1))
    for i in range(n):
        q, r = np.linalg.qr(rng.normal(size=(3, 3)))
        poses[i, :3, :3] = q * np.sign(np.diag(r))
        poses[i, :3, 3] = rng.normal(size=3)
    return poses


def test_nerfstudio_style_rays_equal_raykit_rays() -> None:
    cams = [
        Camera("PINHOLE", 40, 30, (35.0, 33.0, 19.5, 15.25)),
        Camera("SIMPLE_PINHOLE", 20, 50, (41.0, 9.0, 26.0)),
    ]
    index = np.array([0, 1, 1, 0, 1])
    gen = RayGenerator(cams, index, _random_poses(5, 0), near=0.1, far=5.0, dtype=torch.float32)
    plain = NerfstudioStyleRays(gen)
    rng = np.random.default_rng(1)
    image = torch.as_tensor(rng.integers(0, 5, 2000))
    widths = torch.tensor([cams[c].width for c in index])[image]
    heights = torch.tensor([cams[c].height for c in index])[image]
    x = (torch.as_tensor(rng.random(2000)) * widths).long()
    y = (torch.as_tensor(rng.random(2000)) * heights).long()
    origins, directions = plain(image, y, x)
    want = gen.generate(image, torch.stack([x, y], -1))
    torch.testing.assert_close(origins, want.origins, rtol=0, atol=1e-6)
    torch.testing.assert_close(directions, want.directions, rtol=0, atol=1e-5)


def test_nerfstudio_style_rays_refuse_distorted_cameras() -> None:
    cam = Camera("SIMPLE_RADIAL", 20, 20, (20.0, 10.0, 10.0, 0.1))
    gen = RayGenerator([cam], np.zeros(1, np.int64), np.eye(4)[None], near=0.1, far=5.0)
    with pytest.raises(CameraError, match="pinhole"):
        NerfstudioStyleRays(gen)
