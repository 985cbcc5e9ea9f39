"""raykit cameras as nerfstudio represents them, without importing nerfstudio.

nerfstudio's ``Cameras`` holds ``fx, fy, cx, cy`` (COLMAP image coordinates: pixel centres at
``+0.5``, as raykit), a ``camera_type`` and ``distortion_params`` ``[k1, k2, k3, k4, p1, p2]``: the
OpenCV radial-tangential polynomial for PERSPECTIVE, and for FISHEYE the same polynomial applied to
the equidistant angle (which is OpenCV's fisheye model when ``p1 = p2 = 0``). Models outside that
family (FOV, thin prism, division, EUCM, FULL_OPENCV with rational terms) are refused with one line
naming the model (they are not undistorted: resampling the photos is the full-image datamanager's job,
``ImageLoader(undistort=True)``, and it only applies to models nerfstudio can also describe).
"""

from __future__ import annotations

from dataclasses import dataclass

from raykit.cameras import CAMERA_MODELS, Camera
from raykit.errors import CameraError

__all__ = ["NERFSTUDIO_MODELS", "NerfstudioIntrinsics", "nerfstudio_intrinsics"]

# model -> (nerfstudio camera type, names of params filling [k1, k2, k3, k4, p1, p2] in order; "" = 0)
NERFSTUDIO_MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "SIMPLE_PINHOLE": ("PERSPECTIVE", ()),
    "PINHOLE": ("PERSPECTIVE", ()),
    "SIMPLE_RADIAL": ("PERSPECTIVE", ("k",)),
    "RADIAL": ("PERSPECTIVE", ("k1", "k2")),
    "OPENCV": ("PERSPECTIVE", ("k1", "k2", "", "", "p1", "p2")),
    "FULL_OPENCV": ("PERSPECTIVE", ("k1", "k2", "k3", "", "p1", "p2")),
    "OPENCV_FISHEYE": ("FISHEYE", ("k1", "k2", "k3", "k4")),
    "SIMPLE_RADIAL_FISHEYE": ("FISHEYE", ("k",)),
    "RADIAL_FISHEYE": ("FISHEYE", ("k1", "k2")),
    "SIMPLE_FISHEYE": ("FISHEYE", ()),
    "FISHEYE": ("FISHEYE", ()),
}
# FULL_OPENCV's rational denominator (1 + k4 r^2 + k5 r^4 + k6 r^6) has no nerfstudio counterpart
_MUST_BE_ZERO = {"FULL_OPENCV": ("k4", "k5", "k6")}


@dataclass(frozen=True)
class NerfstudioIntrinsics:
    """One camera in nerfstudio's terms.

    Attributes:
        camera_type: ``"PERSPECTIVE"`` or ``"FISHEYE"`` (a ``nerfstudio.cameras.cameras.CameraType`` name).
        fx, fy, cx, cy: focal lengths and principal point in pixels (COLMAP image coordinates).
        distortion: ``(k1, k2, k3, k4, p1, p2)``.
    """

    camera_type: str
    fx: float
    fy: float
    cx: float
    cy: float
    distortion: tuple[float, float, float, float, float, float]


def nerfstudio_intrinsics(camera: Camera) -> NerfstudioIntrinsics:
    """The nerfstudio form of ``camera``; raises ``CameraError`` (one line naming the camera and the
    model) for a model nerfstudio cannot represent."""
    where = camera.label or f"camera {camera.camera_id}"
    if camera.model not in NERFSTUDIO_MODELS:
        raise CameraError(
            f"{where}: camera model {camera.model} has no nerfstudio equivalent (nerfstudio has pinhole, "
            f"OpenCV radial-tangential and OpenCV fisheye cameras); expected one of "
            f"{', '.join(NERFSTUDIO_MODELS)}"
        )
    values = dict(zip(CAMERA_MODELS[camera.model].param_names, camera.params, strict=True))
    nonzero = [name for name in _MUST_BE_ZERO.get(camera.model, ()) if values[name] != 0.0]
    if nonzero:
        raise CameraError(
            f"{where}: camera model {camera.model} with rational terms {', '.join(nonzero)} != 0 has no "
            "nerfstudio equivalent (its distortion is a polynomial in r^2 only)"
        )
    kind, slots = NERFSTUDIO_MODELS[camera.model]
    dist = [values[name] if name else 0.0 for name in slots] + [0.0] * (6 - len(slots))
    fx, fy = (values[name] if name in values else values["f"] for name in ("fx", "fy"))
    k1, k2, k3, k4, p1, p2 = (float(v) for v in dist)
    return NerfstudioIntrinsics(
        kind, float(fx), float(fy), float(values["cx"]), float(values["cy"]), (k1, k2, k3, k4, p1, p2)
    )
