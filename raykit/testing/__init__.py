"""The built-in procedural scene that raykit renders itself (see :func:`render_scene`).

Deterministic from a seed: textured spheres, boxes, a cylinder and a checkered ground disc under one
directional light with shadows, viewed from a hemisphere of cameras. Writers produce a Blender
``nerf_synthetic`` folder, a COLMAP capture (optionally through a distorted OPENCV camera) or a
nerfstudio capture with masks and depth maps (``write_nerfstudio``). A small dynamic variant (one
sphere moving, fixed cameras) is written as a D-NeRF capture (``render_dynamic``, ``write_dnerf``) or
a Neural 3D Video capture (``write_n3dv``).
"""

from raykit.testing.builtin import SIZES, SceneData, render_scene, scene_camera
from raykit.testing.dynamic import DynamicScene, render_dynamic, write_dnerf, write_n3dv
from raykit.testing.writers import (
    scene_depth,
    scene_mask,
    scene_reconstruction,
    write_blender,
    write_colmap,
    write_nerfstudio,
)

__all__ = [
    "SIZES",
    "DynamicScene",
    "SceneData",
    "render_dynamic",
    "render_scene",
    "scene_camera",
    "scene_depth",
    "scene_mask",
    "scene_reconstruction",
    "write_blender",
    "write_colmap",
    "write_dnerf",
    "write_n3dv",
    "write_nerfstudio",
]
