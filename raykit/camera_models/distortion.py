"""The additive distortion terms of COLMAP's perspective and fisheye models and their inversion.

Each term ``D(u, v, extra) -> (du, dv)`` is written once with arithmetic only, so evaluating it on
:class:`Dual` numbers yields its own 2x2 Jacobian for Newton's method (:func:`undistort_newton`,
COLMAP's ``IterativeUndistortion``, batched).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from raykit.lazy import lazy_torch

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    torch = lazy_torch(globals())

__all__ = ["Dual", "Params", "full_opencv", "no_distortion", "opencv", "rad_tan_thin_prism", "radial",
           "thin_prism", "undistort_newton"]  # fmt: skip

# Parameters in COLMAP order: floats (one camera) or (...) tensors broadcasting against the points
# (one camera per element, e.g. per ray).
Params = Sequence[Any]


class Dual:
    """A value with its partial derivatives w.r.t. ``(u, v)``: minimal forward-mode autodiff.

    Plays the role of COLMAP's ``ceres::Jet<double, 2>`` so that each distortion formula is written
    once and yields its own 2x2 Jacobian for Newton's method.
    """

    __slots__ = ("du", "dv", "val")

    def __init__(self, val: Tensor, du: Tensor | float, dv: Tensor | float) -> None:
        self.val, self.du, self.dv = val, du, dv

    def __add__(self, other: Dual | float) -> Dual:
        if isinstance(other, Dual):
            return Dual(self.val + other.val, self.du + other.du, self.dv + other.dv)
        return Dual(self.val + other, self.du, self.dv)

    __radd__ = __add__

    def __neg__(self) -> Dual:
        return Dual(-self.val, -self.du, -self.dv)

    def __sub__(self, other: Dual | float) -> Dual:
        return self + (-other)

    def __rsub__(self, other: float) -> Dual:
        return (-self) + other

    def __mul__(self, other: Dual | float) -> Dual:
        if isinstance(other, Dual):
            return Dual(
                self.val * other.val,
                self.du * other.val + self.val * other.du,
                self.dv * other.val + self.val * other.dv,
            )
        return Dual(self.val * other, self.du * other, self.dv * other)

    __rmul__ = __mul__

    def __truediv__(self, other: Dual | float) -> Dual:
        if isinstance(other, Dual):
            inv = 1.0 / other.val
            val = self.val * inv
            return Dual(val, (self.du - val * other.du) * inv, (self.dv - val * other.dv) * inv)
        return Dual(self.val / other, self.du / other, self.dv / other)


# ---------------------------------------------------------------------------------------------
# Additive distortion terms D(u, v); u, v are Tensors or Duals, extra the model's extra params.


def radial(u: Any, v: Any, coeffs: Params) -> tuple[Any, Any]:
    """``radial = sum_i k_i r^(2i)``; ``D = (u, v) * radial`` (the models' ``extra`` are the ``k_i``)."""
    r2 = u * u + v * v
    radial = r2 * coeffs[-1]
    for k in reversed(coeffs[:-1]):
        radial = (radial + k) * r2
    return u * radial, v * radial


def no_distortion(u: Any, v: Any, extra: Params) -> tuple[Any, Any]:
    return u * 0.0, v * 0.0


def opencv(u: Any, v: Any, extra: Params) -> tuple[Any, Any]:
    k1, k2, p1, p2 = extra
    du, dv = radial(u, v, (k1, k2))
    uv, r2 = u * v, u * u + v * v
    return (
        du + 2.0 * p1 * uv + p2 * (r2 + 2.0 * u * u),
        dv + 2.0 * p2 * uv + p1 * (r2 + 2.0 * v * v),
    )


def full_opencv(u: Any, v: Any, extra: Params) -> tuple[Any, Any]:
    k1, k2, p1, p2, k3, k4, k5, k6 = extra
    r2 = u * u + v * v
    r4 = r2 * r2
    r6 = r4 * r2
    radial = (1.0 + k1 * r2 + k2 * r4 + k3 * r6) / (1.0 + k4 * r2 + k5 * r4 + k6 * r6)
    uv = u * v
    return (
        u * radial + 2.0 * p1 * uv + p2 * (r2 + 2.0 * u * u) - u,
        v * radial + 2.0 * p2 * uv + p1 * (r2 + 2.0 * v * v) - v,
    )


def thin_prism(u: Any, v: Any, extra: Params) -> tuple[Any, Any]:
    k1, k2, p1, p2, k3, k4, sx1, sy1 = extra
    du, dv = radial(u, v, (k1, k2, k3, k4))
    uv, r2 = u * v, u * u + v * v
    return (
        du + 2.0 * p1 * uv + p2 * (r2 + 2.0 * u * u) + sx1 * r2,
        dv + 2.0 * p2 * uv + p1 * (r2 + 2.0 * v * v) + sy1 * r2,
    )


def rad_tan_thin_prism(u: Any, v: Any, extra: Params) -> tuple[Any, Any]:
    p0, p1, s0, s1, s2, s3 = extra[6:]
    du, dv = radial(u, v, extra[:6])
    x, y = u + du, v + dv
    r2 = x * x + y * y
    r4 = r2 * r2
    xy = x * y
    x_dist = x + 2.0 * p1 * xy + p0 * (r2 + 2.0 * x * x) + s0 * r2 + s1 * r4
    y_dist = y + 2.0 * p0 * xy + p1 * (r2 + 2.0 * y * y) + s2 * r2 + s3 * r4
    return x_dist - u, y_dist - v


# ---------------------------------------------------------------------------------------------
# Newton's method for the additive distortion (COLMAP's IterativeUndistortion, batched).


def undistort_newton(
    distortion: Callable[..., tuple[Any, Any]],
    extra: Params,
    u0: Tensor,
    v0: Tensor,
    max_iter: int = 100,
) -> tuple[Tensor, Tensor, Tensor]:
    """Solve ``(u, v) + D(u, v) = (u0, v0)`` for every element with Newton's method.

    Uses COLMAP's trust region (a step is at most ``max(0.1 * |(u, v)|, 0.1)`` long) and stops once
    every element's step is below the dtype's tolerance or after ``max_iter`` iterations.

    Args:
        distortion: ``D(u, v, extra) -> (du, dv)``, written with arithmetic only (works on Dual).
        u0, v0: (...) distorted normalised coordinates.

    Returns:
        ``(u, v, converged)``: (...) undistorted coordinates and a bool mask of converged elements.
    """
    tol_sq = 1e-22 if u0.dtype == torch.float64 else 1e-11
    u, v = u0.clone(), v0.clone()
    converged = torch.zeros_like(u0, dtype=torch.bool)
    for _ in range(max_iter):
        du, dv = distortion(Dual(u, 1.0, 0.0), Dual(v, 0.0, 1.0), extra)
        r0, r1 = u + du.val - u0, v + dv.val - v0
        j00, j01, j10, j11 = 1.0 + du.du, du.dv, dv.du, 1.0 + dv.dv
        inv_det = 1.0 / (j00 * j11 - j01 * j10)
        su, sv = (j11 * r0 - j01 * r1) * inv_det, (j00 * r1 - j10 * r0) * inv_det
        step_sq = su * su + sv * sv
        radius_sq = torch.clamp((u * u + v * v) * 0.01, min=0.01)
        shrink = torch.where(step_sq > radius_sq, torch.sqrt(radius_sq / step_sq), torch.ones_like(step_sq))
        u, v = u - su * shrink, v - sv * shrink
        converged = step_sq * shrink * shrink < tol_sq
        if bool(converged.all()):
            break
    return u, v, converged & torch.isfinite(u) & torch.isfinite(v)
