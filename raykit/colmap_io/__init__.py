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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raykit.colmap_io import records
from raykit.colmap_io._binary import encode_binary, read_binary
from raykit.colmap_io._text import encode_text, read_text
from raykit.colmap_io.records import *  # noqa: F403  (the records, re-exported: see __all__)
from raykit.colmap_io.records import FILES, Reconstruction
from raykit.errors import SourceError
from raykit.fileio import atomic_write_bytes
from raykit.ranges import Range, range_problems

__all__ = ["QVEC_NORM", "check_model", "find_model_files", "pose_problem", "read_model", "write_model"]
__all__ += records.__all__

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
        read = read_binary if file.suffix == ".bin" else read_text
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
        if bad := pose_problem(image.qvec, image.tvec):
            problems.append(f"{what}: {bad}")
        if image.name in names:
            problems.append(f"{what}: the same name as image {names[image.name]}")
        names.setdefault(image.name, iid)
    for fid, frame in sorted(rec.frames.items()):
        if frame.rig_id not in rec.rigs:
            problems.append(
                f"{lab['frames']}: frame {fid} refers to rig {frame.rig_id}, which is not in {lab['rigs']}"
            )
        if bad := pose_problem(frame.qvec, frame.tvec):
            problems.append(f"{lab['frames']}: frame {fid}: {bad}")
    return problems


QVEC_NORM = Range(0.5, 2.0)
"""The expected norm of a pose quaternion: COLMAP writes unit quaternions, and a text file's rounding
or another tool's stray scale is normalised away; (1e308, 1e308, 0, 0) or (1e-300, 0, 0, 0) is not a
rotation anyone wrote."""
_COORDINATE = Range()  # any finite number


def pose_problem(qvec: Sequence[float], tvec: Sequence[float]) -> str | None:
    """``expected ..., got ...`` when ``(qvec, tvec)`` is not a finite pose with a quaternion of
    :data:`QVEC_NORM`, else None."""
    values = {**{f"qvec[{i}]": (q, _COORDINATE) for i, q in enumerate(qvec)},
              **{f"tvec[{i}]": (t, _COORDINATE) for i, t in enumerate(tvec)}}  # fmt: skip
    problems = range_problems(values)
    if not problems and (bad := QVEC_NORM.problem("quaternion norm", math.hypot(*qvec))):
        problems.append(bad)
    if not problems:
        return None
    return f"expected a finite pose with a unit quaternion ({'; '.join(problems)}), got qvec={tuple(qvec)}"


def write_model(rec: Reconstruction, path: str | Path, binary: bool = True) -> list[Path]:
    """Write ``rec`` into directory ``path`` as COLMAP ``.bin`` or ``.txt`` files (sorted by id).

    ``rigs`` and ``frames`` are written only when ``rec`` has any. Each file is written atomically.
    Returns the paths written. Raises ``CameraError`` for a camera with an unknown model or a wrong
    parameter count.
    """
    tables = encode_binary(rec) if binary else encode_text(rec)
    ext = ".bin" if binary else ".txt"
    written = []
    for name, data in tables.items():
        atomic_write_bytes(Path(path) / f"{name}{ext}", data)
        written.append(Path(path) / f"{name}{ext}")
    return written
