"""Which space the field lives in (box, contracted, NDC), chosen from the store, and rays framed for it.

Three scene spaces (``TrainConfig.scene_space``; ``auto`` picks one from the store, see
:func:`detect_space`, and the run records the choice in ``config.json`` and why in ``run.json``):

- ``box``: the field covers the scene box (``--aabb`` or the store's bounds); rays are clipped to it and
  sampled uniformly in distance. Object-centric captures (Blender, the built-in scene).
- ``contract``: unbounded 360-degree captures. The unit ball is the ball around the cameras' focus point
  through the farthest camera (or ``--aabb``'s centre and half its largest side); outside it space is
  contracted (:func:`raykit.trainer.contraction.contract`), so the field covers everything, and
  samples are spread uniformly in :func:`~raykit.trainer.contraction.spacing` (linear near the
  cameras, linear in disparity beyond).
- ``ndc``: forward-facing (LLFF) captures. Rays move into the NDC space of the average camera, where
  the field covers a fixed box and ``t'`` in [0, 1) runs from the near plane to infinity.

:class:`RayFrame` carries a batch of rays in the space where positions are ``origin + t * direction``
(world, or NDC) with the sampling interval ``[s0, s1]`` in the sampling coordinate ``s`` and the map
``s -> t`` (the identity except when contracted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raykit.errors import ConfigError
from raykit.store import RayStore
from raykit.trainer.compositing import render_weight_from_density
from raykit.trainer.config import TrainConfig
from raykit.trainer.contraction import focus_point, ndc_rays, spacing, spacing_inverse
from raykit.trainer.runtime import scene_aabb
from raykit.trainer.samplers import Samples, early_stopped, ray_aabb_intersect, sample_pdf, stratified_samples

__all__ = [
    "FORWARD_FACING_DEGREES",
    "NDC_BOX",
    "RayFrame",
    "SceneSpace",
    "detect_space",
    "hierarchical_in_s",
    "march_in_s",
    "ndc_frame_of",
    "ray_frame",
    "reference_filter_marched",
    "resolve_space",
    "scene_space",
]

FORWARD_FACING_DEGREES = 35.0
"""A capture is forward-facing when every camera looks within this angle of the mean viewing direction."""
NDC_BOX = (-1.25, -1.25, -1.0, 1.25, 1.25, 1.0)
"""The field's box in NDC (x and y a little beyond the reference frustum, z from near to infinity)."""


def detect_space(c2w: np.ndarray, bounds: Any) -> tuple[str, str]:
    """Pick ``box``, ``contract`` or ``ndc`` from the camera layout and the store's scene bounds.

    Args:
        c2w: (I, 4, 4) camera-to-world poses (OpenCV frame: z is the viewing direction).
        bounds: ``((xmin, ymin, zmin), (xmax, ymax, zmax))`` or None.

    Returns:
        ``(space, reason)``: ``ndc`` when every camera looks within ``FORWARD_FACING_DEGREES`` of the
        mean direction; else ``box`` when the store has bounds and every camera is outside them;
        else ``contract`` (cameras inside the scene, or no bounds: an unbounded capture).
    """
    forwards = c2w[:, :3, 2] / np.linalg.norm(c2w[:, :3, 2], axis=-1, keepdims=True)
    mean = forwards.mean(0)
    spread = 90.0
    if np.linalg.norm(mean) > 1e-6:
        cosines = forwards @ (mean / np.linalg.norm(mean))
        spread = math.degrees(math.acos(float(np.clip(cosines.min(), -1.0, 1.0))))
    if spread <= FORWARD_FACING_DEGREES:
        return "ndc", f"forward-facing: every camera within {spread:.1f} degrees of the mean direction"
    if bounds is None:
        return "contract", f"no scene bounds in the store; cameras spread over {spread:.0f} degrees"
    lo, hi = np.asarray(bounds[0]), np.asarray(bounds[1])
    centres = c2w[:, :3, 3]
    inside = np.all((centres >= lo) & (centres <= hi), axis=-1)
    if inside.any():
        return "contract", f"{int(inside.sum())} of {len(centres)} cameras inside the scene bounds"
    return "box", "every camera outside the scene bounds (an object-centric capture)"


def resolve_space(config: TrainConfig, store: RayStore) -> tuple[TrainConfig, str]:
    """``config`` with ``scene_space`` resolved (``auto`` -> detected), and the reason for the choice."""
    if config.scene_space != "auto":
        return config, "chosen with --scene-space"
    space, reason = detect_space(np.asarray(store.table.c2w), store.scene.bounds)
    return config.replace(scene_space=space), reason


