"""Captures for the integration tests, each with its raykit store: the Blender ``lego_tiny``, the
built-in scene as a COLMAP project with OPENCV distortion, and nerfstudio's ``nerfstudio-data`` form."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.converters import convert
from raykit.store.write import copy_store
from raykit.testing import render_scene, write_colmap

ROOT = Path(__file__).resolve().parents[2]
LEGO = ROOT / "tests" / "data" / "lego_tiny"


@pytest.fixture(scope="session")
def lego(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``{"capture": Path, "rays": Zarr store, "images": images-layout store, "wds": WebDataset copy}``."""
    out = tmp_path_factory.mktemp("lego")
    convert(LEGO, out / "rays.zarr")
    convert(LEGO, out / "images.zarr", layout="images")
    copy_store(out / "rays.zarr", out / "wds", backend="wds")
    return {"capture": LEGO, "rays": out / "rays.zarr", "images": out / "images.zarr", "wds": out / "wds"}


@pytest.fixture(scope="session")
def colmap(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The built-in tiny scene with an OPENCV (distorted) camera as a COLMAP project, and its store."""
    root = tmp_path_factory.mktemp("colmap")
    write_colmap(render_scene("tiny", camera_model="OPENCV"), root / "capture", alpha=False)
    convert(root / "capture", root / "scene.zarr")
    return {"capture": root / "capture", "store": root / "scene.zarr"}


@pytest.fixture(scope="session")
def ns_data(colmap: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The COLMAP capture as nerfstudio-data ``transforms.json`` (OPENCV intrinsics, OpenGL poses)."""
    from raykit.colmap_io import read_model
    from raykit.conventions import c2w_from_colmap, opencv_to_opengl_c2w

    capture = colmap["capture"]
    model = read_model(capture / "sparse" / "0")
    camera = next(iter(model.cameras.values()))
    fx, fy, cx, cy, k1, k2, p1, p2 = camera.params
    frames = [
        {
            "file_path": f"images/{image.name}",
            "transform_matrix": opencv_to_opengl_c2w(c2w_from_colmap(image.qvec, image.tvec)).tolist(),
        }
        for image in sorted(model.images.values(), key=lambda im: im.name)
    ]
    meta = {
        "camera_model": "OPENCV", "w": camera.width, "h": camera.height, "fl_x": fx, "fl_y": fy,
        "cx": cx, "cy": cy, "k1": k1, "k2": k2, "p1": p1, "p2": p2, "frames": frames,
    }  # fmt: skip
    (capture / "transforms.json").write_text(json.dumps(meta))
    out = tmp_path_factory.mktemp("nsdata")
    convert(capture / "transforms.json", out / "scene.zarr")
    return {"capture": capture, "store": out / "scene.zarr"}


def similarity(transform: Any, scale: float) -> np.ndarray:
    """nerfstudio's ``dataparser_transform`` (3, 4) and ``dataparser_scale`` as one (4, 4) matrix."""
    matrix = np.eye(4)
    matrix[:3] = np.asarray(transform, dtype=np.float64)
    matrix[:3] *= scale
    return matrix
