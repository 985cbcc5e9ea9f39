"""Ray tracing of the built-in scene into RGBA images whose alpha is pixel coverage.

Each pixel is estimated from a ``k x k`` grid of sub-pixel samples at COLMAP image coordinates
``(x + (i + 0.5) / k, y + (j + 0.5) / k)``, unprojected through the camera (so a distorted camera
renders through its distortion). Alpha is the fraction of samples that hit the scene; RGB is the mean
colour of the samples that hit, i.e. *straight* (un-premultiplied) alpha as PNG and Blender's
``nerf_synthetic`` store it: ``alpha * rgb`` is the premultiplied (box-filtered) colour, and
compositing ``alpha * rgb + (1 - alpha) * background`` equals the supersampled render over that
background. Background pixels are ``(0, 0, 0, 0)``.

:func:`render_image` is the fast path: one sample at each pixel centre, then the full ``k x k``
samples only where the 3x3 neighbourhood changes object or colour (edges, texture and shadow
boundaries). :func:`render_image_reference` supersamples every pixel; tests compare the two.
All per-ray work is elementwise in float32, so results do not depend on batching or on the number of
threads or worker processes.
"""

from __future__ import annotations

import numpy as np
import torch

from raykit.cameras import Camera, unproject
from raykit.testing.geometry import SceneGeometry, intersect, normals, occluded
from raykit.testing.textures import albedo

__all__ = [
    "render_image",
    "render_image_reference",
    "shade",
    "subpixel_directions",
    "trace_camera_rays",
]

Tensor = torch.Tensor
_CHUNK = 1 << 17
_EDGE_THRESHOLD = 0.04


