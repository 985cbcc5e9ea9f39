"""Camera records that lose nothing, and camera-frame ray math on batched torch tensors.

A :class:`Camera` keeps COLMAP's model name, image size and parameters in COLMAP order, so any COLMAP
camera round-trips exactly. Conventions (``docs/conventions.md``): integer pixel ``(x, y)`` has its
centre at ``(x + 0.5, y + 0.5)`` in continuous COLMAP image coordinates; the camera frame is OpenCV
(x right, y down, z forward); ``c2w`` is camera-to-world 4x4.

Vectorised over leading dimensions; float32 and float64; any torch device.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raykit.camera_models import CAMERA_MODELS, MODEL_NAMES_BY_ID, CameraModel, project_model, unproject_model
from raykit.conventions import pixel_centers
from raykit.errors import CameraError
from raykit.lazy import is_tensor, lazy_torch
from raykit.ranges import Range, image_size_problem

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_torch(globals())

__all__ = [
    "CAMERA_MODELS",
    "FOCAL_PER_SIDE",
    "Camera",
    "CameraModel",
    "direction_lut",
    "pixel_grid",
    "pixels_to_rays",
    "project",
    "unproject",
    "unproject_valid",
]

FOCAL_PER_SIDE = (1e-3, 1e5)
"""A focal length's expected range, in multiples of the image's larger side: a pinhole's field of view
from about 179.9 degrees down to about 0.0006 degrees (a fisheye seeing a full sphere has a focal length
of about 0.16 sides). Outside it a camera is degenerate (a Blender ``camera_angle_x`` of pi gives a
focal length of 1.5e-15 pixels) and is refused wherever a :class:`Camera` is made: from a capture, a
store (``raykit validate``) or a transforms file to render."""

_PINHOLE_NAMES = frozenset({"SIMPLE_PINHOLE", "PINHOLE"})
# Models that reduce to an undistorted pinhole when every extra parameter is zero.
_ZERO_EXTRA_IS_PINHOLE = frozenset(
    {"SIMPLE_RADIAL", "RADIAL", "OPENCV", "FULL_OPENCV", "FOV", "SIMPLE_DIVISION", "DIVISION"}
)


@dataclass(frozen=True)
class Camera:
    """One camera's intrinsics, exactly as COLMAP stores them.

    Attributes:
        model: COLMAP model name (``"PINHOLE"``, ``"OPENCV"``, ...); an int model id is accepted and
            converted to the name.
        width, height: image size in pixels (> 0).
        params: parameters in COLMAP order (see ``CAMERA_MODELS[model].param_names``).
        camera_id: the source's camera id (for error messages and round trips).
        label: where the camera came from, e.g. the source file (for error messages).
    """

    model: str
    width: int
    height: int
    params: tuple[float, ...]
    camera_id: int = 0
    label: str = ""

    def __post_init__(self) -> None:
        model: Any = self.model
        if isinstance(model, (int, np.integer)) and not isinstance(model, bool):
            if int(model) not in MODEL_NAMES_BY_ID:
                raise CameraError(f"{self._who()}: unknown camera model id {model}; expected 0-16")
            object.__setattr__(self, "model", MODEL_NAMES_BY_ID[int(model)])
        elif not isinstance(model, str) or model not in CAMERA_MODELS:
            raise CameraError(
                f"{self._who()}: unknown camera model {model!r}; expected one of {', '.join(CAMERA_MODELS)}"
            )
        object.__setattr__(self, "width", self._positive_int("width", self.width))
        object.__setattr__(self, "height", self._positive_int("height", self.height))
        if problem := image_size_problem(self.width, self.height):
            raise CameraError(f"{self._who()}: {problem}")
        object.__setattr__(self, "params", self._checked_params())

    def _who(self) -> str:
        return f"camera {self.camera_id}" + (f" ({self.label})" if self.label else "")

    def _positive_int(self, name: str, value: Any) -> int:
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0
        if not ok:
            raise CameraError(f"{self._who()}: expected a positive integer {name}, got {value!r}")
        return int(value)

    def _checked_params(self) -> tuple[float, ...]:
        spec = self.spec
        try:
            params = tuple(float(p) for p in self.params)
        except (TypeError, ValueError) as exc:
            raise CameraError(f"{self._who()}: params must be numbers, got {self.params!r}") from exc
        if len(params) != spec.num_params:
            raise CameraError(
                f"{self._who()}: {self.model} expects {spec.num_params} params "
                f"({', '.join(spec.param_names)}), got {len(params)}"
            )
        bad = [
            f"{self.model} param {name} must be finite, got {value}"
            for name, value in zip(spec.param_names, params, strict=True)
            if not math.isfinite(value)
        ]
        bad += [
            f"expected a positive focal length {spec.param_names[i]}, got {params[i]}"
            for i in spec.focal_idx
            if params[i] <= 0
        ]
        bad += [] if bad else self._focal_problems(params)
        if bad:  # every bad parameter, on one line
            raise CameraError(f"{self._who()}: {'; '.join(bad)}")
        self._check_model_specific(params)
        return params

    def _focal_problems(self, params: tuple[float, ...]) -> list[str]:
        """One line naming the focal lengths outside :data:`FOCAL_PER_SIDE` times the image's larger side."""
        side = max(self.width, self.height)
        low, high = FOCAL_PER_SIDE
        expected = Range(low * side, high * side)
        bad = {self.spec.param_names[i]: params[i] for i in self.spec.focal_idx}
        bad = {name: value for name, value in bad.items() if not expected.contains(value)}
        if not bad:
            return []
        return [
            f"focal length {', '.join(bad)}: expected {expected.describe()} pixels ({low:g} to {high:g} "
            f"times the image's larger side, {side}), got {', '.join(f'{v:g}' for v in bad.values())}"
        ]

    def _check_model_specific(self, params: tuple[float, ...]) -> None:
        if self.model == "EUCM" and not (0.0 <= params[4] <= 1.0 and params[5] > 0.0):
            raise CameraError(
                f"{self._who()}: EUCM expects 0 <= alpha <= 1 and beta > 0, got alpha={params[4]}, "
                f"beta={params[5]}"
            )
        if self.model == "FOV" and not abs(params[4]) < math.pi:
            raise CameraError(f"{self._who()}: FOV expects |omega| < pi, got omega={params[4]}")

    @property
    def spec(self) -> CameraModel:
        """The :class:`CameraModel` specification of this camera's model."""
        return CAMERA_MODELS[self.model]

    @property
    def model_id(self) -> int:
        return self.spec.model_id

    @property
    def is_pinhole(self) -> bool:
        """True when the model is an undistorted pinhole (also e.g. OPENCV with all-zero distortion)."""
        extra = tuple(self.params[i] for i in self.spec.extra_idx)
        if self.model == "EUCM":
            return extra[0] == 0.0
        return self.model in _PINHOLE_NAMES or (self.model in _ZERO_EXTRA_IS_PINHOLE and not any(extra))

    @property
    def focal(self) -> tuple[float, float]:
        """``(fx, fy)`` (equal for single-focal models)."""
        spec = self.spec
        return self.params[spec.focal_idx[0]], self.params[spec.focal_idx[-1]]

    @property
    def principal_point(self) -> tuple[float, float]:
        """``(cx, cy)`` in COLMAP image coordinates."""
        return self.params[self.spec.pp_idx[0]], self.params[self.spec.pp_idx[1]]

    def K(self) -> np.ndarray:
        """(3, 3) float64 intrinsic matrix ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]`` (COLMAP coordinates)."""
        (fx, fy), (cx, cy) = self.focal, self.principal_point
        return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])

    def scaled(self, factor: float) -> Camera:
        """This camera for the image downscaled by ``factor`` (e.g. 2 -> half width and height).

        A continuous image coordinate ``p`` becomes ``p / factor`` (pixel corners stay on corners, so
        pixel centres stay at ``+0.5``): focal lengths and principal point are divided by ``factor``;
        distortion parameters act on normalised coordinates and are unchanged, for every model.
        ``factor`` must divide width and height exactly.
        """
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise CameraError(f"{self._who()}: expected a positive scale factor, got {factor!r}")
        new_size = []
        for name, size in (("width", self.width), ("height", self.height)):
            scaled = size / factor
            if abs(scaled - round(scaled)) > 1e-9 or round(scaled) < 1:
                raise CameraError(
                    f"{self._who()}: downscale factor {factor} must divide the {name} {size} into an integer"
                )
            new_size.append(round(scaled))
        spec = self.spec
        pixel_idx = set(spec.focal_idx) | set(spec.pp_idx)
        params = tuple(p / factor if i in pixel_idx else p for i, p in enumerate(self.params))
        return Camera(self.model, new_size[0], new_size[1], params, self.camera_id, self.label)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict; :meth:`from_dict` restores the identical camera."""
        return {
            "model": self.model,
            "model_id": self.model_id,
            "width": self.width,
            "height": self.height,
            "params": list(self.params),
            "camera_id": self.camera_id,
            "label": self.label,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Camera:
        """Inverse of :meth:`to_dict`; ``model`` may be a name or, if absent, ``model_id`` is used."""
        label = str(d.get("label", ""))
        model = d.get("model", d.get("model_id"))
        spec = CAMERA_MODELS.get(d["model"]) if isinstance(d.get("model"), str) else None
        if spec is not None and "model_id" in d and spec.model_id != d["model_id"]:
            raise CameraError(
                f"camera {d.get('camera_id', 0)} ({label}): model {d['model']} has id "
                f"{spec.model_id}, got model_id {d['model_id']}"
            )
        return cls(
            model=model,  # type: ignore[arg-type]
            width=d.get("width"),  # type: ignore[arg-type]
            height=d.get("height"),  # type: ignore[arg-type]
            params=tuple(d.get("params", ())),
            camera_id=int(d.get("camera_id", 0)),
            label=label,
        )


def project(camera: Camera, points: torch.Tensor) -> torch.Tensor:
    """(..., 3) camera-frame points, float32 or float64 -> (..., 2) continuous COLMAP image coordinates;
    NaN where the model cannot project the point (behind a perspective camera, outside a fisheye's
    domain)."""
    return project_model(camera.spec, camera.params, points)


def unproject_valid(camera: Camera, xy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`unproject`, also returning a (...) bool mask of converged, finite rays."""
    if not xy.is_floating_point():
        raise CameraError(f"{camera._who()}: unproject expects float image coordinates, got {xy.dtype}")
    return unproject_model(camera.spec, camera.params, xy)


