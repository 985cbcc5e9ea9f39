"""Write the built-in scene as a Blender ``nerf_synthetic`` folder or as a COLMAP capture.

Both writers are deterministic: PNGs are encoded with fixed settings and no metadata (no timestamps),
JSON and COLMAP files are written in a fixed order, so the same scene gives byte-identical files.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from raykit.cameras import Camera, pixels_to_rays, project
from raykit.colmap_io import (
    ColmapCamera,
    ColmapFrame,
    ColmapImage,
    ColmapPoint3D,
    ColmapRig,
    Reconstruction,
    write_model,
)
from raykit.conventions import colmap_from_c2w, opencv_to_opengl_c2w
from raykit.errors import ConfigError
from raykit.fileio import atomic_write_bytes
from raykit.testing.builtin import SPLITS, SceneData
from raykit.testing.geometry import intersect
from raykit.testing.render import shade

__all__ = [
    "BLENDER_ROTATION",
    "encode_png",
    "encode_png_gray",
    "scene_depth",
    "scene_mask",
    "scene_reconstruction",
    "surface_points",
    "write_blender",
    "write_colmap",
    "write_nerfstudio",
]

# The constant per-frame "rotation" that Blender's nerf_synthetic export script writes (2 pi / 500).
BLENDER_ROTATION = 0.012566370614359171
_N_POINTS = {"tiny": 200, "small": 1000, "realistic": 4000}


def encode_png(image: np.ndarray) -> bytes:
    """(H, W, 3|4) uint8 -> PNG bytes with fixed settings and no metadata chunks."""
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG", compress_level=6, optimize=False)
    return buf.getvalue()


def _over_black(image: np.ndarray) -> np.ndarray:
    """(H, W, 4) straight-alpha uint8 -> (H, W, 3) uint8 composited over black."""
    return np.round(image[..., :3] * (image[..., 3:] / 255.0)).astype(np.uint8)


def _check_blender_camera(camera: Camera) -> float:
    fx, fy, cx, cy = camera.params[:4] if camera.model == "PINHOLE" else (0.0, 1.0, 0.0, 0.0)
    if camera.model != "PINHOLE" or fx != fy or (cx, cy) != (camera.width / 2, camera.height / 2):
        raise ConfigError(
            f"Blender layout: expected a PINHOLE camera with fx == fy and a centred principal "
            f"point, got {camera.model} {camera.params}"
        )
    return 2 * math.atan(camera.width / (2 * fx))


def write_blender(scene: SceneData, root: str | Path) -> Path:
    """Write ``root/{train,val,test}/r_{i}.png`` (RGBA) and ``root/transforms_{split}.json``.

    The JSON is laid out as the original dataset's: ``{"camera_angle_x": ..., "frames": [{"file_path":
    "./train/r_0", "rotation": ..., "transform_matrix": OpenGL c2w 4x4}]}``, 4-space indent.

    Raises:
        ConfigError: the scene's camera is not a centred PINHOLE with fx == fy.
    """
    root = Path(root)
    angle_x = _check_blender_camera(scene.camera)
    gl = opencv_to_opengl_c2w(scene.c2w)
    for split in SPLITS:
        frames = []
        for i in scene.indices(split):
            atomic_write_bytes(root / f"{scene.names[i]}.png", encode_png(scene.images[i]))
            frames.append(
                {
                    "file_path": f"./{scene.names[i]}",
                    "rotation": BLENDER_ROTATION,
                    "transform_matrix": gl[i].tolist(),
                }
            )
        text = json.dumps({"camera_angle_x": angle_x, "frames": frames}, indent=4)
        atomic_write_bytes(root / f"transforms_{split}.json", text.encode())
    return root


def scene_depth(scene: SceneData, index: int) -> np.ndarray:
    """(H, W) float32 z-depth (scene units: metres) of view ``index`` at its pixel centres: the
    distance along the camera's optical axis to the first surface hit, 0 where the ray misses."""
    camera, w, h = scene.camera, scene.camera.width, scene.camera.height
    pixels = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")[::-1], -1)
    c2w = torch.as_tensor(scene.c2w[index], dtype=torch.float32)
    origins, dirs, z_scale = pixels_to_rays(camera, c2w, pixels.reshape(-1, 2))
    t, hit = intersect(scene.geometry, origins[:1], dirs)
    depth = torch.where(hit >= 0, t * z_scale, torch.zeros_like(t))
    return depth.reshape(h, w).numpy().astype(np.float32)


def scene_mask(scene: SceneData, index: int) -> np.ndarray:
    """(H, W) uint8 mask of view ``index``: 255 where the view's alpha is at least 128, else 0."""
    return np.where(scene.images[index][..., 3] >= 128, 255, 0).astype(np.uint8)


