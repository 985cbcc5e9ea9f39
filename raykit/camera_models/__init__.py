"""COLMAP camera model formulas (ids 0-16), batched in torch.

Each model maps a camera-frame point to continuous COLMAP image coordinates (``project``) and an image
coordinate back to a unit ray in the camera frame (``unproject``). The formulas follow COLMAP's
``src/colmap/sensor/models.h``; where COLMAP's 2-D normalised coordinates cannot represent a ray
(fisheye-type models beyond 90 degrees), the same model is evaluated on 3-D unit rays instead.

Model families:

* ``perspective``: ``(u, v) = (x/z, y/z)``, additive distortion ``(u, v) + D(u, v)``, then ``f * . + c``.
  Unprojection inverts ``D`` with Newton's method (COLMAP's ``IterativeUndistortion``).
* ``fisheye``: ``theta = atan2(|(x, y)|, z)``, ``(uu, vv) = theta * (x, y) / |(x, y)|``, then as above.
* ``fov``, ``division``, ``eucm``: closed-form projection and unprojection.

Tensors: ``xy`` (..., 2) image coordinates, ``points`` (..., 3) camera-frame points, ``rays`` (..., 3).
Vectorised over the leading dimensions; every function works in float32 and float64, on any device.

The additive distortion terms and their Newton inversion are :mod:`raykit.camera_models.distortion`;
the 17 models' projection and unprojection formulas, one short function each, are kept together here
so the models can be read and compared side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raykit.camera_models.distortion import (
    Dual,
    Params,
    full_opencv,
    no_distortion,
    opencv,
    rad_tan_thin_prism,
    radial,
    thin_prism,
    undistort_newton,
)
from raykit.lazy import lazy_torch

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_torch(globals())

__all__ = [
    "CAMERA_MODELS",
    "MODEL_NAMES_BY_ID",
    "CameraModel",
    "Dual",
    "project_model",
    "undistort_newton",
    "unproject_model",
]


@dataclass(frozen=True)
class CameraModel:
    """The specification of one COLMAP camera model.

    Attributes:
        model_id: COLMAP's numeric id (0-16).
        name: COLMAP's name, e.g. ``"OPENCV"``.
        param_names: parameter names in COLMAP order.
        family: ``"perspective"``, ``"fisheye"``, ``"fov"``, ``"division"`` or ``"eucm"``.
        focal_idx: indices of the focal length(s) in ``params`` (one or two).
        pp_idx: indices of the principal point ``(cx, cy)``.
        distortion: additive distortion ``D(u, v, extra) -> (du, dv)`` for the perspective and
            fisheye families, or None.
    """

    model_id: int
    name: str
    param_names: tuple[str, ...]
    family: str
    focal_idx: tuple[int, ...]
    pp_idx: tuple[int, int]
    distortion: Callable[..., tuple[Any, Any]] | None = None

    @property
    def num_params(self) -> int:
        return len(self.param_names)

    @property
    def extra_idx(self) -> tuple[int, ...]:
        """Indices of the parameters that are neither focal length nor principal point."""
        return tuple(range(len(self.focal_idx) + 2, self.num_params))


def _spec(
    model_id: int, name: str, params: str, family: str, distortion: Callable[..., Any] | None = None
) -> CameraModel:
    names = tuple(p.strip() for p in params.split(","))
    n_focal = 1 if names[0] == "f" else 2
    return CameraModel(
        model_id=model_id,
        name=name,
        param_names=names,
        family=family,
        focal_idx=tuple(range(n_focal)),
        pp_idx=(n_focal, n_focal + 1),
        distortion=distortion,
    )


CAMERA_MODELS: dict[str, CameraModel] = {
    spec.name: spec
    for spec in (
        _spec(0, "SIMPLE_PINHOLE", "f, cx, cy", "perspective", no_distortion),
        _spec(1, "PINHOLE", "fx, fy, cx, cy", "perspective", no_distortion),
        _spec(2, "SIMPLE_RADIAL", "f, cx, cy, k", "perspective", radial),
        _spec(3, "RADIAL", "f, cx, cy, k1, k2", "perspective", radial),
        _spec(4, "OPENCV", "fx, fy, cx, cy, k1, k2, p1, p2", "perspective", opencv),
        _spec(5, "OPENCV_FISHEYE", "fx, fy, cx, cy, k1, k2, k3, k4", "fisheye", radial),
        _spec(6, "FULL_OPENCV", "fx, fy, cx, cy, k1, k2, p1, p2, k3, k4, k5, k6", "perspective", full_opencv),
        _spec(7, "FOV", "fx, fy, cx, cy, omega", "fov"),
        _spec(8, "SIMPLE_RADIAL_FISHEYE", "f, cx, cy, k", "fisheye", radial),
        _spec(9, "RADIAL_FISHEYE", "f, cx, cy, k1, k2", "fisheye", radial),
        _spec(
            10,
            "THIN_PRISM_FISHEYE",
            "fx, fy, cx, cy, k1, k2, p1, p2, k3, k4, sx1, sy1",
            "fisheye",
            thin_prism,
        ),
        _spec(
            11,
            "RAD_TAN_THIN_PRISM_FISHEYE",
            "fx, fy, cx, cy, k0, k1, k2, k3, k4, k5, p0, p1, s0, s1, s2, s3",
            "fisheye",
            rad_tan_thin_prism,
        ),
        _spec(12, "SIMPLE_DIVISION", "f, cx, cy, k", "division"),
        _spec(13, "DIVISION", "fx, fy, cx, cy, k", "division"),
        _spec(14, "SIMPLE_FISHEYE", "f, cx, cy", "fisheye", no_distortion),
        _spec(15, "FISHEYE", "fx, fy, cx, cy", "fisheye", no_distortion),
        _spec(16, "EUCM", "fx, fy, cx, cy, alpha, beta", "eucm"),
    )
}

MODEL_NAMES_BY_ID: dict[int, str] = {spec.model_id: spec.name for spec in CAMERA_MODELS.values()}

# COLMAP's FOV model switches to Taylor expansions below this threshold (omega^2 or radius^2).
_FOV_EPS = 1e-4


def _intrinsics(spec: CameraModel, params: Params) -> tuple[float, float, float, float]:
    fx = params[spec.focal_idx[0]]
    fy = params[spec.focal_idx[-1]]
    return fx, fy, params[spec.pp_idx[0]], params[spec.pp_idx[1]]


def _extra(spec: CameraModel, params: Params) -> tuple[float, ...]:
    return tuple(params[i] for i in spec.extra_idx)


def _nan_where(mask: Tensor, values: Tensor) -> Tensor:
    return torch.where(mask, values, torch.full_like(values, float("nan")))


# ---------------------------------------------------------------------------------------------
# Projection: camera-frame points -> continuous COLMAP image coordinates.


def _to_pixels(spec: CameraModel, params: Params, u: Tensor, v: Tensor) -> Tensor:
    fx, fy, cx, cy = _intrinsics(spec, params)
    return torch.stack((fx * u + cx, fy * v + cy), dim=-1)


def _project_perspective(spec: CameraModel, params: Params, x: Tensor, y: Tensor, z: Tensor) -> Tensor:
    valid = z >= torch.finfo(z.dtype).eps
    u, v = x / z, y / z
    du, dv = spec.distortion(u, v, _extra(spec, params))  # type: ignore[misc]
    return _nan_where(valid[..., None], _to_pixels(spec, params, u + du, v + dv))


def _project_fisheye(spec: CameraModel, params: Params, x: Tensor, y: Tensor, z: Tensor) -> Tensor:
    rho = torch.sqrt(x * x + y * y)
    theta = torch.atan2(rho, z)
    # On the optical axis theta / rho -> 1 / z (COLMAP skips the scaling there).
    scale = torch.where(rho > 0, theta / torch.where(rho > 0, rho, 1.0), 1.0 / z)
    valid = (rho > 0) | (z > 0)
    uu, vv = x * scale, y * scale
    du, dv = spec.distortion(uu, vv, _extra(spec, params))  # type: ignore[misc]
    return _nan_where(valid[..., None], _to_pixels(spec, params, uu + du, vv + dv))


def _fov_omega(params: Params, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(|omega|, tan(|omega| / 2), |omega|^2 < eps)``; the FOV model is even in omega."""
    omega = torch.as_tensor(params[4], dtype=like.dtype, device=like.device).abs()
    return omega, torch.tan(omega / 2.0), omega * omega < _FOV_EPS


