"""COLMAP sparse models: cameras, images (with points2D), points3D, rigs and frames, binary and text.

The formats are COLMAP's (``src/colmap/scene/reconstruction_io_{binary,text}.cc``, 3.12+), all
little-endian in binary:

* ``cameras``: ``u64 n``; per camera ``u32 id, i32 model_id, u64 width, u64 height, f64 params[]``.
* ``images``: ``u64 n``; per image ``u32 id, f64 qvec[4] (wxyz), f64 tvec[3], u32 camera_id,
  name\\0, u64 n2d, (f64 x, f64 y, u64 point3D_id)[n2d]`` (``2**64 - 1`` = no 3-D point).
  ``(qvec, tvec)`` is world-to-camera; points2D are continuous COLMAP image coordinates.
* ``points3D``: ``u64 n``; per point ``u64 id, f64 xyz[3], u8 rgb[3], f64 error, u64 len,
  (u32 image_id, u32 point2D_idx)[len]``.
* ``rigs`` (3.12+): ``u64 n``; per rig ``u32 id, u32 n_sensors``, then (if ``n_sensors > 0``) the
  reference sensor ``i32 type, u32 id``, then per other sensor ``i32 type, u32 id, u8 has_pose``
  and, if it has one, ``f64 sensor_from_rig[7]`` (qw qx qy qz tx ty tz).
* ``frames`` (3.12+): ``u64 n``; per frame ``u32 id, u32 rig_id, f64 rig_from_world[7], u32 n,
  (i32 sensor_type, u32 sensor_id, u64 data_id)[n]``.

Text files hold the same fields, one record per line (images: two lines, the second one the points2D),
``#`` comment lines. Unlike COLMAP's own text reader, an image name may contain spaces: it is the rest
of the line after the camera id (COLMAP 4.x's text reader keeps only the first word; its binary format
has no such limit). Sensor types are written as names (``CAMERA``, ``IMU``) in text and as ids in binary.

Reading collects every problem it can find (one line each, naming the file and the byte offset or line
number) and raises one :class:`~raykit.errors.SourceError`. A binary file cannot be parsed past its first
structural error, so it contributes at most one structural problem; text files report every bad line.
Camera params stay in COLMAP order and are not validated here (see :meth:`ColmapCamera.to_camera`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raykit.camera_models import CAMERA_MODELS, MODEL_NAMES_BY_ID
from raykit.conventions import c2w_from_colmap
from raykit.errors import SourceError
from raykit.fileio import atomic_write_bytes

if TYPE_CHECKING:
    from raykit.cameras import Camera

__all__ = [
    "SENSOR_TYPES",
    "ColmapCamera",
    "ColmapFrame",
    "ColmapImage",
    "ColmapPoint3D",
    "ColmapRig",
    "ColmapRigSensor",
    "Reconstruction",
    "check_model",
    "find_model_files",
    "read_model",
    "write_model",
]

SENSOR_TYPES: dict[int, str] = {-1: "INVALID", 0: "CAMERA", 1: "IMU"}
_SENSOR_IDS = {name: sid for sid, name in SENSOR_TYPES.items()}
_NO_POINT = np.uint64(2**64 - 1)
_POINT2D_DTYPE = np.dtype([("x", "<f8"), ("y", "<f8"), ("id", "<u8")])
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
        return {
            "camera_id": self.camera_id,
            "model": self.model,
            "width": self.width,
            "height": self.height,
            "params": list(self.params),
        }

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


# ---------------------------------------------------------------------------------------------- binary


class _Stop(Exception):
    """A structural problem that ends the parsing of one file."""


class _BinReader:
    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.path, self.pos = data, path, 0

    def _need(self, size: int, what: str) -> None:
        left = len(self.data) - self.pos
        if size > left:
            raise _Stop(
                f"{self.path}: truncated at byte {self.pos}: expected {what} ({size} bytes), got {left} bytes"
            )

    def take(self, layout: str, what: str) -> tuple[Any, ...]:
        import struct

        size = struct.calcsize(layout)
        self._need(size, what)
        values = struct.unpack_from(layout, self.data, self.pos)
        self.pos += size
        return values

    def array(self, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        self._need(count * dtype.itemsize, what)
        out = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.pos)
        self.pos += count * dtype.itemsize
        return out

    def cstring(self, what: str) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise _Stop(f"{self.path}: truncated at byte {self.pos}: expected {what} ending in a NUL byte")
        try:
            text = self.data[self.pos : end].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Stop(f"{self.path}: byte {self.pos}: {what} is not UTF-8 ({exc.reason})") from None
        self.pos = end + 1
        return text

    def count(self, what: str, min_size: int) -> int:
        (n,) = self.take("<Q", f"the number of {what}")
        if n * min_size > len(self.data) - self.pos:
            raise _Stop(
                f"{self.path}: truncated or corrupt at byte 8: expected >= {n * min_size} bytes "
                f"for the {n} {what} the header declares, got {len(self.data) - self.pos} bytes"
            )
        return int(n)

    def finish(self) -> None:
        if self.pos != len(self.data):
            raise _Stop(
                f"{self.path}: byte {self.pos}: expected end of file, got "
                f"{len(self.data) - self.pos} trailing bytes"
            )


def _sensor_name(reader: _BinReader, type_id: int, where: str) -> str:
    if type_id not in SENSOR_TYPES:
        raise _Stop(
            f"{reader.path}: byte {reader.pos - 8}: {where} has unknown sensor type {type_id} "
            f"(expected one of {sorted(SENSOR_TYPES)})"
        )
    return SENSOR_TYPES[type_id]


def _read_cameras_bin(r: _BinReader) -> list[ColmapCamera]:
    out = []
    for i in range(r.count("cameras", 24)):
        cid, model_id, width, height = r.take("<IiQQ", f"the header of camera #{i}")
        if model_id not in MODEL_NAMES_BY_ID:
            raise _Stop(
                f"{r.path}: byte {r.pos - 20}: camera {cid} has unknown camera model id "
                f"{model_id} (expected 0-{max(MODEL_NAMES_BY_ID)})"
            )
        model = MODEL_NAMES_BY_ID[model_id]
        k = CAMERA_MODELS[model].num_params
        params = r.take(f"<{k}d", f"{k} params of camera {cid} ({model})")
        out.append(ColmapCamera(cid, model, width, height, tuple(params)))
    return out


def _read_images_bin(r: _BinReader, load_points2d: bool) -> list[ColmapImage]:
    out = []
    for i in range(r.count("images", 69)):
        iid, *pose, cid = r.take("<I7dI", f"the header of image #{i}")
        name = r.cstring(f"the name of image {iid}")
        (n2d,) = r.take("<Q", f"the number of points2D of image {iid} ({name})")
        pts = r.array(_POINT2D_DTYPE, n2d, f"{n2d} points2D of image {iid} ({name})")
        xy = ids = None
        if load_points2d:
            xy = np.stack([pts["x"], pts["y"]], -1).astype(np.float64)
            ids = pts["id"].astype(np.int64)  # 2**64 - 1 wraps to -1
        out.append(ColmapImage(iid, tuple(pose[:4]), tuple(pose[4:]), cid, name, xy, ids))
    return out


def _read_points3d_bin(r: _BinReader) -> list[ColmapPoint3D]:
    out = []
    for i in range(r.count("points3D", 51)):
        pid, x, y, z, cr, cg, cb, err, n = r.take("<Q3d3BdQ", f"point3D #{i}")
        track = r.array(np.dtype("<u4"), 2 * n, f"the track ({n} elements) of point3D {pid}")
        out.append(ColmapPoint3D(pid, (x, y, z), (cr, cg, cb), err, track.astype(np.int64).reshape(-1, 2)))
    return out


def _read_rigs_bin(r: _BinReader) -> list[ColmapRig]:
    out = []
    for i in range(r.count("rigs", 8)):
        rid, n_sensors = r.take("<II", f"the header of rig #{i}")
        ref = None
        sensors = []
        if n_sensors > 0:
            t, sid = r.take("<iI", f"the reference sensor of rig {rid}")
            ref = (_sensor_name(r, t, f"rig {rid}"), sid)
        for j in range(1, n_sensors):
            t, sid, has_pose = r.take("<iIB", f"sensor #{j} of rig {rid}")
            pose = r.take("<7d", f"the pose of sensor {sid} of rig {rid}") if has_pose else None
            sensors.append(
                ColmapRigSensor(
                    _sensor_name(r, t, f"rig {rid}"),
                    sid,
                    tuple(pose[:4]) if pose else None,
                    tuple(pose[4:]) if pose else None,
                )
            )
        out.append(ColmapRig(rid, ref, tuple(sensors)))
    return out


def _read_frames_bin(r: _BinReader) -> list[ColmapFrame]:
    out = []
    for i in range(r.count("frames", 68)):
        fid, rid, *pose, n = r.take("<II7dI", f"the header of frame #{i}")
        data = []
        for _ in range(n):
            t, sid, did = r.take("<iIQ", f"a data id of frame {fid}")
            data.append((_sensor_name(r, t, f"frame {fid}"), sid, did))
        out.append(ColmapFrame(fid, rid, tuple(pose[:4]), tuple(pose[4:]), tuple(data)))
    return out


# ------------------------------------------------------------------------------------------------ text


class _Bad(Exception):
    """A problem confined to one text line."""


class _Tokens:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.i = tokens, 0

    def _next(self, what: str) -> str:
        if self.i >= len(self.tokens):
            raise _Bad(f"expected {what}, got end of line")
        self.i += 1
        return self.tokens[self.i - 1]

    def integer(self, what: str) -> int:
        tok = self._next(what)
        try:
            return int(tok)
        except ValueError:
            raise _Bad(f"expected {what} (an integer), got {tok!r}") from None

    def number(self, what: str) -> float:
        tok = self._next(what)
        try:
            return float(tok)
        except ValueError:
            raise _Bad(f"expected {what} (a number), got {tok!r}") from None

    def floats(self, n: int, what: str) -> tuple[float, ...]:
        return tuple(self.number(what) for _ in range(n))

    def sensor(self, what: str) -> str:
        tok = self._next(what)
        if tok not in _SENSOR_IDS:
            raise _Bad(f"expected {what} (one of {sorted(_SENSOR_IDS)}), got {tok!r}")
        return tok

    def done(self) -> None:
        if self.i != len(self.tokens):
            raise _Bad(f"expected end of line, got {len(self.tokens) - self.i} extra values")


def _camera_txt(t: _Tokens) -> ColmapCamera:
    cid, model, width, height = (
        t.integer("CAMERA_ID"),
        t._next("MODEL"),
        t.integer("WIDTH"),
        t.integer("HEIGHT"),
    )
    if model not in CAMERA_MODELS:
        raise _Bad(f"camera {cid} has unknown camera model {model!r} (expected one of {list(CAMERA_MODELS)})")
    params = tuple(t.number("PARAMS") for _ in range(len(t.tokens) - t.i))
    k = CAMERA_MODELS[model].num_params
    if len(params) != k:
        raise _Bad(f"camera {cid} ({model}): expected {k} params, got {len(params)}")
    return ColmapCamera(cid, model, width, height, params)


def _image_txt(t: _Tokens, points_line: str, load_points2d: bool) -> ColmapImage:
    iid, pose, cid = t.integer("IMAGE_ID"), t.floats(7, "QW QX QY QZ TX TY TZ"), t.integer("CAMERA_ID")
    name = t._next("NAME")
    xy = ids = None
    if load_points2d:
        values = points_line.split()
        if len(values) % 3:
            raise _Bad(
                f"image {iid}: expected POINTS2D as (X, Y, POINT3D_ID) triples on the next line, "
                f"got {len(values)} values"
            )
        try:
            arr = np.array(values, dtype=np.float64).reshape(-1, 3)
        except ValueError:
            raise _Bad(
                f"image {iid}: expected numbers in the POINTS2D line, got {points_line[:60]!r}"
            ) from None
        xy, ids = arr[:, :2].copy(), arr[:, 2].astype(np.int64)
    return ColmapImage(iid, pose[:4], pose[4:], cid, name, xy, ids)  # type: ignore[arg-type]


def _point3d_txt(t: _Tokens) -> ColmapPoint3D:
    pid, xyz = t.integer("POINT3D_ID"), t.floats(3, "X Y Z")
    rgb, err = (t.integer("R"), t.integer("G"), t.integer("B")), t.number("ERROR")
    if (len(t.tokens) - t.i) % 2:
        raise _Bad(f"point3D {pid}: expected TRACK as (IMAGE_ID, POINT2D_IDX) pairs, got an odd count")
    track = [t.integer("IMAGE_ID or POINT2D_IDX") for _ in range(len(t.tokens) - t.i)]
    return ColmapPoint3D(pid, xyz, rgb, err, np.array(track, dtype=np.int64).reshape(-1, 2))  # type: ignore[arg-type]


def _rig_txt(t: _Tokens) -> ColmapRig:
    rid, n = t.integer("RIG_ID"), t.integer("NUM_SENSORS")
    ref = (t.sensor("REF_SENSOR_TYPE"), t.integer("REF_SENSOR_ID")) if n > 0 else None
    sensors = []
    for _ in range(1, n):
        stype, sid, has_pose = t.sensor("SENSOR_TYPE"), t.integer("SENSOR_ID"), t.integer("HAS_POSE")
        pose = t.floats(7, "QW QX QY QZ TX TY TZ") if has_pose else None
        sensors.append(ColmapRigSensor(stype, sid, pose[:4] if pose else None, pose[4:] if pose else None))  # type: ignore[arg-type]
    t.done()
    return ColmapRig(rid, ref, tuple(sensors))


def _frame_txt(t: _Tokens) -> ColmapFrame:
    fid, rid, pose = t.integer("FRAME_ID"), t.integer("RIG_ID"), t.floats(7, "QW QX QY QZ TX TY TZ")
    n = t.integer("NUM_DATA_IDS")
    data = tuple((t.sensor("SENSOR_TYPE"), t.integer("SENSOR_ID"), t.integer("DATA_ID")) for _ in range(n))
    t.done()
    return ColmapFrame(fid, rid, pose[:4], pose[4:], data)  # type: ignore[arg-type]


def _read_text(name: str, path: Path, load_points2d: bool, problems: list[str]) -> list[Any]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{path}: cannot read: {exc}")
        return []
    parse = {"cameras": _camera_txt, "points3D": _point3d_txt, "rigs": _rig_txt, "frames": _frame_txt}
    out: list[Any] = []
    i = 0
    while i < len(lines):
        line, lineno = lines[i].strip(), i + 1
        i += 1
        if not line or line.startswith("#"):
            continue
        try:
            if name == "images":
                points_line = lines[i] if i < len(lines) else ""
                i += 1  # COLMAP writes the POINTS2D line right after, even when it is empty
                out.append(_image_txt(_Tokens(line.split(maxsplit=9)), points_line, load_points2d))
            elif name == "cameras":
                out.append(_camera_txt(_Tokens(line.split())))
            else:
                out.append(parse[name](_Tokens(line.split())))
        except _Bad as exc:
            problems.append(f"{path}:{lineno}: {exc}")
    return out


# ---------------------------------------------------------------------------------------------- reading

_ID_FIELD = {
    "cameras": "camera_id",
    "images": "image_id",
    "points3D": "point3d_id",
    "rigs": "rig_id",
    "frames": "frame_id",
}


def find_model_files(path: str | Path) -> dict[str, Path]:
    """Files of the model in directory ``path`` by table name; ``.bin`` is preferred over ``.txt``."""
    found = {}
    for name in FILES:
        for ext in (".bin", ".txt"):
            if (Path(path) / f"{name}{ext}").is_file():
                found[name] = Path(path) / f"{name}{ext}"
                break
    return found


_BIN_READERS: dict[str, Callable[[_BinReader], list[Any]]] = {
    "cameras": _read_cameras_bin,
    "points3D": _read_points3d_bin,
    "rigs": _read_rigs_bin,
    "frames": _read_frames_bin,
}


def _read_binary(name: str, path: Path, load_points2d: bool, problems: list[str]) -> list[Any]:
    try:
        reader = _BinReader(path.read_bytes(), path)
    except OSError as exc:
        problems.append(f"{path}: cannot read: {exc}")
        return []
    try:
        if name == "images":
            rows: list[Any] = _read_images_bin(reader, load_points2d)
        else:
            rows = _BIN_READERS[name](reader)
        reader.finish()
    except _Stop as exc:
        problems.append(str(exc))
        return []
    return rows


def _index(rows: list[Any], name: str, path: Path, problems: list[str]) -> dict[int, Any]:
    table: dict[int, Any] = {}
    for row in rows:
        key = getattr(row, _ID_FIELD[name])
        if key in table:
            problems.append(f"{path}: duplicate {_ID_FIELD[name]} {key}")
        table[key] = row
    return table


def read_model(path: str | Path, *, load_points2d: bool = True, validate: bool = True) -> Reconstruction:
    """Read the COLMAP model in directory ``path`` (binary or text, per file; rigs/frames if present).

    Args:
        path: a model directory such as ``sparse/0`` holding ``cameras``, ``images`` and optionally
            ``points3D``, ``rigs`` and ``frames`` (``.bin`` or ``.txt``).
        load_points2d: False skips the keypoints (``ColmapImage.points2d`` is None), for speed.
        validate: also check cross references and poses (see :func:`check_model`).

    Raises:
        SourceError: listing every problem found, each naming the file and byte offset or line.
    """
    root = Path(path)
    if not root.is_dir():
        raise SourceError(
            f"{root}: expected a COLMAP model directory, got {'a file' if root.exists() else 'nothing'}"
        )
    files = find_model_files(root)
    problems = [
        f"{root}: expected {name}.bin or {name}.txt, found neither"
        for name in ("cameras", "images")
        if name not in files
    ]
    if ("rigs" in files) != ("frames" in files):
        have, lack = ("rigs", "frames") if "rigs" in files else ("frames", "rigs")
        problems.append(f"{root}: found {files[have].name} but no {lack}.bin or {lack}.txt")
    tables: dict[str, dict[int, Any]] = {name: {} for name in FILES}
    for name, file in files.items():
        read = _read_binary if file.suffix == ".bin" else _read_text
        tables[name] = _index(read(name, file, load_points2d, problems), name, file, problems)
    rec = Reconstruction(
        tables["cameras"], tables["images"], tables["points3D"], tables["rigs"], tables["frames"]
    )
    if validate and not problems:
        problems += check_model(rec, {name: str(file) for name, file in files.items()})
    if problems:
        raise SourceError(problems)
    return rec


def check_model(rec: Reconstruction, labels: dict[str, str] | None = None) -> list[str]:
    """Problems in ``rec`` beyond syntax: dangling camera/rig ids, duplicate names, bad poses.

    Args:
        labels: table name -> file name used in the messages (defaults to the table name).
    """
    lab = {name: name for name in FILES} | (labels or {})
    problems = []
    names: dict[str, int] = {}
    for iid, image in sorted(rec.images.items()):
        what = f"{lab['images']}: image {iid} ({image.name})"
        if image.camera_id not in rec.cameras:
            problems.append(f"{what}: refers to camera {image.camera_id}, which is not in {lab['cameras']}")
        if not _valid_pose(image.qvec, image.tvec):
            problems.append(
                f"{what}: expected a finite pose with a non-zero quaternion, "
                f"got qvec={image.qvec}, tvec={image.tvec}"
            )
        if image.name in names:
            problems.append(f"{what}: the same name as image {names[image.name]}")
        names.setdefault(image.name, iid)
    for fid, frame in sorted(rec.frames.items()):
        if frame.rig_id not in rec.rigs:
            problems.append(
                f"{lab['frames']}: frame {fid} refers to rig {frame.rig_id}, which is not in {lab['rigs']}"
            )
        if not _valid_pose(frame.qvec, frame.tvec):
            problems.append(
                f"{lab['frames']}: frame {fid}: expected a finite pose with a non-zero "
                f"quaternion, got qvec={frame.qvec}, tvec={frame.tvec}"
            )
    return problems


def _valid_pose(qvec: tuple[float, ...], tvec: tuple[float, ...]) -> bool:
    values = (*qvec, *tvec)
    return all(math.isfinite(v) for v in values) and math.fsum(q * q for q in qvec) > 1e-12


# ---------------------------------------------------------------------------------------------- writing


def _check_camera(camera: ColmapCamera) -> None:
    from raykit.errors import CameraError

    spec = CAMERA_MODELS.get(camera.model)
    if spec is None or len(camera.params) != spec.num_params:
        expected = f"{spec.num_params} params" if spec else f"a model in {list(CAMERA_MODELS)}"
        raise CameraError(
            f"camera {camera.camera_id}: expected {expected}, got {camera.model} "
            f"with {len(camera.params)} params"
        )


def _points2d(image: ColmapImage) -> tuple[np.ndarray, np.ndarray]:
    if image.points2d is None or image.point3d_ids is None:
        return np.zeros((0, 2)), np.zeros(0, dtype=np.int64)
    return np.asarray(image.points2d, dtype=np.float64), np.asarray(image.point3d_ids, dtype=np.int64)


def _sorted(table: dict[int, Any]) -> list[Any]:
    return [table[k] for k in sorted(table)]


def _binary_tables(rec: Reconstruction) -> dict[str, bytes]:
    import struct

    cams = [struct.pack("<Q", len(rec.cameras))]
    for c in _sorted(rec.cameras):
        _check_camera(c)
        cams.append(
            struct.pack(f"<IiQQ{len(c.params)}d", c.camera_id, c.model_id, c.width, c.height, *c.params)
        )
    imgs = [struct.pack("<Q", len(rec.images))]
    for im in _sorted(rec.images):
        xy, ids = _points2d(im)
        pts = np.zeros(len(xy), dtype=_POINT2D_DTYPE)
        pts["x"], pts["y"], pts["id"] = xy[:, 0], xy[:, 1], ids.astype(np.uint64)
        imgs += [
            struct.pack("<I7dI", im.image_id, *im.qvec, *im.tvec, im.camera_id),
            im.name.encode("utf-8") + b"\0",
            struct.pack("<Q", len(pts)),
            pts.tobytes(),
        ]
    pts3 = [struct.pack("<Q", len(rec.points3d))]
    for p in _sorted(rec.points3d):
        track = np.asarray(p.track, dtype="<u4").reshape(-1)
        pts3 += [
            struct.pack("<Q3d3BdQ", p.point3d_id, *p.xyz, *p.rgb, p.error, len(track) // 2),
            track.tobytes(),
        ]
    out = {"cameras": b"".join(cams), "images": b"".join(imgs), "points3D": b"".join(pts3)}
    if rec.rigs or rec.frames:
        rigs = [struct.pack("<Q", len(rec.rigs))]
        for rig in _sorted(rec.rigs):
            n = 0 if rig.ref_sensor is None else 1 + len(rig.sensors)
            rigs.append(struct.pack("<II", rig.rig_id, n))
            if rig.ref_sensor is not None:
                rigs.append(struct.pack("<iI", _SENSOR_IDS[rig.ref_sensor[0]], rig.ref_sensor[1]))
            for s in rig.sensors:
                has_pose = s.qvec is not None and s.tvec is not None
                rigs.append(struct.pack("<iIB", _SENSOR_IDS[s.sensor_type], s.sensor_id, has_pose))
                if has_pose:
                    rigs.append(struct.pack("<7d", *s.qvec, *s.tvec))
        frames = [struct.pack("<Q", len(rec.frames))]
        for f in _sorted(rec.frames):
            frames.append(struct.pack("<II7dI", f.frame_id, f.rig_id, *f.qvec, *f.tvec, len(f.data_ids)))
            frames += [struct.pack("<iIQ", _SENSOR_IDS[t], sid, did) for t, sid, did in f.data_ids]
        out |= {"rigs": b"".join(rigs), "frames": b"".join(frames)}
    return out


def _f(values: Any) -> str:
    """Floats as the shortest text that reads back to the same float64."""
    return " ".join(repr(float(v)) for v in values)


_HEADERS = {
    "cameras": "# Camera list with one line of data per camera:\n"
    "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n",
    "images": "# Image list with two lines of data per image:\n"
    "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n#   POINTS2D[] as (X, Y, POINT3D_ID)\n",
    "points3D": "# 3D point list with one line of data per point:\n"
    "#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)\n",
    "rigs": "# Rig calib list with one line of data per calib:\n#   RIG_ID, NUM_SENSORS, REF_SENSOR_TYPE, "
    "REF_SENSOR_ID, SENSORS[] as (SENSOR_TYPE, SENSOR_ID, HAS_POSE, [QW, QX, QY, QZ, TX, TY, TZ])\n",
    "frames": "# Frame list with one line of data per frame:\n#   FRAME_ID, RIG_ID, "
    "RIG_FROM_WORLD[QW, QX, QY, QZ, TX, TY, TZ], NUM_DATA_IDS, "
    "DATA_IDS[] as (SENSOR_TYPE, SENSOR_ID, DATA_ID)\n",
}


def _rig_line(rig: ColmapRig) -> str:
    if rig.ref_sensor is None:
        return f"{rig.rig_id} 0"
    parts = [f"{rig.rig_id} {1 + len(rig.sensors)} {rig.ref_sensor[0]} {rig.ref_sensor[1]}"]
    for s in rig.sensors:
        pose = f"1 {_f((*s.qvec, *s.tvec))}" if s.qvec is not None and s.tvec is not None else "0"
        parts.append(f"{s.sensor_type} {s.sensor_id} {pose}")
    return " ".join(parts)


def _text_tables(rec: Reconstruction) -> dict[str, bytes]:
    lines: dict[str, list[str]] = {name: [] for name in FILES}
    for c in _sorted(rec.cameras):
        _check_camera(c)
        lines["cameras"].append(f"{c.camera_id} {c.model} {c.width} {c.height} {_f(c.params)}")
    for im in _sorted(rec.images):
        xy, ids = _points2d(im)
        lines["images"].append(f"{im.image_id} {_f((*im.qvec, *im.tvec))} {im.camera_id} {im.name}")
        lines["images"].append(
            " ".join(f"{x!r} {y!r} {i}" for (x, y), i in zip(xy.tolist(), ids.tolist(), strict=True))
        )
    for p in _sorted(rec.points3d):
        track = " ".join(str(v) for v in np.asarray(p.track, dtype=np.int64).reshape(-1).tolist())
        lines["points3D"].append(
            f"{p.point3d_id} {_f(p.xyz)} {' '.join(map(str, p.rgb))} {_f([p.error])} {track}"
        )
    lines["rigs"] = [_rig_line(rig) for rig in _sorted(rec.rigs)]
    for f in _sorted(rec.frames):
        data = " ".join(f"{t} {sid} {did}" for t, sid, did in f.data_ids)
        lines["frames"].append(
            f"{f.frame_id} {f.rig_id} {_f((*f.qvec, *f.tvec))} {len(f.data_ids)} {data}".rstrip()
        )
    names = FILES if rec.rigs or rec.frames else FILES[:3]
    return {
        name: (
            _HEADERS[name]
            + f"# Number of {name}: {len(lines[name]) // (2 if name == 'images' else 1)}\n"
            + "".join(line.rstrip() + "\n" for line in lines[name])
        ).encode("utf-8")
        for name in names
    }


def write_model(rec: Reconstruction, path: str | Path, binary: bool = True) -> list[Path]:
    """Write ``rec`` into directory ``path`` as COLMAP ``.bin`` or ``.txt`` files (sorted by id).

    ``rigs`` and ``frames`` are written only when ``rec`` has any. Each file is written atomically.
    Returns the paths written. Raises ``CameraError`` for a camera with an unknown model or a wrong
    parameter count.
    """
    tables = _binary_tables(rec) if binary else _text_tables(rec)
    ext = ".bin" if binary else ".txt"
    written = []
    for name, data in tables.items():
        atomic_write_bytes(Path(path) / f"{name}{ext}", data)
        written.append(Path(path) / f"{name}{ext}")
    return written
