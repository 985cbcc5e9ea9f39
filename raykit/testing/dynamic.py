"""The built-in dynamic scene: the built-in objects with one sphere moving along x (or more objects,
each along its own direction: ``moving``), seen from fixed cameras at evenly spaced times, written as
a D-NeRF capture (:func:`write_dnerf`) or, every camera sharing one camera (``own_intrinsics=-1``), as
a Neural 3D Video capture (:func:`write_n3dv`).

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

__all__ = [
    "MOVERS",
    "N3DV_BOUNDS",
    "DynamicScene",
    "moving_geometry",
    "render_dynamic",
    "rgb_over_white",
    "write_dnerf",
    "write_n3dv",
    "write_video",
]

TRAVEL = 0.6  # how far the sphere moves along x between time 0 and time 1
N3DV_BOUNDS = (CAMERA_DISTANCE - 2.5, CAMERA_DISTANCE + 2.5)  # near, far of every camera in write_n3dv


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


MOVERS = ((1,), (2,), (4,), (5,), (3, 6), (7,))
"""The primitives that move, in order (``moving`` takes the first groups): the large sphere, the
small sphere, the tall box, the cylinder, the red box with the sphere resting on it, the last sphere."""


def moving_geometry(geometry: SceneGeometry, time: float, moving: int = 1) -> SceneGeometry:
    """``geometry`` with the first ``moving`` groups of :data:`MOVERS` moved by ``TRAVEL * (time -
    0.5)`` on the ground plane, group ``k`` along the direction ``2.4 k`` radians from x (the first,
    the large sphere, along x)."""
    prims = list(geometry.primitives)
    shift = TRAVEL * (time - 0.5)
    for k, group in enumerate(MOVERS[:moving]):
        dx, dy = (shift, 0.0) if k == 0 else (shift * math.cos(2.4 * k), shift * math.sin(2.4 * k))
        for i in group:
            x, y, z = prims[i].center
            prims[i] = replace(prims[i], center=(x + dx, y + dy, z))
    return replace(geometry, primitives=tuple(prims))


def _own_camera(size: int) -> Camera:
    """Camera 1's intrinsics: wider, not square pixels, off-centre principal point."""
    f = size / 2 / math.tan(FOV_X / 2)
    return Camera(
        "PINHOLE", size + 8, size, (1.1 * f, 1.05 * f, size / 2 + 5.5, size / 2 - 1.25), camera_id=2
    )


def render_dynamic(
    seed: int = 0,
    n_cameras: int = 4,
    n_times: int = 6,
    size: int = 32,
    own_intrinsics: int = 1,
    moving: int = 1,
) -> DynamicScene:
    """Render every camera at every time (``n_cameras >= 2``, ``n_times >= 2``; 32x32 images);
    ``own_intrinsics = -1``: every camera shares the scene camera (a video rig's capture);
    ``moving``: how many groups of objects move (:func:`moving_geometry`, 1 to 6)."""
    if not 1 <= moving <= len(MOVERS):
        raise ValueError(f"moving must be 1 to {len(MOVERS)}, not {moving}")
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
            moved = moving_geometry(geometry, time, moving)
            for c in range(n_cameras):
                split = "train" if c < n_cameras - 1 else ("val" if j % 2 == 0 else "test")
                camera = own if c == own_intrinsics else shared
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
        frames.astype(np.int64), tuple(cameras), poses[cams], tuple(images), own_intrinsics,
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


def rgb_over_white(rgba: np.ndarray) -> np.ndarray:
    """(H, W, 4) straight-alpha uint8 -> (H, W, 3) uint8 over a white background (a video's frame)."""
    alpha = rgba[..., 3:].astype(np.float64) / 255
    return np.round(rgba[..., :3] * alpha + 255 * (1 - alpha)).astype(np.uint8)


def write_video(path: Path, frames: list[np.ndarray], crf: int = 0) -> None:
    """(H, W, 3) uint8 frames -> an mp4 at 30 fps through PyAV: ``libx264rgb`` at ``crf`` (0:
    lossless) where FFmpeg has it, else MPEG-4 (4:2:0) at 20 Mbit/s."""
    import av

    with av.open(str(path), "w") as container:
        try:
            stream = container.add_stream("libx264rgb", rate=30, options={"crf": str(crf)})
            stream.pix_fmt = "rgb24"
        except (av.FFmpegError, ValueError):
            stream = container.add_stream("mpeg4", rate=30)
            stream.pix_fmt, stream.bit_rate = "yuv420p", 20_000_000
        stream.height, stream.width = frames[0].shape[:2]
        for pixels in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())


def write_n3dv(scene: DynamicScene, root: str | Path, *, crf: int = 0) -> Path:
    """Write the scene as a Neural 3D Video capture: ``root/camNN.mp4`` (camera ``NN``'s frames in
    time order, over white, H.264 through PyAV: ``libx264rgb`` at ``crf`` (0: lossless) where FFmpeg has
    it, else MPEG-4 at a high bit rate) and ``root/poses_bounds.npy`` (LLFF's rows, near and far
    :data:`N3DV_BOUNDS`). Every camera must share one camera (``render_dynamic(own_intrinsics=-1)``)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    cams = sorted(set(scene.camera_index.tolist()))
    rows = []
    for c in cams:
        views = sorted((int(scene.frame_index[i]), i) for i in np.flatnonzero(scene.camera_index == c))
        cam = scene.cameras[views[0][1]]
        fx, fy, cx, cy = cam.params
        if fx != fy or (cx, cy) != (cam.width / 2, cam.height / 2):
            raise ValueError(f"camera {c}: an LLFF camera is a centred pinhole with fx = fy")
        gl = opencv_to_opengl_c2w(scene.c2w[views[0][1]])
        pose = np.stack([-gl[:3, 1], gl[:3, 0], gl[:3, 2], gl[:3, 3], [cam.height, cam.width, fx]], 1)
        rows.append(np.concatenate([pose.reshape(-1), N3DV_BOUNDS]))
        write_video(root / f"cam{c:02d}.mp4", [rgb_over_white(scene.images[i]) for _, i in views], crf)
    np.save(root / "poses_bounds.npy", np.stack(rows))
    return root