def _project_fov(spec: CameraModel, params: Params, x: Tensor, y: Tensor, z: Tensor) -> Tensor:
    omega, tan_half, tiny_omega = _fov_omega(params, z)
    forward = z >= torch.finfo(z.dtype).eps
    safe_z = torch.where(forward, z, 1.0)
    u, v = x / safe_z, y / safe_z
    r2 = u * u + v * v
    rho = torch.sqrt(x * x + y * y)
    # COLMAP's Taylor expansions, in omega and in the radius.
    taylor_omega = (omega * omega * r2) / 3.0 - omega * omega / 12.0 + 1.0
    taylor_r = (-2.0 * tan_half * (4.0 * r2 * tan_half * tan_half - 3.0)) / (3.0 * omega)
    use_taylor = tiny_omega | (forward & (r2 < _FOV_EPS))
    taylor = torch.where(tiny_omega, taylor_omega, taylor_r)
    # atan(r * 2 tan(omega/2)) / (r * omega) applied to (u, v) == atan2(rho * s, z) / (rho * omega) to (x, y)
    exact = torch.atan2(rho * 2.0 * tan_half, z) / (torch.where(rho > 0, rho, 1.0) * omega)
    ud = torch.where(use_taylor, u * taylor, x * exact)
    vd = torch.where(use_taylor, v * taylor, y * exact)
    valid = torch.where(tiny_omega, forward, use_taylor | (rho > 0))
    return _nan_where(valid[..., None], _to_pixels(spec, params, ud, vd))


