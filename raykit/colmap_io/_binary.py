"""COLMAP's binary model files (little-endian), read and written. Layouts: see :mod:`raykit.colmap_io`."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from raykit.camera_models import CAMERA_MODELS, MODEL_NAMES_BY_ID
from raykit.colmap_io import records

__all__ = ["encode_binary", "read_binary"]


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
    if type_id not in records.SENSOR_TYPES:
        raise _Stop(
            f"{reader.path}: byte {reader.pos - 8}: {where} has unknown sensor type {type_id} "
            f"(expected one of {sorted(records.SENSOR_TYPES)})"
        )
    return records.SENSOR_TYPES[type_id]


def _read_cameras_bin(r: _BinReader) -> list[records.ColmapCamera]:
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
        out.append(records.ColmapCamera(cid, model, width, height, tuple(params)))
    return out


def _read_images_bin(r: _BinReader, load_points2d: bool) -> list[records.ColmapImage]:
    out = []
    for i in range(r.count("images", 69)):
        iid, *pose, cid = r.take("<I7dI", f"the header of image #{i}")
        name = r.cstring(f"the name of image {iid}")
        (n2d,) = r.take("<Q", f"the number of points2D of image {iid} ({name})")
        pts = r.array(records.POINT2D_DTYPE, n2d, f"{n2d} points2D of image {iid} ({name})")
        xy = ids = None
        if load_points2d:
            xy = np.stack([pts["x"], pts["y"]], -1).astype(np.float64)
            ids = pts["id"].astype(np.int64)  # 2**64 - 1 wraps to -1
        out.append(records.ColmapImage(iid, tuple(pose[:4]), tuple(pose[4:]), cid, name, xy, ids))
    return out


def _read_points3d_bin(r: _BinReader) -> list[records.ColmapPoint3D]:
    out = []
    for i in range(r.count("points3D", 51)):
        pid, x, y, z, cr, cg, cb, err, n = r.take("<Q3d3BdQ", f"point3D #{i}")
        track = r.array(np.dtype("<u4"), 2 * n, f"the track ({n} elements) of point3D {pid}")
        out.append(
            records.ColmapPoint3D(pid, (x, y, z), (cr, cg, cb), err, track.astype(np.int64).reshape(-1, 2))
        )
    return out


def _read_rigs_bin(r: _BinReader) -> list[records.ColmapRig]:
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
                records.ColmapRigSensor(
                    _sensor_name(r, t, f"rig {rid}"),
                    sid,
                    tuple(pose[:4]) if pose else None,
                    tuple(pose[4:]) if pose else None,
                )
            )
        out.append(records.ColmapRig(rid, ref, tuple(sensors)))
    return out


def _read_frames_bin(r: _BinReader) -> list[records.ColmapFrame]:
    out = []
    for i in range(r.count("frames", 68)):
        fid, rid, *pose, n = r.take("<II7dI", f"the header of frame #{i}")
        data = []
        for _ in range(n):
            t, sid, did = r.take("<iIQ", f"a data id of frame {fid}")
            data.append((_sensor_name(r, t, f"frame {fid}"), sid, did))
        out.append(records.ColmapFrame(fid, rid, tuple(pose[:4]), tuple(pose[4:]), tuple(data)))
    return out


_BIN_READERS: dict[str, Callable[[_BinReader], list[Any]]] = {
    "cameras": _read_cameras_bin,
    "points3D": _read_points3d_bin,
    "rigs": _read_rigs_bin,
    "frames": _read_frames_bin,
}


def read_binary(name: str, path: Path, load_points2d: bool, problems: list[str]) -> list[Any]:
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


def encode_binary(rec: records.Reconstruction) -> dict[str, bytes]:
    cams = [struct.pack("<Q", len(rec.cameras))]
    for c in records.sorted_rows(rec.cameras):
        records.check_camera(c)
        cams.append(
            struct.pack(f"<IiQQ{len(c.params)}d", c.camera_id, c.model_id, c.width, c.height, *c.params)
        )
    imgs = [struct.pack("<Q", len(rec.images))]
    for im in records.sorted_rows(rec.images):
        xy, ids = records.points2d_arrays(im)
        pts = np.zeros(len(xy), dtype=records.POINT2D_DTYPE)
        pts["x"], pts["y"], pts["id"] = xy[:, 0], xy[:, 1], ids.astype(np.uint64)
        imgs += [
            struct.pack("<I7dI", im.image_id, *im.qvec, *im.tvec, im.camera_id),
            im.name.encode("utf-8") + b"\0",
            struct.pack("<Q", len(pts)),
            pts.tobytes(),
        ]
    pts3 = [struct.pack("<Q", len(rec.points3d))]
    for p in records.sorted_rows(rec.points3d):
        track = np.asarray(p.track, dtype="<u4").reshape(-1)
        pts3 += [
            struct.pack("<Q3d3BdQ", p.point3d_id, *p.xyz, *p.rgb, p.error, len(track) // 2),
            track.tobytes(),
        ]
    out = {"cameras": b"".join(cams), "images": b"".join(imgs), "points3D": b"".join(pts3)}
    if rec.rigs or rec.frames:
        rigs = [struct.pack("<Q", len(rec.rigs))]
        for rig in records.sorted_rows(rec.rigs):
            n = 0 if rig.ref_sensor is None else 1 + len(rig.sensors)
            rigs.append(struct.pack("<II", rig.rig_id, n))
            if rig.ref_sensor is not None:
                rigs.append(struct.pack("<iI", records.SENSOR_IDS[rig.ref_sensor[0]], rig.ref_sensor[1]))
            for s in rig.sensors:
                has_pose = s.qvec is not None and s.tvec is not None
                rigs.append(struct.pack("<iIB", records.SENSOR_IDS[s.sensor_type], s.sensor_id, has_pose))
                if has_pose:
                    rigs.append(struct.pack("<7d", *s.qvec, *s.tvec))
        frames = [struct.pack("<Q", len(rec.frames))]
        for f in records.sorted_rows(rec.frames):
            frames.append(struct.pack("<II7dI", f.frame_id, f.rig_id, *f.qvec, *f.tvec, len(f.data_ids)))
            frames += [struct.pack("<iIQ", records.SENSOR_IDS[t], sid, did) for t, sid, did in f.data_ids]
        out |= {"rigs": b"".join(rigs), "frames": b"".join(frames)}
    return out