def ndc_frame_of(store: RayStore) -> Tensor:
    """(22,) the NDC reference: w2c rotation (9), camera centre (3), fx, fy, width, height, near, 0...

    The reference camera sits at the mean camera centre and looks along the mean viewing direction;
    its intrinsics are the first camera's; the near plane is 0.9 x the smallest near bound.
    """
    table = store.table
    c2w = np.asarray(table.c2w)
    forward = c2w[:, :3, 2].mean(0)
    forward /= np.linalg.norm(forward)
    down = c2w[:, :3, 1].mean(0)
    down -= forward * (down @ forward)
    down /= np.linalg.norm(down)
    right = np.cross(down, forward)
    rotation = np.stack([right, down, forward], axis=1)  # c2w rotation, columns = camera axes
    near = np.asarray(table.near, dtype=np.float64)
    if not np.isfinite(near).any() or np.nanmin(near) <= 0:
        raise ConfigError(
            f"{store.url if hasattr(store, 'url') else 'store'}: scene space ndc needs positive near "
            "bounds in the camera table; pass --scene-space contract instead"
        )
    camera = table.cameras[int(table.camera_index[0])]
    fx, fy = camera.focal
    values = [
        *rotation.T.reshape(-1),
        *c2w[:, :3, 3].mean(0),
        fx,
        fy,
        camera.width,
        camera.height,
        0.9 * float(np.nanmin(near)),
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
    ]
    return torch.tensor(values[:22], dtype=torch.float32)


@dataclass(frozen=True)
class SceneSpace:
    """A resolved scene space: the field's box (the inner box when contracted) and the NDC reference."""

    mode: str
    aabb: Tensor
    ndc_frame: Tensor | None
    reason: str

    def describe(self) -> dict[str, Any]:
        """JSON-able record for ``run.json``."""
        return {
            "mode": self.mode,
            "aabb": self.aabb.tolist(),
            "reason": self.reason,
            "ndc_frame": None if self.ndc_frame is None else self.ndc_frame.tolist(),
        }


def scene_space(config: TrainConfig, store: RayStore, reason: str = "") -> SceneSpace:
    """The field's box for ``config.scene_space`` (already resolved) on ``store``."""
    if config.scene_space == "ndc":
        return SceneSpace("ndc", torch.tensor(NDC_BOX), ndc_frame_of(store), reason)
    if config.scene_space == "contract" and config.aabb == "auto":
        c2w = torch.as_tensor(np.asarray(store.table.c2w), dtype=torch.float64)
        centre = focus_point(c2w[:, :3, 3], c2w[:, :3, 2])
        radius = float(torch.linalg.vector_norm(c2w[:, :3, 3] - centre, dim=-1).max())
        radius = max(radius, 1e-3)
        box = torch.cat([centre - radius, centre + radius]).to(torch.float32)
        return SceneSpace("contract", box, None, reason)
    return SceneSpace(config.scene_space, scene_aabb(config, store), None, reason)


@dataclass
class RayFrame:
    """Rays in the field's position space with their sampling interval (see the module docstring).

    Attributes:
        origins, directions: (N, 3); positions are ``origins + t * directions``.
        s0, s1: (N,) the interval sampled, in the sampling coordinate ``s``.
        scale: > 0 when contracted: ``t = scale * spacing_inverse(s)``; 0 means ``t = s``.
    """

    origins: Tensor
    directions: Tensor
    s0: Tensor
    s1: Tensor
    scale: float = 0.0

    def to_t(self, s: Tensor) -> Tensor:
        """Sampling coordinate -> distance along the ray."""
        return s if self.scale == 0.0 else self.scale * spacing_inverse(s)

    def positions(self, t: Tensor) -> Tensor:
        """(N, S) distances -> (N, S, 3) positions."""
        return self.origins[:, None, :] + self.directions[:, None, :] * t[..., None]


def _to_ndc(
    frame: Tensor, origins: Tensor, directions: Tensor, values: tuple[float, ...] | None = None
) -> tuple[Tensor, Tensor]:
    rotation, centre = frame[:9].view(3, 3), frame[9:12]
    o = (origins - centre) @ rotation.T
    d = directions @ rotation.T
    fx, fy, width, height, near = values[12:17] if values is not None else frame[12:17].tolist()
    return ndc_rays(o, d, fx, fy, width, height, near)


def ray_frame(
    mode: str,
    aabb: Tensor,
    ndc_frame: Tensor | None,
    origins: Tensor,
    directions: Tensor,
    near: Tensor,
    far: Tensor,
    box: tuple[float, ...] | None = None,
    ndc_values: tuple[float, ...] | None = None,
) -> RayFrame:
    """Frame world rays (N, 3) with bounds ``near``/``far`` (N,) for the field's space ``mode``.

    ``box`` and ``ndc_values``: host copies of ``aabb`` and ``ndc_frame`` (the field keeps them), so
    that framing rays on a GPU reads nothing back from it.
    """
    if mode == "contract":
        sides = [hi - lo for lo, hi in zip(box[:3], box[3:], strict=True)] if box else None
        radius = max(sides) / 2 if sides else float((aabb[3:] - aabb[:3]).max()) / 2
        s0, s1 = spacing(near / radius), spacing(far / radius)
        return RayFrame(origins, directions, s0, torch.maximum(s1, s0), radius)
    if mode == "ndc":
        if ndc_frame is None:
            raise TypeError("ray_frame: scene space ndc needs the field's ndc_frame")
        origins, directions = _to_ndc(ndc_frame, origins, directions, ndc_values)
        near = torch.zeros_like(near)
        far = torch.full_like(far, 1.0 - 1e-4)
    t_min, t_max = ray_aabb_intersect(origins, directions, aabb)
    t0 = torch.maximum(near, t_min)
    t1 = torch.maximum(torch.minimum(far, t_max), t0)
    return RayFrame(origins, directions, t0, t1)