def _project_division(spec: CameraModel, params: Params, x: Tensor, y: Tensor, z: Tensor) -> Tensor:
    k = params[-1]
    rho2 = x * x + y * y
    disc_sq = z * z - 4.0 * rho2 * k
    denom = z + torch.sqrt(torch.clamp(disc_sq, min=0.0))
    valid = (disc_sq >= 0) & (denom > 0)
    r = 2.0 / torch.where(valid, denom, 1.0)
    return _nan_where(valid[..., None], _to_pixels(spec, params, x * r, y * r))


def _project_eucm(spec: CameraModel, params: Params, x: Tensor, y: Tensor, z: Tensor) -> Tensor:
    alpha, beta = params[4], params[5]
    rho = torch.sqrt(beta * (x * x + y * y) + z * z)
    den = alpha * rho + (1.0 - alpha) * z
    valid = den >= torch.finfo(z.dtype).eps
    safe = torch.where(valid, den, 1.0)
    return _nan_where(valid[..., None], _to_pixels(spec, params, x / safe, y / safe))


_PROJECTORS = {
    "perspective": _project_perspective,
    "fisheye": _project_fisheye,
    "fov": _project_fov,
    "division": _project_division,
    "eucm": _project_eucm,
}


def project_model(spec: CameraModel, params: Params, points: Tensor) -> Tensor:
    """(..., 3) camera-frame points -> (..., 2) image coordinates; NaN where the model is undefined."""
    x, y, z = points.unbind(-1)
    return _PROJECTORS[spec.family](spec, params, x, y, z)


# ---------------------------------------------------------------------------------------------
# Unprojection: continuous COLMAP image coordinates -> unit camera-frame rays.


def _normalized(spec: CameraModel, params: Params, xy: Tensor) -> tuple[Tensor, Tensor]:
    fx, fy, cx, cy = _intrinsics(spec, params)
    return (xy[..., 0] - cx) / fx, (xy[..., 1] - cy) / fy


def _unit(x: Tensor, y: Tensor, z: Tensor) -> Tensor:
    ray = torch.stack((x, y, z), dim=-1)
    return ray / torch.linalg.vector_norm(ray, dim=-1, keepdim=True)


