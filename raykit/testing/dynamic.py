"""The built-in dynamic scene: the built-in objects with one sphere moving along x, seen from fixed
cameras at evenly spaced times, written as a D-NeRF capture (:func:`write_dnerf`).

Cameras stand on a ring (elevation 30 degrees, ``CAMERA_DISTANCE`` from the centre) and look at the
scene centre. Every camera but one is a centred pinhole with the Blender layout's ``camera_angle_x``;
camera 1 has its own focal lengths, principal point and image size, written on its frames as
``fl_x``, ``fl_y``, ``cx``, ``cy``, ``w``, ``h`` (what D-NeRF's loaders ignore and raykit honours).
Times are ``j / (n_times - 1)``. The last camera is held out: its even frames are ``val``, its odd
frames ``test``; the other cameras are ``train``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from raykit.cameras import Camera
from raykit.conventions import opencv_to_opengl_c2w
from raykit.fileio import atomic_write_bytes
from raykit.testing.builtin import CAMERA_DISTANCE, FOV_X, LOOK_AT, look_at_c2w, scene_camera
from raykit.testing.geometry import SceneGeometry, build_geometry
from raykit.testing.unbounded import render_view
from raykit.testing.writers import encode_png

__all__ = ["DynamicScene", "moving_geometry", "render_dynamic", "write_dnerf"]

TRAVEL = 0.6  # how far the sphere moves along x between time 0 and time 1


@dataclass(frozen=True, eq=False)
class DynamicScene:
    """A rendered dynamic scene, one row per view (I = cameras x times).

    Attributes:
        names: (I,) ``"{split}/c{camera}_t{frame}"`` (D-NeRF's ``file_path`` without ``./``).
        splits: (I,) ``"train"``, ``"val"`` or ``"test"``.
        times: (I,) float64 in [0, 1]. camera_index, frame_index: (I,) int64 camera and time step.
        cameras: (I,) each view's camera. c2w: (I, 4, 4) float64 OpenCV camera-to-world.
        images: (I,) RGBA uint8 (H, W, 4), straight alpha.
        own_intrinsics: the camera whose frames carry their own intrinsics.
    """

    names: tuple[str, ...]
    splits: tuple[str, ...]
    times: np.ndarray
    camera_index: np.ndarray
    frame_index: np.ndarray
    cameras: tuple[Camera, ...]
    c2w: np.ndarray
    images: tuple[np.ndarray, ...]
    own_intrinsics: int = 1


def moving_geometry(geometry: SceneGeometry, time: float) -> SceneGeometry:
    """``geometry`` with its first sphere moved by ``TRAVEL * (time - 0.5)`` along x."""
    prims = list(geometry.primitives)
    i = next(k for k, p in enumerate(prims) if p.kind == "sphere")
    x, y, z = prims[i].center
    prims[i] = replace(prims[i], center=(x + TRAVEL * (time - 0.5), y, z))
    return replace(geometry, primitives=tuple(prims))


def _own_camera(size: int) -> Camera:
    """Camera 1's intrinsics: wider, not square pixels, off-centre principal point."""
    f = size / 2 / math.tan(FOV_X / 2)
    return Camera(
        "PINHOLE", size + 8, size, (1.1 * f, 1.05 * f, size / 2 + 5.5, size / 2 - 1.25), camera_id=2
    )


def render_dynamic(seed: int = 0, n_cameras: int = 4, n_times: int = 6, size: int = 32) -> DynamicScene:
    """Render every camera at every time (``n_cameras >= 2``, ``n_times >= 2``; 32x32 images)."""
    geometry = build_geometry(seed)
    azimuth = np.linspace(0, 2 * math.pi, n_cameras, endpoint=False) + 0.3
    elevation = math.radians(30)
    dirs = np.stack(
        [
            np.cos(elevation) * np.cos(azimuth),
            np.cos(elevation) * np.sin(azimuth),
            np.full(n_cameras, math.sin(elevation)),
        ],
        -1,
    )
    poses = look_at_c2w(np.asarray(LOOK_AT) + CAMERA_DISTANCE * dirs)
    shared, own = scene_camera(size, size), _own_camera(size)
    names, splits, rows, cameras, images = [], [], [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small elementwise ops: threads cost more than they bring
    try:
        for j in range(n_times):
            time = j / (n_times - 1)
            moved = moving_geometry(geometry, time)
            for c in range(n_cameras):
                split = "train" if c < n_cameras - 1 else ("val" if j % 2 == 0 else "test")
                camera = own if c == 1 else shared
                names.append(f"{split}/c{c}_t{j}")
                splits.append(split)
                rows.append((time, c, j))
                cameras.append(camera)
                images.append(render_view(moved, camera, poses[c], 1))
    finally:
        torch.set_num_threads(threads)
    times, cams, frames = (np.array(v) for v in zip(*rows, strict=True))
    return DynamicScene(
        tuple(names), tuple(splits), times.astype(np.float64), cams.astype(np.int64),
        frames.astype(np.int64), tuple(cameras), poses[cams], tuple(images),
    )  # fmt: skip


def write_dnerf(scene: DynamicScene, root: str | Path) -> Path:
    """Write ``root/{split}/c{c}_t{j}.png`` and ``root/transforms_{split}.json`` (D-NeRF's layout:
    ``camera_angle_x`` at the top; per frame ``file_path``, ``time``, ``transform_matrix`` (OpenGL)
    and, on camera 1's frames, ``fl_x``, ``fl_y``, ``cx``, ``cy``, ``w``, ``h``)."""
    root = Path(root)
    gl = opencv_to_opengl_c2w(scene.c2w)
    angle_x = FOV_X
    for split in ("train", "val", "test"):
        frames = []
        for i in (k for k, s in enumerate(scene.splits) if s == split):
            atomic_write_bytes(root / f"{scene.names[i]}.png", encode_png(scene.images[i]))
            frame = {"file_path": f"./{scene.names[i]}", "time": float(scene.times[i])}
            frame["transform_matrix"] = gl[i].tolist()
            if scene.camera_index[i] == scene.own_intrinsics:
                cam = scene.cameras[i]
                fx, fy, cx, cy = cam.params
                frame.update(fl_x=fx, fl_y=fy, cx=cx, cy=cy, w=cam.width, h=cam.height)
            frames.append(frame)
        text = json.dumps({"camera_angle_x": angle_x, "frames": frames}, indent=4)
        atomic_write_bytes(root / f"transforms_{split}.json", text.encode())
    return root
