"""Transforms-style camera intrinsics (instant-ngp, nerfstudio, Blender ``transforms*.json``) -> Camera.

One reader of the keys ``fl_x``, ``fl_y`` (pixels) or ``camera_angle_x``/``camera_angle_y`` (radians, full
field of view), ``cx``, ``cy`` (default: image centre, COLMAP pixel convention), ``w``, ``h``, distortion
``k1``-``k4``, ``p1``, ``p2``, ``camera_model`` and ``is_fisheye``, shared by the converters (``raykit
convert``) and the trainer (``raykit render --model OUT --cameras transforms.json``):

* ``OPENCV`` (default): no distortion -> ``PINHOLE``; ``k1, k2, p1, p2`` -> ``OPENCV``; with ``k3``
  -> ``FULL_OPENCV`` (``k4..k6 = 0``); nerfstudio's ``k4`` (an r^8 numerator term) has no COLMAP
  equivalent and is an error.
* ``OPENCV_FISHEYE`` (or instant-ngp's ``"is_fisheye": true``): ``k1``-``k4``; tangential terms are
  an error.
* ``PINHOLE`` / ``SIMPLE_PINHOLE``: no distortion allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from raykit.cameras import Camera
from raykit.errors import SourceError
from raykit.ranges import Range, image_size_problem, range_problems

__all__ = ["INTRINSIC_KEYS", "camera_from_intrinsics", "image_size", "intrinsics_problems"]

INTRINSIC_KEYS = (
    "fl_x", "fl_y", "camera_angle_x", "camera_angle_y", "cx", "cy", "w", "h",
    "k1", "k2", "k3", "k4", "p1", "p2", "camera_model", "is_fisheye",
)  # fmt: skip


def _num(d: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SourceError(f"{key}: expected a finite number, got {value!r}")
    return float(value)


def _focal(d: Mapping[str, Any], width: int, height: int) -> tuple[float, float]:
    if "fl_x" in d:
        fx = _num(d, "fl_x")
    elif "camera_angle_x" in d:
        fx = 0.5 * width / math.tan(0.5 * _num(d, "camera_angle_x"))
    else:
        raise SourceError("no focal length: expected fl_x or camera_angle_x")
    if "fl_y" in d:
        fy = _num(d, "fl_y")
    elif "camera_angle_y" in d:
        fy = 0.5 * height / math.tan(0.5 * _num(d, "camera_angle_y"))
    else:
        fy = fx
    return fx, fy


_ANGLE = Range(0, math.pi, low_open=True, high_open=True)  # a full field of view, radians
_INTRINSIC_RANGES = {
    "fl_x": Range(0, low_open=True), "fl_y": Range(0, low_open=True),
    "camera_angle_x": _ANGLE, "camera_angle_y": _ANGLE,
    **{key: Range() for key in ("cx", "cy", "k1", "k2", "k3", "k4", "p1", "p2")},
}  # fmt: skip
"""Expected ranges of the numeric intrinsics (a focal length's range relative to the image size is the
camera's own check, :data:`raykit.cameras.FOCAL_PER_SIDE`)."""


def intrinsics_problems(d: Mapping[str, Any]) -> list[str]:
    """Every numeric intrinsic of ``d`` outside its range: non-numeric or non-finite values, focal
    lengths <= 0, fields of view outside (0, pi)."""
    return range_problems(
        {key: (d[key], expected) for key, expected in _INTRINSIC_RANGES.items() if key in d}
    )


def camera_from_intrinsics(d: Mapping[str, Any], width: int, height: int, *, label: str) -> Camera:
    """Build a :class:`Camera` from transforms-style intrinsics for an image of ``width x height``.

    Raises:
        SourceError: bad numbers (all of them listed), missing focal length, unsupported distortion
            combination or camera model.
        CameraError: the resulting camera is invalid.
    """
    bad = intrinsics_problems(d)
    if bad:
        raise SourceError("; ".join(bad))
    fx, fy = _focal(d, width, height)
    cx, cy = _num(d, "cx", width / 2), _num(d, "cy", height / 2)
    k1, k2, k3, k4, p1, p2 = (_num(d, k) for k in ("k1", "k2", "k3", "k4", "p1", "p2"))
    model = str(d.get("camera_model", "OPENCV")).upper()
    if d.get("is_fisheye") is True:
        model = "OPENCV_FISHEYE"
    base = (fx, fy, cx, cy)
    if model == "OPENCV_FISHEYE":
        if p1 or p2:
            raise SourceError(f"camera_model OPENCV_FISHEYE has no tangential terms, got p1={p1}, p2={p2}")
        return Camera("OPENCV_FISHEYE", width, height, (*base, k1, k2, k3, k4), label=label)
    if model in ("PINHOLE", "SIMPLE_PINHOLE") and any((k1, k2, k3, k4, p1, p2)):
        raise SourceError(f"camera_model {model} cannot have distortion coefficients")
    if model not in ("OPENCV", "PINHOLE", "SIMPLE_PINHOLE"):
        raise SourceError(
            f"unknown camera_model {model!r}; expected OPENCV, OPENCV_FISHEYE, PINHOLE or SIMPLE_PINHOLE"
        )
    if k4:
        raise SourceError(f"k4={k4} with camera_model OPENCV (an r^8 term) has no COLMAP equivalent")
    if k3:
        return Camera("FULL_OPENCV", width, height, (*base, k1, k2, p1, p2, k3, 0.0, 0.0, 0.0), label=label)
    if k1 or k2 or p1 or p2:
        return Camera("OPENCV", width, height, (*base, k1, k2, p1, p2), label=label)
    return Camera("PINHOLE", width, height, base, label=label)


def image_size(width: Any, height: Any) -> tuple[int, int]:
    """``w``, ``h`` values of a transforms file as ints (integral numbers of a sane image size).

    Raises:
        SourceError: a value that is not an integral number, or a size outside
            :data:`raykit.ranges.IMAGE_SIDE` / :data:`raykit.ranges.IMAGE_PIXELS`.
    """
    ok = all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and float(v).is_integer()
        for v in (width, height)
    )
    if not ok:
        raise SourceError(f"w, h: expected integers, got {width!r}, {height!r}")
    if problem := image_size_problem(int(width), int(height)):
        raise SourceError(f"w, h: {problem}")
    return int(width), int(height)