def _undistort(spec: CameraModel, params: Params, u: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    extra = _extra(spec, params)
    if all(isinstance(e, float) and e == 0.0 for e in extra):
        return u, v, torch.isfinite(u) & torch.isfinite(v)
    return undistort_newton(spec.distortion, extra, u, v)  # type: ignore[arg-type]


def _unproject_perspective(spec: CameraModel, params: Params, xy: Tensor) -> tuple[Tensor, Tensor]:
    u, v, ok = _undistort(spec, params, *_normalized(spec, params, xy))
    return _unit(u, v, torch.ones_like(u)), ok


def _unproject_fisheye(spec: CameraModel, params: Params, xy: Tensor) -> tuple[Tensor, Tensor]:
    uu, vv, ok = _undistort(spec, params, *_normalized(spec, params, xy))
    theta = torch.sqrt(uu * uu + vv * vv)
    # sin(theta) / theta, with its Taylor series near the axis.
    sinc = torch.where(
        theta > 1e-4, torch.sin(theta) / torch.where(theta > 1e-4, theta, 1.0), 1.0 - theta**2 / 6
    )
    return _unit(uu * sinc, vv * sinc, torch.cos(theta)), ok


def _unproject_fov(spec: CameraModel, params: Params, xy: Tensor) -> tuple[Tensor, Tensor]:
    ud, vd = _normalized(spec, params, xy)
    omega, tan_half, tiny_omega = _fov_omega(params, ud)
    r2 = ud * ud + vd * vd
    rd = torch.sqrt(r2)
    small_r = r2 < _FOV_EPS
    taylor_omega = (omega * omega * r2) / 3.0 - omega * omega / 12.0 + 1.0
    taylor_r = (omega * (omega * omega * r2 + 3.0)) / (6.0 * tan_half)
    use_taylor = tiny_omega | small_r
    taylor = torch.where(tiny_omega, taylor_omega, taylor_r)
    # tan(rd * omega) / (rd * 2 tan(omega/2)) on (ud, vd, 1), written without the tan pole at 90 degrees.
    sin_r = torch.sin(rd * omega) / torch.where(small_r, 1.0, rd)
    x = torch.where(use_taylor, ud * taylor, ud * sin_r)
    y = torch.where(use_taylor, vd * taylor, vd * sin_r)
    z = torch.where(use_taylor, 1.0, 2.0 * tan_half * torch.cos(rd * omega))
    return _unit(x, y, z), torch.isfinite(r2) & (use_taylor | (rd * omega < torch.pi))


def _unproject_division(spec: CameraModel, params: Params, xy: Tensor) -> tuple[Tensor, Tensor]:
    u, v = _normalized(spec, params, xy)
    r2 = u * u + v * v
    return _unit(u, v, 1.0 + params[-1] * r2), torch.isfinite(r2)


def _unproject_eucm(spec: CameraModel, params: Params, xy: Tensor) -> tuple[Tensor, Tensor]:
    alpha, beta = params[4], params[5]
    u, v = _normalized(spec, params, xy)
    r2 = u * u + v * v
    radicand = 1.0 - (2.0 * alpha - 1.0) * beta * r2
    den = alpha * torch.sqrt(torch.clamp(radicand, min=0.0)) + (1.0 - alpha)
    ok = (radicand >= 0) & (den >= torch.finfo(u.dtype).eps)
    mz = (1.0 - alpha * alpha * beta * r2) / torch.where(ok, den, 1.0)
    return _unit(u, v, mz), ok


_UNPROJECTORS = {
    "perspective": _unproject_perspective,
    "fisheye": _unproject_fisheye,
    "fov": _unproject_fov,
    "division": _unproject_division,
    "eucm": _unproject_eucm,
}


def unproject_model(spec: CameraModel, params: Params, xy: Tensor) -> tuple[Tensor, Tensor]:
    """(..., 2) image coordinates -> ((..., 3) unit camera-frame rays, (...) bool valid mask)."""
    return _UNPROJECTORS[spec.family](spec, params, xy)