def shade(geometry: SceneGeometry, rays_o: Tensor, rays_d: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Shade rays: Lambertian + Blinn-Phong under one directional light with hard shadows.

    Args:
        rays_o: (N, 3) or (1, 3) origins. rays_d: (N, 3) unit directions (float32).

    Returns:
        ``(rgb (N, 3) in [0, 1] (0 on a miss), t (N,) hit distance (inf on a miss), index (N,) int64
        primitive index (-1 on a miss))``.
    """
    t, index = intersect(geometry, rays_o, rays_d)
    rgb = torch.zeros_like(rays_d)
    hit = (index >= 0).nonzero().squeeze(1)
    if hit.numel() == 0:
        return rgb, t, index
    d, idx = rays_d[hit], index[hit]
    points = rays_o.expand_as(rays_d)[hit] + t[hit, None] * d
    n, a = torch.empty_like(points), torch.empty_like(points)
    ks, shin = torch.zeros_like(t[hit]), torch.ones_like(t[hit])
    for k, prim in enumerate(geometry.primitives):
        m = idx == k
        if bool(m.any()):
            n[m], a[m] = normals(prim, points[m], d[m]), albedo(prim, points[m])
            ks[m], shin[m] = prim.specular, prim.shininess
    light = torch.tensor(geometry.light, dtype=points.dtype, device=points.device)
    lit = ~occluded(geometry, points + 1e-3 * n, light[None])
    lambert = (n * light).sum(-1).clamp(min=0) * lit
    half = light - d
    half = half / torch.linalg.vector_norm(half, dim=-1, keepdim=True).clamp(min=1e-12)
    spec = ks * lit * (n * half).sum(-1).clamp(min=0).pow(shin)
    amb = geometry.ambient
    rgb[hit] = (a * (amb + (1 - amb) * lambert[:, None]) + spec[:, None]).clamp(0, 1)
    return rgb, t, index


def trace_camera_rays(
    geometry: SceneGeometry, c2w: np.ndarray, dirs_cam: Tensor, chunk: int = _CHUNK
) -> tuple[Tensor, Tensor, Tensor]:
    """Shade camera-frame directions ``dirs_cam`` (M, 3) from pose ``c2w`` (4, 4) in chunks.

    The rotation to world is written elementwise (no matmul) so that it is bit-identical for any
    chunking and thread count. Returns ``(rgb (M, 3), t (M,), index (M,))`` as :func:`shade`.
    """
    pose = torch.as_tensor(np.asarray(c2w, dtype=np.float32))
    origin, rot = pose[:3, 3], pose[:3, :3]
    outs = []
    for start in range(0, len(dirs_cam), chunk):
        dc = dirs_cam[start : start + chunk]
        dw = dc[:, 0:1] * rot[:, 0] + dc[:, 1:2] * rot[:, 1] + dc[:, 2:3] * rot[:, 2]
        dw = dw / torch.linalg.vector_norm(dw, dim=-1, keepdim=True)
        outs.append(shade(geometry, origin[None], dw))
    return tuple(torch.cat([o[i] for o in outs]) for i in range(3))  # type: ignore[return-value]


_SUBPIXEL_CACHE: dict[tuple[Camera, int], Tensor] = {}


def subpixel_directions(camera: Camera, k: int) -> Tensor:
    """(H, W, k*k, 3) float32 unit camera-frame directions of the ``k x k`` sub-pixel samples.

    Sample ``j * k + i`` of pixel ``(x, y)`` is at image coordinates ``(x + (i + 0.5) / k,
    y + (j + 0.5) / k)``; ``k = 1`` gives the pixel centres. Unprojected with
    :func:`raykit.cameras.unproject` in float64, then rounded. Memoised per ``(camera, k)``.
    """
    key = (camera, k)
    if key not in _SUBPIXEL_CACHE:
        if len(_SUBPIXEL_CACHE) >= 4:
            _SUBPIXEL_CACHE.clear()
        _SUBPIXEL_CACHE[key] = _compute_subpixel_directions(camera, k)
    return _SUBPIXEL_CACHE[key]


def _compute_subpixel_directions(camera: Camera, k: int, rows: int = 32) -> Tensor:
    offsets = (torch.arange(k, dtype=torch.float64) + 0.5) / k
    xs = (torch.arange(camera.width, dtype=torch.float64)[:, None] + offsets).reshape(-1)  # (W*k,)
    out = []
    for y0 in range(0, camera.height, rows):
        ys = (
            torch.arange(y0, min(y0 + rows, camera.height), dtype=torch.float64)[:, None] + offsets
        ).reshape(-1)
        xy = torch.stack(torch.broadcast_tensors(xs[None, :], ys[:, None]), -1)  # (n*k, W*k, 2)
        d = unproject(camera, xy).to(torch.float32)  # [y, j, x, i] -> [y, x, j, i]
        out.append(
            d.reshape(-1, k, camera.width, k, 3).permute(0, 2, 1, 3, 4).reshape(-1, camera.width, k * k, 3)
        )
    return torch.cat(out)


def _to_rgba8(rgb: Tensor, alpha: Tensor) -> np.ndarray:
    rgba = torch.cat([rgb, alpha[..., None]], -1)
    return torch.round(rgba.clamp(0, 1) * 255).to(torch.uint8).numpy()


def _supersample(geometry: SceneGeometry, c2w: np.ndarray, dirs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """dirs: (P, k*k, 3) -> (rgb (P, 3) straight alpha, alpha (P,)); sums unrolled for determinism."""
    rgb, _, index = trace_camera_rays(geometry, c2w, dirs.reshape(-1, 3))
    rgb = rgb.reshape(-1, k * k, 3)
    cover = (index >= 0).to(rgb.dtype).reshape(-1, k * k)
    hits, premult = torch.zeros_like(cover[:, 0]), torch.zeros_like(rgb[:, 0])
    for s in range(k * k):
        hits = hits + cover[:, s]
        premult = premult + rgb[:, s] * cover[:, s, None]
    return premult / hits.clamp(min=1)[:, None], hits / (k * k)


def render_image_reference(
    geometry: SceneGeometry, camera: Camera, c2w: np.ndarray, k: int = 3
) -> np.ndarray:
    """(H, W, 4) uint8 RGBA with every pixel supersampled ``k x k`` (the simple twin of render_image)."""
    dirs = subpixel_directions(camera, k)
    rgb, alpha = _supersample(geometry, c2w, dirs.reshape(-1, k * k, 3), k)
    return _to_rgba8(rgb.reshape(camera.height, camera.width, 3), alpha.reshape(camera.height, camera.width))


def _needs_supersampling(index: Tensor, rgb: Tensor) -> Tensor:
    """(H, W) object index and (H, W, 3) colour at pixel centres -> (H, W) bool: any 3x3 neighbour
    differs in object or by more than the threshold in colour (image borders replicate)."""
    h, w = index.shape
    pad_i = torch.nn.functional.pad(index[None, None].double(), (1, 1, 1, 1), mode="replicate")[0, 0]
    pad_c = torch.nn.functional.pad(rgb.permute(2, 0, 1)[None], (1, 1, 1, 1), mode="replicate")[0]
    mark = torch.zeros(h, w, dtype=torch.bool)
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            other_i = pad_i[dy : dy + h, dx : dx + w]
            other_c = pad_c[:, dy : dy + h, dx : dx + w].permute(1, 2, 0)
            mark |= (other_i != index.double()) | ((other_c - rgb).abs().amax(-1) > _EDGE_THRESHOLD)
    return mark


def render_image(geometry: SceneGeometry, camera: Camera, c2w: np.ndarray, k: int = 3) -> np.ndarray:
    """Render one view: (H, W, 4) uint8 RGBA, straight alpha = coverage (see the module docstring).

    Args:
        camera: the camera (any model; rays go through its distortion).
        c2w: (4, 4) camera-to-world pose, OpenCV camera frame.
        k: sub-pixel samples per axis at edges.
    """
    h, w = camera.height, camera.width
    rgb0, _, index0 = trace_camera_rays(geometry, c2w, subpixel_directions(camera, 1).reshape(-1, 3))
    rgb0, index0 = rgb0.reshape(h, w, 3), index0.reshape(h, w)
    alpha0 = (index0 >= 0).to(rgb0.dtype)
    ys, xs = _needs_supersampling(index0, rgb0).nonzero(as_tuple=True)
    if len(ys):
        rgb_s, alpha_s = _supersample(geometry, c2w, subpixel_directions(camera, k)[ys, xs], k)
        rgb0[ys, xs], alpha0[ys, xs] = rgb_s, alpha_s
    return _to_rgba8(rgb0, alpha0)
