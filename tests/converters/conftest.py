"""Capture fixtures written by the tests themselves: Blender, instant-ngp, LLFF and COLMAP (pycolmap).

Helpers are exposed through the ``make`` fixture (a namespace of functions) because test modules are
imported with ``--import-mode=importlib`` and cannot import this file by name.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from raykit.conventions import opencv_to_opengl_c2w

LEGO_TINY = Path(__file__).resolve().parents[1] / "data" / "lego_tiny"


def write_image(path: Path, array: np.ndarray, **save: Any) -> Path:
    """Save ``uint8 (H, W, C)`` with Pillow (format from the suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = {3: "RGB", 4: "RGBA"}[array.shape[-1]]
    Image.fromarray(array, mode=mode).save(path, **save)
    return path


def random_image(seed: int, height: int, width: int, channels: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)


def look_at_c2w(seed: int, radius: float = 4.0) -> np.ndarray:
    """(4, 4) OpenCV camera-to-world on a sphere looking at the origin, with a random roll."""
    rng = np.random.default_rng(seed)
    centre = rng.normal(size=3)
    centre *= radius / np.linalg.norm(centre)
    forward = -centre / np.linalg.norm(centre)
    up = rng.normal(size=3)
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, down, forward, centre
    return c2w


def make_blender(
    root: Path, *, counts: dict[str, int] | None = None, size: tuple[int, int] = (8, 6), angle_x: float = 0.8
) -> Path:
    """A nerf_synthetic-layout capture: RGBA PNGs, ``./split/r_i`` paths without extension."""
    counts = counts or {"train": 3, "val": 1, "test": 2}
    width, height = size
    seed = 0
    for split, n in counts.items():
        frames = []
        for i in range(n):
            seed += 1
            write_image(root / split / f"r_{i}.png", random_image(seed, height, width, 4))
            c2w_gl = opencv_to_opengl_c2w(look_at_c2w(seed))
            frames.append(
                {"file_path": f"./{split}/r_{i}", "rotation": 0.1, "transform_matrix": c2w_gl.tolist()}
            )
        text = json.dumps({"camera_angle_x": angle_x, "frames": frames}, indent=4)
        (root / f"transforms_{split}.json").write_text(text)
    return root


def make_ngp(root: Path, frames: list[dict[str, Any]], **meta: Any) -> Path:
    """``transforms.json`` with ``frames`` (each with file_path, transform_matrix and overrides)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "transforms.json").write_text(json.dumps({**meta, "frames": frames}, indent=2))
    return root


def ngp_frame(
    root: Path, index: int, size: tuple[int, int], file_path: str | None = None, **extra: Any
) -> dict:
    """Write image ``images/f_{index}.png`` of ``size`` and return its frame entry."""
    width, height = size
    write_image(root / "images" / f"f_{index}.png", random_image(100 + index, height, width))
    c2w_gl = opencv_to_opengl_c2w(look_at_c2w(100 + index))
    return {"file_path": file_path or f"images/f_{index}.png", "transform_matrix": c2w_gl.tolist(), **extra}


def make_llff(root: Path, n: int = 5, size: tuple[int, int] = (16, 12), focal: float = 14.0) -> Path:
    """``poses_bounds.npy`` + ``images/`` with LLFF's (down, right, back) pose columns."""
    width, height = size
    rows = []
    for i in range(n):
        write_image(root / "images" / f"IMG_{i:04d}.png", random_image(200 + i, height, width))
        c2w_cv = look_at_c2w(200 + i)
        right, down, forward, centre = c2w_cv[:3, 0], c2w_cv[:3, 1], c2w_cv[:3, 2], c2w_cv[:3, 3]
        pose = np.stack([down, right, -forward, centre, [height, width, focal]], axis=1)
        rows.append(np.concatenate([pose.reshape(-1), [1.0 + 0.1 * i, 10.0 + i]]))
    np.save(root / "poses_bounds.npy", np.array(rows))
    return root


COLMAP_MODELS: dict[str, list[float]] = {
    "SIMPLE_PINHOLE": [30.0, 16.0, 12.0],
    "PINHOLE": [30.0, 32.0, 16.5, 11.5],
    "SIMPLE_RADIAL": [30.0, 16.0, 12.0, 0.05],
    "RADIAL": [30.0, 16.0, 12.0, 0.05, -0.02],
    "OPENCV": [30.0, 31.0, 16.0, 12.0, 0.02, -0.01, 0.001, -0.002],
    "FULL_OPENCV": [30.0, 31.0, 16.0, 12.0, 0.02, -0.01, 0.001, -0.002, 0.001, 0.0, 0.0, 0.0],
    "OPENCV_FISHEYE": [30.0, 31.0, 16.0, 12.0, 0.01, 0.02, 0.0, 0.001],
    "SIMPLE_RADIAL_FISHEYE": [30.0, 16.0, 12.0, 0.02],
    "FOV": [30.0, 31.0, 16.0, 12.0, 0.3],
    "RADIAL_FISHEYE": [30.0, 16.0, 12.0, 0.02, -0.01],
    "THIN_PRISM_FISHEYE": [30.0, 31.0, 16.0, 12.0, 0.01, -0.01, 0.001, 0.002, 0.001, 0.0005, 0.001, -0.001],
    "RAD_TAN_THIN_PRISM_FISHEYE": [
        30.0,
        31.0,
        16.0,
        12.0,
        0.01,
        -0.01,
        0.002,
        0.0,
        0.0,
        0.0,
        0.001,
        -0.001,
        0.001,
        0.0,
        -0.001,
        0.0,
    ],
    "SIMPLE_DIVISION": [30.0, 16.0, 12.0, -0.01],
    "DIVISION": [30.0, 31.0, 16.0, 12.0, -0.01],
    "SIMPLE_FISHEYE": [30.0, 16.0, 12.0],
    "FISHEYE": [30.0, 31.0, 16.0, 12.0],
    "EUCM": [30.0, 31.0, 16.0, 12.0, 0.5, 1.0],
}


def make_colmap(
    root: Path, models: list[str], *, seed: int = 0, binary: bool = True, size: tuple[int, int] = (32, 24),
    names: dict[int, str] | None = None,
) -> Any:  # fmt: skip
    """A pycolmap-synthesised reconstruction (one camera per model, 2 frames each) + random images.

    Writes ``root/sparse/0`` and ``root/images/<name>``; returns the pycolmap Reconstruction.
    """
    import pycolmap

    pycolmap.set_random_seed(seed)
    options = pycolmap.SyntheticDatasetOptions(
        num_rigs=1, num_cameras_per_rig=len(models), num_frames_per_rig=2, num_points3D=40,
        camera_width=size[0], camera_height=size[1], camera_params=[30.0, size[0] / 2, size[1] / 2, 0.0],
    )  # fmt: skip
    rec = pycolmap.synthesize_dataset(options)
    for camera_id, model in zip(sorted(rec.cameras), models, strict=True):
        camera = rec.cameras[camera_id]
        camera.model = getattr(pycolmap.CameraModelId, model)
        camera.params = COLMAP_MODELS[model]
    for image_id, name in (names or {}).items():
        rec.images[image_id].name = name
    model_dir = root / "sparse" / "0"
    model_dir.mkdir(parents=True, exist_ok=True)
    rec.write_binary(str(model_dir)) if binary else rec.write_text(str(model_dir))
    for image_id, image in rec.images.items():
        write_image(root / "images" / image.name, random_image(300 + image_id, size[1], size[0]))
    return rec


def pinhole_directions(c2w_cv: np.ndarray, fx: float, fy: float, cx: float, cy: float, pixels: np.ndarray):
    """(N, 2) integer pixels -> (N, 3) unit world directions of a pinhole camera (reference)."""
    xy = pixels + 0.5
    d = np.stack([(xy[:, 0] - cx) / fx, (xy[:, 1] - cy) / fy, np.ones(len(xy))], axis=1)
    d = d @ c2w_cv[:3, :3].T
    return d / np.linalg.norm(d, axis=1, keepdims=True)


def blender_focal(width: int, angle_x: float) -> float:
    return 0.5 * width / math.tan(0.5 * angle_x)


@pytest.fixture
def make() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        write_image=write_image,
        random_image=random_image,
        look_at_c2w=look_at_c2w,
        blender=make_blender,
        ngp=make_ngp,
        ngp_frame=ngp_frame,
        llff=make_llff,
        colmap=make_colmap,
        pinhole_directions=pinhole_directions,
        blender_focal=blender_focal,
        lego_tiny=LEGO_TINY,
        colmap_models=COLMAP_MODELS,
    )