def write_nerfstudio(
    scene: SceneData,
    root: str | Path,
    *,
    masks: bool = True,
    depth: bool = True,
    depth_format: str = "png",
    depth_unit_scale_factor: float = 1e-3,
    metadata: bool = True,
) -> Path:
    """Write the scene as a nerfstudio capture with masks and depth maps (the form Polycam and Record3D
    exports take): ``root/transforms.json``, ``images/{name}.png`` (RGB, composited over black),
    ``masks/{name}.png`` (8-bit L, :func:`scene_mask`) named by each frame's ``mask_path``, and depth
    maps named by ``depth_file_path``: ``depth/{name}.png`` (16-bit, ``round(depth /
    depth_unit_scale_factor)``, so millimetres with the default 1e-3) or ``depth/{name}.npy`` (float32
    metres divided by the factor) with ``depth_format="npy"``; the top-level
    ``depth_unit_scale_factor`` says the factor (nerfstudio's default, 1e-3, when it is 1e-3).
    ``metadata``: each frame also has keys raykit does not interpret (``"exposure_time"``,
    ``"timestamp"``, ``"sensor": {"id": ...}``), which a conversion keeps as per-frame metadata.
    Frames are listed in the scene's order; names are ``{split}_r_{i}`` (no folders).
    """
    root = Path(root)
    if depth_format not in ("png", "npy"):
        raise ConfigError(f"nerfstudio writer: expected depth_format 'png' or 'npy', got {depth_format!r}")
    cam = scene.camera
    fx, fy, cx, cy = cam.params[:4]
    meta: dict[str, object] = {"camera_model": "OPENCV", "fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy}
    meta.update(w=cam.width, h=cam.height)
    if cam.model == "OPENCV":
        meta.update(k1=cam.params[4], k2=cam.params[5], p1=cam.params[6], p2=cam.params[7])
    if depth:
        meta["depth_unit_scale_factor"] = depth_unit_scale_factor
    gl = opencv_to_opengl_c2w(scene.c2w)
    frames = []
    for i, full in enumerate(scene.names):
        name = full.replace("/", "_")
        frame: dict[str, object] = {"file_path": f"images/{name}.png", "transform_matrix": gl[i].tolist()}
        atomic_write_bytes(root / "images" / f"{name}.png", encode_png(_over_black(scene.images[i])))
        if masks:
            frame["mask_path"] = f"masks/{name}.png"
            atomic_write_bytes(root / "masks" / f"{name}.png", encode_png_gray(scene_mask(scene, i)))
        if depth:
            values = scene_depth(scene, i) / depth_unit_scale_factor
            if depth_format == "png":
                frame["depth_file_path"] = f"depth/{name}.png"
                raw = np.clip(np.round(values), 0, 65535).astype(np.uint16)
                atomic_write_bytes(root / "depth" / f"{name}.png", encode_png_gray(raw))
            else:
                frame["depth_file_path"] = f"depth/{name}.npy"
                buffer = io.BytesIO()
                np.save(buffer, values.astype(np.float32), allow_pickle=False)
                atomic_write_bytes(root / "depth" / f"{name}.npy", buffer.getvalue())
        if metadata:
            frame.update(exposure_time=1 / (100 + i), timestamp=1.5 * i, sensor={"id": i % 2})
        frames.append(frame)
    text = json.dumps({**meta, "frames": frames}, indent=2)
    atomic_write_bytes(root / "transforms.json", text.encode())
    return root


def encode_png_gray(values: np.ndarray) -> bytes:
    """(H, W) uint8 or uint16 -> a single-channel PNG (8-bit L or 16-bit I;16), fixed settings."""
    buf = io.BytesIO()
    if values.dtype == np.uint16:
        image = Image.fromarray(np.ascontiguousarray(values, dtype="<u2"))  # mode I;16
    else:
        image = Image.fromarray(np.ascontiguousarray(values, dtype=np.uint8))  # mode L
    image.save(buf, format="PNG", compress_level=6, optimize=False)
    return buf.getvalue()


def surface_points(scene: SceneData, n_points: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Visible surface points: rays through random pixels of random training views.

    Returns:
        ``(xyz (P, 3) float64, rgb (P, 3) uint8)``; P <= n_points (rays that miss are dropped); the
        colour is the shaded colour seen along the sampling ray.
    """
    rng = np.random.default_rng([scene.seed, seed, 7])
    w, h = scene.camera.width, scene.camera.height
    m = 4 * n_points  # about half of the rays miss; keep the first n_points distinct hits
    samples = np.stack(
        [rng.choice(scene.indices("train"), m), rng.integers(0, w, m), rng.integers(0, h, m)], -1
    )
    _, first = np.unique(samples, axis=0, return_index=True)
    samples = samples[np.sort(first)]  # distinct (view, x, y), in drawing order
    xyz, rgb = np.zeros((len(samples), 3)), np.zeros((len(samples), 3), dtype=np.uint8)
    hit = np.zeros(len(samples), dtype=bool)
    for view in np.unique(samples[:, 0]).tolist():
        rows = np.nonzero(samples[:, 0] == view)[0]
        c2w = torch.as_tensor(scene.c2w[view], dtype=torch.float32)
        origins, dirs, _ = pixels_to_rays(scene.camera, c2w, torch.as_tensor(samples[rows, 1:]))
        color, t, index = shade(scene.geometry, origins[:1], dirs)
        hit[rows] = (index >= 0).numpy()
        xyz[rows] = (origins[:1] + t[:, None] * dirs).double().numpy()
        rgb[rows] = torch.round(color * 255).to(torch.uint8).numpy()
    return xyz[hit][:n_points], rgb[hit][:n_points]


def _observations(scene: SceneData, view: int, xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Points of ``xyz`` (P, 3) seen unoccluded in ``view``: (indices (Q,), image coordinates (Q, 2))."""
    c2w = scene.c2w[view]
    cam_pts = (xyz - c2w[:3, 3]) @ c2w[:3, :3]
    xy = project(scene.camera, torch.as_tensor(cam_pts)).numpy()
    w, h = scene.camera.width, scene.camera.height
    inside = (cam_pts[:, 2] > 0) & np.isfinite(xy).all(-1)
    inside &= (xy[:, 0] >= 0) & (xy[:, 0] < w) & (xy[:, 1] >= 0) & (xy[:, 1] < h)
    idx = np.nonzero(inside)[0]
    offset = xyz[idx] - c2w[:3, 3]
    dist = np.linalg.norm(offset, axis=-1)
    dirs = torch.as_tensor(offset / dist[:, None], dtype=torch.float32)
    t, _ = intersect(scene.geometry, torch.as_tensor(c2w[None, :3, 3], dtype=torch.float32), dirs)
    visible = np.abs(t.double().numpy() - dist) < 1e-4 * dist  # float32 rounding, not an occluder
    return idx[visible], xy[idx[visible]]


def scene_reconstruction(
    scene: SceneData, n_points: int | None = None, image_ext: str = ".png"
) -> Reconstruction:
    """The scene as a COLMAP model.

    One camera (id 1), images 1..I named ``{name}{image_ext}``, surface points with their visibility
    tracks in every view, and a trivial rig and frame per image (as COLMAP 3.12+ writes).
    """
    n = _N_POINTS.get(scene.size, 1000) if n_points is None else n_points
    xyz, rgb = surface_points(scene, n)
    qvecs, tvecs = colmap_from_c2w(scene.c2w)
    tracks: list[list[tuple[int, int]]] = [[] for _ in range(len(xyz))]
    images, frames = {}, {}
    for view in range(len(scene.names)):
        image_id = view + 1
        idx, xy = _observations(scene, view, xyz)
        for k, p in enumerate(idx.tolist()):
            tracks[p].append((image_id, k))
        q, t = tuple(qvecs[view].tolist()), tuple(tvecs[view].tolist())
        images[image_id] = ColmapImage(
            image_id, q, t, 1, scene.names[view] + image_ext, xy, idx.astype(np.int64) + 1
        )
        frames[image_id] = ColmapFrame(image_id, 1, q, t, (("CAMERA", 1, image_id),))
    points = {
        p + 1: ColmapPoint3D(
            p + 1,
            tuple(xyz[p].tolist()),
            tuple(rgb[p].tolist()),
            0.0,
            np.array(tracks[p], dtype=np.int64).reshape(-1, 2),
        )
        for p in range(len(xyz))
    }
    cameras = {1: ColmapCamera.from_camera(scene.camera, camera_id=1)}
    return Reconstruction(cameras, images, points, {1: ColmapRig(1, ("CAMERA", 1))}, frames)


def write_colmap(
    scene: SceneData, root: str | Path, binary: bool = True, alpha: bool = True, n_points: int | None = None
) -> Path:
    """Write ``root/images/{name}.png`` and the sparse model ``root/sparse/0/`` (binary or text).

    Args:
        binary: ``.bin`` files (else ``.txt``).
        alpha: RGBA images (alpha = coverage); False writes RGB with a black background.
        n_points: number of surface points sampled for ``points3D`` (default by size).

    Images of every split are included (names keep the split as a subfolder, e.g.
    ``images/train/r_0.png``). Returns ``root``.
    """
    root = Path(root)
    for name, image in zip(scene.names, scene.images, strict=True):
        atomic_write_bytes(
            root / "images" / f"{name}.png", encode_png(image if alpha else _over_black(image))
        )
    write_model(scene_reconstruction(scene, n_points), root / "sparse" / "0", binary=binary)
    return root