def unproject(camera: Camera, xy: torch.Tensor) -> torch.Tensor:
    """(..., 2) continuous COLMAP image coordinates, float32 or float64 -> (..., 3) unit camera-frame
    directions. Models without a closed-form inverse use Newton's method (COLMAP's iterative
    undistortion)."""
    return unproject_valid(camera, xy)[0]


def pixel_grid(width: int, height: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(H, W, 2) int64 integer pixels ``(x, y)`` in row-major order."""
    ys, xs = torch.meshgrid(
        torch.arange(height, device=device), torch.arange(width, device=device), indexing="ij"
    )
    return torch.stack((xs, ys), dim=-1)


def _compute_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


def _compute_lut(camera: Camera, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # Pixel centres: integer pixel (x, y) -> COLMAP image coordinates (x + 0.5, y + 0.5).
    centers = pixel_centers(pixel_grid(camera.width, camera.height, device).to(_compute_dtype(device)))
    return unproject(camera, centers).to(dtype).contiguous()


# Memoised direction tables, least recently used first, bounded by total bytes.
_LUT_CACHE: OrderedDict[tuple[Camera, torch.dtype, torch.device], torch.Tensor] = OrderedDict()
_LUT_CACHE_BYTES = 1 << 30
_LUT_LOCK = threading.Lock()


def _cached_lut(camera: Camera, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    key = (camera, dtype, device)
    with _LUT_LOCK:
        if key in _LUT_CACHE:
            _LUT_CACHE.move_to_end(key)
            return _LUT_CACHE[key]
    lut = _compute_lut(camera, dtype, device)
    with _LUT_LOCK:
        _LUT_CACHE[key] = lut
        total = sum(t.numel() * t.element_size() for t in _LUT_CACHE.values())
        while total > _LUT_CACHE_BYTES and len(_LUT_CACHE) > 1:
            _, evicted = _LUT_CACHE.popitem(last=False)
            total -= evicted.numel() * evicted.element_size()
    return lut


def direction_lut(
    camera: Camera, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """(H, W, 3): ``lut[y, x]`` is the unit camera-frame direction through pixel ``(x, y)``'s centre
    (``dtype``: float32 unless given).

    Computed in float64 (float32 on MPS) and memoised on ``(camera intrinsics, dtype, device)``
    (least recently used tables are dropped beyond 1 GiB); the returned tensor is shared, so never
    modify it in place.
    """
    # Key on the intrinsics only: cameras that differ in camera_id or label share one table.
    key = Camera(camera.model, camera.width, camera.height, camera.params)
    return _cached_lut(key, torch.float32 if dtype is None else dtype, torch.device(device))


def _camera_directions(camera: Camera, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if camera.is_pinhole:
        (fx, fy), (cx, cy) = camera.focal, camera.principal_point
        centers = pixel_centers(pixels.to(dtype))
        d = torch.stack(
            ((centers[:, 0] - cx) / fx, (centers[:, 1] - cy) / fy, torch.ones_like(centers[:, 0])), dim=-1
        )
        return d / torch.linalg.vector_norm(d, dim=-1, keepdim=True)
    lut = direction_lut(camera, dtype, pixels.device)
    return lut[pixels[:, 1], pixels[:, 0]]


def pixels_to_rays(
    camera: Camera,
    c2w: torch.Tensor | np.ndarray,
    pixels: torch.Tensor,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """World-frame rays through the centres of integer pixels.

    Args:
        c2w: (4, 4) or (N, 4, 4) camera-to-world pose(s), OpenCV camera frame, orthonormal rotation.
        pixels: (N, 2) integer pixels ``(x, y)`` inside the image.
        dtype: output dtype; default: ``c2w``'s dtype if it is a float tensor, else float32.

    Returns:
        ``(origins (N, 3), directions (N, 3) unit, z_scale (N,))`` on ``pixels``' device, where
        ``z_scale`` is the camera-frame z of the unit direction (``depth_z = t * z_scale``).
    """
    if pixels.is_floating_point() or pixels.ndim != 2 or pixels.shape[-1] != 2:
        raise CameraError(
            f"{camera._who()}: expected (N, 2) integer pixels, got {tuple(pixels.shape)} {pixels.dtype}"
        )
    if pixels.numel() and (
        bool((pixels < 0).any())
        or int(pixels[:, 0].max()) >= camera.width
        or int(pixels[:, 1].max()) >= camera.height
    ):
        raise CameraError(f"{camera._who()}: pixels outside the {camera.width}x{camera.height} image")
    if dtype is None:
        dtype = c2w.dtype if is_tensor(c2w) and c2w.is_floating_point() else torch.float32
    pose = torch.as_tensor(np.asarray(c2w) if isinstance(c2w, np.ndarray) else c2w)
    pose = pose.to(device=pixels.device, dtype=dtype)
    d_cam = _camera_directions(camera, pixels.long(), dtype)
    rot = pose[..., :3, :3]
    directions = torch.einsum("...ij,...j->...i", rot, d_cam)
    origins = pose[..., :3, 3].expand(directions.shape).contiguous()
    return origins, directions, d_cam[:, 2].contiguous()