def hierarchical_in_s(
    density_fn: Any,
    frame: RayFrame,
    n_coarse: int,
    n_fine: int,
    uniform: float,
    generator: torch.Generator | None = None,
) -> Samples:
    """:func:`raykit.trainer.samplers.hierarchical_samples` with both passes drawn in ``s`` (any frame).

    The coarse weights use true distances ``t``; the fine edges are drawn in ``s`` from them.
    """
    coarse = stratified_samples(frame.s0, frame.s1, n_coarse, generator)
    with torch.no_grad():
        t_starts, t_ends = frame.to_t(coarse.t_starts), frame.to_t(coarse.t_ends)
        sigmas = density_fn(frame.positions(0.5 * (t_starts + t_ends)))
        weights = render_weight_from_density(t_starts, t_ends, sigmas)[0]
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-8)
        widths = coarse.t_ends - coarse.t_starts
        flat = widths / widths.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        bins = torch.cat([coarse.t_starts, coarse.t_ends[:, -1:]], dim=-1)
        edges = frame.to_t(
            sample_pdf(bins, (1.0 - uniform) * weights + uniform * flat, n_fine + 1, generator)
        )
    return Samples(edges[:, :-1].contiguous(), edges[:, 1:].contiguous(), None, frame.s0.shape[0])


def march_in_s(
    frame: RayFrame,
    n_steps: int,
    occupied: Any,
    generator: torch.Generator | None = None,
    density_fn: Any | None = None,
    early_stop_eps: float = 1e-4,
    alpha_threshold: float | Tensor = 0.0,
) -> Samples:
    """Occupancy marching with steps of equal length in ``s`` (``1 / n_steps``); packed output.

    Args:
        frame: the rays and their ``[s0, s1]``.
        n_steps: steps across the whole range ``s in [0, 1)``.
        occupied: (K, 3) positions -> (K,) bool, e.g. the grid's test on field coordinates.
        generator: jitters the start of each ray's comb by a fraction of a step; None for none.
        density_fn: (K, 3) positions -> (K,) densities; when given, a no-gradient pass drops the
            samples behind which the transmittance has fallen below ``early_stop_eps`` (as
            ``raykit.trainer.samplers.march_occupied`` does in a box) and those whose opacity is below
            ``alpha_threshold`` (nerfacc's ``alpha_thre``); see ``samplers.filter_marched``.
    """
    n_rays = frame.s0.shape[0]
    ds = 1.0 / n_steps
    longest = float((frame.s1 - frame.s0).max()) if n_rays else 0.0
    count = max(1, math.ceil(longest / ds))
    like = frame.s0
    if generator is None:
        offset = torch.full((n_rays, 1), 0.5, dtype=like.dtype, device=like.device)
    else:
        offset = torch.rand((n_rays, 1), generator=generator, dtype=like.dtype, device=like.device)
    s_mid = frame.s0[:, None] + (torch.arange(count, dtype=like.dtype, device=like.device) + offset) * ds
    inside = s_mid < frame.s1[:, None]
    ray_indices, step_indices = torch.nonzero(inside, as_tuple=True)
    s_packed = s_mid[ray_indices, step_indices]
    positions = frame.origins[ray_indices] + frame.directions[ray_indices] * frame.to_t(s_packed)[:, None]
    keep = occupied(positions)
    ray_indices, s_packed, positions = ray_indices[keep], s_packed[keep], positions[keep]
    s_starts = torch.maximum(s_packed - 0.5 * ds, frame.s0[ray_indices])
    s_ends = torch.minimum(s_packed + 0.5 * ds, frame.s1[ray_indices])
    t_starts, t_ends = frame.to_t(s_starts), frame.to_t(s_ends)
    return early_stopped(
        t_starts, t_ends, ray_indices, n_rays, density_fn, positions, early_stop_eps, alpha_threshold
    )


def reference_filter_marched(
    t_starts: Tensor,
    t_ends: Tensor,
    sigmas: Tensor,
    ray_indices: Tensor,
    early_stop_eps: float,
    alpha_threshold: float,
) -> Tensor:
    """Slow twin of :func:`filter_marched`: one sample at a time, transmittance carried along each ray."""
    keep, trans, ray = [], 1.0, -1
    for start, end, sigma, index in zip(
        t_starts.tolist(), t_ends.tolist(), sigmas.tolist(), ray_indices.tolist(), strict=True
    ):
        if index != ray:
            trans, ray = 1.0, index
        alpha = 1.0 - math.exp(-sigma * (end - start))
        keep.append(trans > early_stop_eps and alpha >= alpha_threshold)
        trans *= 1.0 - alpha
    return torch.tensor(keep, dtype=torch.bool)
