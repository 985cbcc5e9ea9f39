"""The built-in scene: cameras on a hemisphere around the procedural objects, rendered to RGBA views.

Every view looks at the scene centre from ``CAMERA_DISTANCE`` with a horizontal field of view of
``FOV_X`` radians, wide enough that the whole scene (a ground disc of radius 1.45 and objects up to
z = 0.7, inside ``[-1.5, 1.5]^3``) is in view. Positions are random on the upper hemisphere (elevation
10-70 degrees, uniform in area), drawn from ``seed`` with a separate stream per split.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from raykit.cameras import Camera
from raykit.errors import ConfigError
from raykit.testing.geometry import BOUNDS, SceneGeometry, build_geometry
from raykit.testing.render import _SUBPIXEL_CACHE, subpixel_directions
from raykit.testing.unbounded import UNBOUNDED_BOUNDS, build_unbounded_geometry, render_view

__all__ = [
    "CAMERA_DISTANCE",
    "FOV_X",
    "SCENE_CAMERA_MODELS",
    "SIZES",
    "SceneData",
    "SceneSize",
    "look_at_c2w",
    "render_scene",
    "scene_camera",
    "scene_poses",
]

CAMERA_DISTANCE = 4.0
FOV_X = 0.9
LOOK_AT = (0.0, 0.0, -0.1)
SCENE_CAMERA_MODELS = ("PINHOLE", "OPENCV")
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class SceneSize:
    """Image size and number of views per split."""

    width: int
    height: int
    n_train: int
    n_val: int
    n_test: int

    def count(self, split: str) -> int:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}[split]


SIZES = {
    "tiny": SceneSize(48, 48, 8, 2, 2),
    "small": SceneSize(100, 100, 60, 10, 10),
    "realistic": SceneSize(800, 800, 100, 10, 10),
}


@dataclass(frozen=True, eq=False)
class SceneData:
    """A rendered scene.

    Attributes:
        names: (I,) image names, ``"{split}/r_{i}"`` (Blender's ``file_path`` without ``./``).
        splits: (I,) split of each image: ``"train"``, ``"val"`` or ``"test"``.
        images: (I,) RGBA uint8 arrays (H, W, 4); straight alpha = pixel coverage.
        camera: the camera shared by every view.
        c2w: (I, 4, 4) float64 camera-to-world poses, OpenCV camera frame, world z up.
        near: (I,) float64 and far: (I,) float64 distances that bracket the scene bounds.
        bounds: (2, 3) float64 axis-aligned box (min, max) that contains the whole scene.
        geometry: the procedural geometry, for re-tracing rays (e.g. COLMAP points3D).
        seed: the seed. size: the size name. render_seconds: wall time of the rendering.
    """

    names: tuple[str, ...]
    splits: tuple[str, ...]
    images: tuple[np.ndarray, ...]
    camera: Camera
    c2w: np.ndarray
    near: np.ndarray
    far: np.ndarray
    bounds: np.ndarray
    geometry: SceneGeometry
    seed: int
    size: str
    render_seconds: float = 0.0

    @property
    def cameras(self) -> tuple[Camera, ...]:
        """(I,) the camera of each image (all the same)."""
        return (self.camera,) * len(self.names)

    def indices(self, split: str) -> list[int]:
        """Indices of the images of ``split`` in order."""
        return [i for i, s in enumerate(self.splits) if s == split]

    def summary(self) -> str:
        counts = ", ".join(f"{len(self.indices(s))} {s}" for s in SPLITS)
        cam = self.camera
        return (
            f"built-in scene '{self.size}' (seed {self.seed}): {len(self.names)} views ({counts}), "
            f"{cam.width}x{cam.height} {cam.model}, rendered in {self.render_seconds:.1f} s"
        )


def scene_camera(width: int, height: int, camera_model: str = "PINHOLE") -> Camera:
    """The scene's camera: PINHOLE (fx = fy, centred) or OPENCV with mild barrel distortion."""
    f = width / 2 / math.tan(FOV_X / 2)
    if camera_model == "PINHOLE":
        params: tuple[float, ...] = (f, f, width / 2, height / 2)
    elif camera_model == "OPENCV":
        cx, cy = width / 2 + 0.004 * width, height / 2 - 0.003 * height
        params = (f, f * 1.003, cx, cy, -0.12, 0.03, 0.0015, -0.001)
    else:
        raise ConfigError(
            f"built-in scene: expected a camera model in {SCENE_CAMERA_MODELS}, got {camera_model!r}"
        )
    return Camera(camera_model, width, height, params, camera_id=1, label="built-in scene")


def look_at_c2w(positions: np.ndarray, target: tuple[float, float, float] = LOOK_AT) -> np.ndarray:
    """(I, 3) camera centres -> (I, 4, 4) OpenCV c2w looking at ``target`` with world z up."""
    forward = np.asarray(target) - positions
    forward /= np.linalg.norm(forward, axis=-1, keepdims=True)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right, axis=-1, keepdims=True)
    down = np.cross(forward, right)  # OpenCV: x right, y down, z forward
    c2w = np.tile(np.eye(4), (len(positions), 1, 1))
    c2w[:, :3, 0], c2w[:, :3, 1], c2w[:, :3, 2], c2w[:, :3, 3] = right, down, forward, positions
    return c2w


