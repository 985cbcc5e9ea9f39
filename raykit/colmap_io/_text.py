"""COLMAP's text model files, read and written; image names may contain spaces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from raykit.camera_models import CAMERA_MODELS
from raykit.colmap_io import records

__all__ = ["encode_text", "read_text"]


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
        if tok not in records.SENSOR_IDS:
            raise _Bad(f"expected {what} (one of {sorted(records.SENSOR_IDS)}), got {tok!r}")
        return tok

    def done(self) -> None:
        if self.i != len(self.tokens):
            raise _Bad(f"expected end of line, got {len(self.tokens) - self.i} extra values")


def _camera_txt(t: _Tokens) -> records.ColmapCamera:
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
    return records.ColmapCamera(cid, model, width, height, params)


def _image_txt(t: _Tokens, points_line: str, load_points2d: bool) -> records.ColmapImage:
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
    return records.ColmapImage(iid, pose[:4], pose[4:], cid, name, xy, ids)  # type: ignore[arg-type]


def _point3d_txt(t: _Tokens) -> records.ColmapPoint3D:
    pid, xyz = t.integer("POINT3D_ID"), t.floats(3, "X Y Z")
    rgb, err = (t.integer("R"), t.integer("G"), t.integer("B")), t.number("ERROR")
    if (len(t.tokens) - t.i) % 2:
        raise _Bad(f"point3D {pid}: expected TRACK as (IMAGE_ID, POINT2D_IDX) pairs, got an odd count")
    track = [t.integer("IMAGE_ID or POINT2D_IDX") for _ in range(len(t.tokens) - t.i)]
    return records.ColmapPoint3D(pid, xyz, rgb, err, np.array(track, dtype=np.int64).reshape(-1, 2))  # type: ignore[arg-type]


def _rig_txt(t: _Tokens) -> records.ColmapRig:
    rid, n = t.integer("RIG_ID"), t.integer("NUM_SENSORS")
    ref = (t.sensor("REF_SENSOR_TYPE"), t.integer("REF_SENSOR_ID")) if n > 0 else None
    sensors = []
    for _ in range(1, n):
        stype, sid, has_pose = t.sensor("SENSOR_TYPE"), t.integer("SENSOR_ID"), t.integer("HAS_POSE")
        pose = t.floats(7, "QW QX QY QZ TX TY TZ") if has_pose else None
        rotation, translation = (pose[:4], pose[4:]) if pose else (None, None)
        sensors.append(records.ColmapRigSensor(stype, sid, rotation, translation))  # type: ignore[arg-type]
    t.done()
    return records.ColmapRig(rid, ref, tuple(sensors))


def _frame_txt(t: _Tokens) -> records.ColmapFrame:
    fid, rid, pose = t.integer("FRAME_ID"), t.integer("RIG_ID"), t.floats(7, "QW QX QY QZ TX TY TZ")
    n = t.integer("NUM_DATA_IDS")
    data = tuple((t.sensor("SENSOR_TYPE"), t.integer("SENSOR_ID"), t.integer("DATA_ID")) for _ in range(n))
    t.done()
    return records.ColmapFrame(fid, rid, pose[:4], pose[4:], data)  # type: ignore[arg-type]


def read_text(name: str, path: Path, load_points2d: bool, problems: list[str]) -> list[Any]:
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


def _rig_line(rig: records.ColmapRig) -> str:
    if rig.ref_sensor is None:
        return f"{rig.rig_id} 0"
    parts = [f"{rig.rig_id} {1 + len(rig.sensors)} {rig.ref_sensor[0]} {rig.ref_sensor[1]}"]
    for s in rig.sensors:
        pose = f"1 {_f((*s.qvec, *s.tvec))}" if s.qvec is not None and s.tvec is not None else "0"
        parts.append(f"{s.sensor_type} {s.sensor_id} {pose}")
    return " ".join(parts)


def encode_text(rec: records.Reconstruction) -> dict[str, bytes]:
    lines: dict[str, list[str]] = {name: [] for name in records.FILES}
    for c in records.sorted_rows(rec.cameras):
        records.check_camera(c)
        lines["cameras"].append(f"{c.camera_id} {c.model} {c.width} {c.height} {_f(c.params)}")
    for im in records.sorted_rows(rec.images):
        xy, ids = records.points2d_arrays(im)
        lines["images"].append(f"{im.image_id} {_f((*im.qvec, *im.tvec))} {im.camera_id} {im.name}")
        lines["images"].append(
            " ".join(f"{x!r} {y!r} {i}" for (x, y), i in zip(xy.tolist(), ids.tolist(), strict=True))
        )
    for p in records.sorted_rows(rec.points3d):
        track = " ".join(str(v) for v in np.asarray(p.track, dtype=np.int64).reshape(-1).tolist())
        lines["points3D"].append(
            f"{p.point3d_id} {_f(p.xyz)} {' '.join(map(str, p.rgb))} {_f([p.error])} {track}"
        )
    lines["rigs"] = [_rig_line(rig) for rig in records.sorted_rows(rec.rigs)]
    for f in records.sorted_rows(rec.frames):
        data = " ".join(f"{t} {sid} {did}" for t, sid, did in f.data_ids)
        lines["frames"].append(
            f"{f.frame_id} {f.rig_id} {_f((*f.qvec, *f.tvec))} {len(f.data_ids)} {data}".rstrip()
        )
    names = records.FILES if rec.rigs or rec.frames else records.FILES[:3]
    return {
        name: (
            _HEADERS[name]
            + f"# Number of {name}: {len(lines[name]) // (2 if name == 'images' else 1)}\n"
            + "".join(line.rstrip() + "\n" for line in lines[name])
        ).encode("utf-8")
        for name in names
    }
