"""The records of a COLMAP sparse model: frozen dataclasses with value equality (numpy-aware)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from raykit.camera_models import CAMERA_MODELS
from raykit.conventions import c2w_from_colmap

if TYPE_CHECKING:
    from raykit.cameras import Camera

# The package's records (re-exported by raykit.colmap_io); FILES, POINT2D_DTYPE, SENSOR_IDS, check_camera,
# points2d_arrays and sorted_rows serve its readers and writers.
__all__ = [
    "SENSOR_TYPES",
    "ColmapCamera",
    "ColmapFrame",
    "ColmapImage",
    "ColmapPoint3D",
    "ColmapRig",
    "ColmapRigSensor",
    "Reconstruction",
]

SENSOR_TYPES: dict[int, str] = {-1: "INVALID", 0: "CAMERA", 1: "IMU"}
SENSOR_IDS = {name: sid for sid, name in SENSOR_TYPES.items()}
POINT2D_DTYPE = np.dtype([("x", "<f8"), ("y", "<f8"), ("id", "<u8")])
FILES = ("cameras", "images", "points3D", "rigs", "frames")


class _Record:
    """Value equality for frozen records whose fields may hold numpy arrays."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))  # type: ignore[arg-type]

    __hash__ = None  # type: ignore[assignment]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return a is not None and b is not None and np.array_equal(a, b)
    return bool(a == b)


@dataclass(frozen=True, eq=False)
class ColmapCamera(_Record):
    """One camera as stored by COLMAP: ``params`` in COLMAP order for ``model`` (a COLMAP model name)."""

    camera_id: int
    model: str
    width: int
    height: int
    params: tuple[float, ...]

    @property
    def model_id(self) -> int:
        return CAMERA_MODELS[self.model].model_id

    def to_camera(self, label: str = "") -> Camera:
        """The validated raykit :class:`~raykit.cameras.Camera` (raises ``CameraError`` if invalid)."""
        from raykit.cameras import Camera

        return Camera(self.model, self.width, self.height, self.params, self.camera_id, label)

    @classmethod
    def from_camera(cls, camera: Camera, camera_id: int | None = None) -> ColmapCamera:
        cid = camera.camera_id if camera_id is None else camera_id
        return cls(cid, camera.model, camera.width, camera.height, tuple(camera.params))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "params": list(self.params)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ColmapCamera:
        return cls(
            int(d["camera_id"]),
            str(d["model"]),
            int(d["width"]),
            int(d["height"]),
            tuple(float(p) for p in d["params"]),
        )


@dataclass(frozen=True, eq=False)
class ColmapImage(_Record):
    """One registered image: world-to-camera pose ``(qvec wxyz, tvec)`` and its 2-D keypoints.

    Attributes:
        points2d: (P, 2) float64 continuous COLMAP image coordinates, or None when not loaded.
        point3d_ids: (P,) int64 id of each keypoint's 3-D point, -1 for none (None when not loaded).
    """

    image_id: int
    qvec: tuple[float, float, float, float]
    tvec: tuple[float, float, float]
    camera_id: int
    name: str
    points2d: np.ndarray | None = None
    point3d_ids: np.ndarray | None = None

    def c2w(self) -> np.ndarray:
        """(4, 4) float64 camera-to-world pose (OpenCV camera frame)."""
        return c2w_from_colmap(np.asarray(self.qvec), np.asarray(self.tvec))

    @property
    def num_points2d(self) -> int:
        return 0 if self.points2d is None else len(self.points2d)


@dataclass(frozen=True, eq=False)
class ColmapPoint3D(_Record):
    """One 3-D point. ``track``: (L, 2) int64 ``(image_id, point2D_idx)`` observations."""

    point3d_id: int
    xyz: tuple[float, float, float]
    rgb: tuple[int, int, int]
    error: float
    track: np.ndarray


@dataclass(frozen=True, eq=False)
class ColmapRigSensor(_Record):
    """A non-reference rig sensor; ``(qvec, tvec)`` is sensor_from_rig, or both None when unknown."""

    sensor_type: str
    sensor_id: int
    qvec: tuple[float, float, float, float] | None = None
    tvec: tuple[float, float, float] | None = None


@dataclass(frozen=True, eq=False)
class ColmapRig(_Record):
    """A rig: its reference sensor ``(type, id)`` (None for an empty rig) and its other sensors."""

    rig_id: int
    ref_sensor: tuple[str, int] | None
    sensors: tuple[ColmapRigSensor, ...] = ()


@dataclass(frozen=True, eq=False)
class ColmapFrame(_Record):
    """A frame: rig_from_world pose ``(qvec, tvec)`` and its data ``(sensor_type, sensor_id, data_id)``."""

    frame_id: int
    rig_id: int
    qvec: tuple[float, float, float, float]
    tvec: tuple[float, float, float]
    data_ids: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True, eq=False)
class Reconstruction(_Record):
    """A COLMAP sparse model; every table is a dict by id. ``rigs``/``frames`` are empty for old models."""

    cameras: dict[int, ColmapCamera]
    images: dict[int, ColmapImage]
    points3d: dict[int, ColmapPoint3D]
    rigs: dict[int, ColmapRig]
    frames: dict[int, ColmapFrame]

    def image_by_name(self, name: str) -> ColmapImage:
        for image in self.images.values():
            if image.name == name:
                return image
        raise KeyError(name)

    def points3d_xyz(self) -> np.ndarray:
        """(P, 3) float64 positions of all 3-D points in id order."""
        xyz = [self.points3d[k].xyz for k in sorted(self.points3d)]
        return np.asarray(xyz, dtype=np.float64).reshape(-1, 3)


def check_camera(camera: ColmapCamera) -> None:
    from raykit.errors import CameraError

    spec = CAMERA_MODELS.get(camera.model)
    if spec is None or len(camera.params) != spec.num_params:
        expected = f"{spec.num_params} params" if spec else f"a model in {list(CAMERA_MODELS)}"
        raise CameraError(
            f"camera {camera.camera_id}: expected {expected}, got {camera.model} "
            f"with {len(camera.params)} params"
        )


def points2d_arrays(image: ColmapImage) -> tuple[np.ndarray, np.ndarray]:
    if image.points2d is None or image.point3d_ids is None:
        return np.zeros((0, 2)), np.zeros(0, dtype=np.int64)
    return np.asarray(image.points2d, dtype=np.float64), np.asarray(image.point3d_ids, dtype=np.int64)


def sorted_rows(table: dict[int, Any]) -> list[Any]:
    return [table[k] for k in sorted(table)]