def scene_poses(seed: int, split: str, n: int) -> np.ndarray:
    """(n, 4, 4) c2w on the upper hemisphere of radius CAMERA_DISTANCE, one random stream per split."""
    rng = np.random.default_rng([seed, SPLITS.index(split) + 1])
    azimuth = rng.uniform(0, 2 * math.pi, n)
    elevation = np.arcsin(rng.uniform(math.sin(math.radians(10)), math.sin(math.radians(70)), n))
    dirs = np.stack(
        [np.cos(elevation) * np.cos(azimuth), np.cos(elevation) * np.sin(azimuth), np.sin(elevation)], -1
    )
    return look_at_c2w(np.asarray(LOOK_AT) + CAMERA_DISTANCE * dirs)


def _init_worker(luts: dict[tuple[Camera, int], torch.Tensor]) -> None:
    torch.set_num_threads(1)
    _SUBPIXEL_CACHE.update(luts)


def _render_one(args: tuple[SceneGeometry, Camera, np.ndarray, int]) -> np.ndarray:
    return render_view(*args)


def _render_all(
    geometry: SceneGeometry, camera: Camera, c2w: np.ndarray, k: int, workers: int
) -> list[np.ndarray]:
    jobs = [(geometry, camera, pose, k) for pose in c2w]
    if workers <= 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small elementwise ops: threads cost more than they bring
        try:
            return [_render_one(job) for job in jobs]
        finally:
            torch.set_num_threads(threads)
    luts = {(camera, s): subpixel_directions(camera, s) for s in (1, k)}  # computed once, shared
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(luts,)) as pool:
        return list(pool.map(_render_one, jobs))


def render_scene(
    size: str = "tiny",
    seed: int = 0,
    camera_model: str = "PINHOLE",
    *,
    workers: int = 1,
    supersample: int = 3,
    unbounded: bool = False,
) -> SceneData:
    """Render the built-in scene.

    Args:
        size: ``"tiny"`` (48x48, 8/2/2 views, for tests), ``"small"`` (100x100, 60/10/10) or
            ``"realistic"`` (800x800, 100/10/10), see ``SIZES``.
        seed: layout, colours, light and camera positions; same seed -> identical images.
        camera_model: ``"PINHOLE"`` (fx = fy, centred principal point, fits the Blender layout) or
            ``"OPENCV"`` (distorted; images are rendered through the distortion).
        workers: processes rendering views in parallel (each single-threaded); the output does not
            depend on it.
        supersample: ``k`` of the ``k x k`` sub-pixel samples at edges (alpha has ``k*k + 1`` levels).
        unbounded: render the unbounded variant (far background around the same objects, opaque
            views, bounds enclosing the sky dome; see :mod:`raykit.testing.unbounded`).

    Raises:
        ConfigError: unknown size or camera model, ``workers < 1`` or ``supersample < 1``.
    """
    if size not in SIZES:
        raise ConfigError(f"built-in scene: expected a size in {list(SIZES)}, got {size!r}")
    if workers < 1 or supersample < 1:
        raise ConfigError(
            f"built-in scene: expected workers >= 1 and supersample >= 1, got {workers}, {supersample}"
        )
    spec = SIZES[size]
    camera = scene_camera(spec.width, spec.height, camera_model)
    geometry = build_unbounded_geometry(seed) if unbounded else build_geometry(seed)
    names, splits, poses = [], [], []
    for split in SPLITS:
        n = spec.count(split)
        names += [f"{split}/r_{i}" for i in range(n)]
        splits += [split] * n
        poses.append(scene_poses(seed, split, n))
    c2w = np.concatenate(poses)
    start = time.perf_counter()
    images = _render_all(geometry, camera, c2w, supersample, workers)
    elapsed = time.perf_counter() - start
    bounds = np.array(UNBOUNDED_BOUNDS if unbounded else BOUNDS, dtype=np.float64)
    dist = np.linalg.norm(c2w[:, :3, 3] - bounds.mean(0), axis=-1)
    radius = float(np.linalg.norm(bounds[1] - bounds[0]) / 2)
    near, far = np.maximum(dist - radius, 0.05), dist + radius
    return SceneData(
        tuple(names),
        tuple(splits),
        tuple(images),
        camera,
        c2w,
        near,
        far,
        bounds,
        geometry,
        seed,
        size,
        elapsed,
    )
