"""COLMAP sparse reconstructions (binary or text; rigs/frames files of COLMAP 3.12+ accepted).

Where things are looked for:

* the model: ``src`` itself, ``src/sparse/0``, ``src/sparse`` (the first with a ``cameras.bin`` or
  ``cameras.txt``);
* the images: the ``images`` argument (``--images``), else ``src/images``, ``<model>/../../images``,
  ``<model>/../images``, ``<model>/images``, the model folder (the first existing folder). Image names
  are COLMAP's, relative to that folder (they may contain spaces and subfolders).

Poses are COLMAP's world-to-camera ``(qvec, tvec)`` of each image, turned into OpenCV camera-to-world.
Views are ordered by image name.

Near/far per image, from ``points3D`` (the rule of LLFF's ``imgs2poses``): the depths (camera-frame
z) of the 3-D points the image observes, ``near`` = their 0.1th percentile and ``far`` = their 99.9th
percentile (positive depths only). An image observing fewer than 3 points uses every point in front of
it; a model without points uses the box around the camera centres (see
:func:`raykit.converters.ngp.box_near_far`).

The points themselves (position, colour, error, track length) go into the store as
``points3D.parquet``, mapped into the store's world frame (:mod:`raykit.store.schema`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from raykit.colmap_io import (
    ColmapImage,
    Reconstruction,
    check_model,
    find_model_files,
    pose_problem,
    read_model,
)
from raykit.converters.base import Capture, Problems, SourceView, add_listed
from raykit.converters.ngp import box_near_far
from raykit.converters.paths import ImageRoots, shown_name
from raykit.errors import CameraError, SourceError
from raykit.store import SparsePoints

__all__ = ["NEAR_PERCENTILE", "find_colmap_model", "image_near_far", "parse_colmap", "sparse_points"]

NEAR_PERCENTILE, FAR_PERCENTILE = 0.1, 99.9
_MIN_POINTS = 3


def find_colmap_model(src: Path) -> Path | None:
    """The folder holding ``cameras.{bin,txt}``: ``src``, ``src/sparse/0`` or ``src/sparse``."""
    for candidate in (src, src / "sparse" / "0", src / "sparse"):
        if (candidate / "cameras.bin").is_file() or (candidate / "cameras.txt").is_file():
            return candidate
    return None


def _find_images_dir(src: Path, model: Path, images: Path | None) -> Path:
    if images is not None:
        if not images.is_dir():
            raise SourceError(f"{images}: images folder not found")
        return images
    for candidate in (
        src / "images",
        model.parent.parent / "images",
        model.parent / "images",
        model / "images",
    ):
        if candidate.is_dir():
            return candidate
    return model


def image_near_far(c2w: np.ndarray, points: np.ndarray) -> tuple[float, float] | None:
    """Percentile near/far of ``points`` (P, 3) seen from the camera ``c2w`` (4, 4); None if < 3 in front."""
    if len(points) == 0:
        return None
    depth = (points - c2w[:3, 3]) @ c2w[:3, 2]
    depth = depth[depth > 0]
    if len(depth) < _MIN_POINTS:
        return None
    near, far = np.percentile(depth, [NEAR_PERCENTILE, FAR_PERCENTILE])
    return float(near), float(max(far, near * 1.001))


def _observed(image: ColmapImage, point_index: dict[int, int], xyz: np.ndarray) -> np.ndarray:
    if image.point3d_ids is None:
        return xyz[:0]
    rows = [point_index[int(i)] for i in image.point3d_ids if int(i) in point_index]
    return xyz[rows]


def _view(
    image: ColmapImage, rec: Reconstruction, cameras_file: Path, images_dir: Path, bad: dict[int, list[str]]
) -> SourceView | None:
    """The view of one image; problems check_model already reported (ids, poses) just skip it, and an
    invalid camera is noted in ``bad`` (camera id -> problem line, then the names of its images)."""
    col_cam = rec.cameras.get(image.camera_id)
    if col_cam is None or pose_problem(image.qvec, image.tvec) is not None:
        return None
    try:
        camera = col_cam.to_camera(label=str(cameras_file))
    except CameraError as exc:
        bad.setdefault(image.camera_id, [str(exc)]).append(image.name)
        return None
    name = image.name.replace("\\", "/")  # COLMAP run on Windows may store backslashes
    metadata = rig_metadata(image, rec)
    return SourceView(name, camera, image.c2w(), images_dir / name, metadata=metadata)


def rig_metadata(image: ColmapImage, rec: Reconstruction) -> dict[str, Any]:
    """``{"colmap": {image_id, camera_id, rig_id, frame_id, sensor_id}}`` of an image taken by a rig
    of several sensors (COLMAP 3.12+ rigs and frames: the frame whose data holds the image); ``{}``
    for the trivial one-camera rig every model has (nothing to tell)."""
    for frame in rec.frames.values():
        for sensor_type, sensor_id, data_id in frame.data_ids:
            if sensor_type != "CAMERA" or data_id != image.image_id:
                continue
            rig = rec.rigs.get(frame.rig_id)
            if rig is None or not rig.sensors:
                return {}
            ids = {"image_id": image.image_id, "camera_id": image.camera_id, "rig_id": frame.rig_id}
            return {"colmap": {**ids, "frame_id": frame.frame_id, "sensor_id": sensor_id}}
    return {}


def _some(names: list[str], n: int = 3) -> str:
    """The first ``n`` names, then how many more."""
    more = f", ... (+{len(names) - n})" if len(names) > n else ""
    return ", ".join(repr(name) for name in names[:n]) + more


def _with_bounds(
    views: list[SourceView], images: list[ColmapImage], rec: Reconstruction
) -> tuple[list[SourceView], list[str]]:
    """Views with near/far, and the names of those that fell back to the camera-centre box."""
    ids = sorted(rec.points3d)
    xyz = rec.points3d_xyz()
    point_index = {pid: row for row, pid in enumerate(ids)}
    centres = np.stack([v.c2w[:3, 3] for v in views])
    lo, hi = centres.min(axis=0), centres.max(axis=0)
    centre, half = (lo + hi) / 2, np.maximum(hi - lo, 1.0)
    out, boxed = [], []
    for view, image in zip(views, images, strict=True):
        bounds = image_near_far(view.c2w, _observed(image, point_index, xyz))
        bounds = bounds or image_near_far(view.c2w, xyz)
        if bounds is None:
            bounds = box_near_far(centre, half, view.c2w[:3, 3])
            boxed.append(view.name)
        out.append(replace(view, near=bounds[0], far=bounds[1]))
    return out, boxed


def _box_warning(model: Path, rec: Reconstruction, views: list[SourceView], boxed: list[str]) -> str:
    """The warning for images whose near/far come from the camera-centre box, with the values used."""
    used = [v for v in views if v.name in set(boxed)]
    near = min(float(v.near or 0.0) for v in used)
    far = max(float(v.far or 0.0) for v in used)
    why = "the model has no 3-D points" if not rec.points3d else "fewer than 3 of its 3-D points lie in front"
    return (
        f"{model}: {why} for {len(used)} of {len(views)} images; their near/far come from the box around "
        f"the camera centres (near {near:.4g} to far {far:.4g}, source units); pass --near and --far "
        "(near=, far=) to set them"
    )


def parse_colmap(
    src: Path, *, images: Path | None = None, skip_missing: bool = False, allow_outside: Sequence[Path] = ()
) -> Capture:
    """Parse a COLMAP project or model folder.

    Image files must lie in the images folder or one of ``allow_outside`` (see
    :mod:`raykit.converters.paths`).
    """
    model = find_colmap_model(src)
    if model is None:
        raise SourceError(f"{src}: no COLMAP model (cameras.bin/.txt in it, sparse/0 or sparse)")
    images_dir = _find_images_dir(src, model, images)
    rec = read_model(model, validate=False)
    problems = Problems()
    files = find_model_files(model)
    problems.extend(check_model(rec, {name: str(file) for name, file in files.items()}))
    by_name = {image.name: image for image in rec.images.values()}
    views, used, missing = [], [], []
    roots = ImageRoots(images_dir, allow_outside)
    bad_cameras: dict[int, list[str]] = {}
    for name in sorted(by_name):
        view = _view(by_name[name], rec, files["cameras"], images_dir, bad_cameras)
        outside = None if view is None else roots.outside(view.image_path, f"{model}: image {name!r}", name)
        if outside:
            problems.add(outside)
        elif view is not None and not view.image_path.is_file():
            missing.append(name)
        elif view is not None:
            views.append(view)
            used.append(by_name[name])
    if not skip_missing:
        add_listed(
            problems,
            missing,
            lambda name: f"{images_dir / name}: image of COLMAP image {shown_name(name)} not found",
            lambda rest: (
                f"{images_dir}: {len(rest):,} more images of COLMAP images not found "
                f"({shown_name(rest[0])} to {shown_name(rest[-1])}; {len(missing):,} in all)"
            ),
        )
    for line, *names in bad_cameras.values():  # one line per camera, not per image
        problems.add(f"{line} (used by {len(names)} image(s): {_some(names)})")
    if not by_name:
        problems.add(f"{model}: the model has no registered images")
    problems.raise_if_fatal(views)
    params = {
        "model": str(model),
        "images": str(images_dir),
        "skipped_missing": missing if skip_missing else [],
    }
    views, boxed = _with_bounds(views, used, rec)
    assumed = [("bounds", _box_warning(model, rec, views, boxed))] if boxed else []
    return Capture(
        "colmap", views, points=rec.points3d_xyz(), sparse=sparse_points(rec), problems=problems.lines,
        params=params, assumed=assumed,
    )  # fmt: skip


def sparse_points(rec: Reconstruction) -> SparsePoints:
    """The model's ``points3D`` in id order (source frame): position, colour, error, track length."""
    rows = [rec.points3d[k] for k in sorted(rec.points3d)]
    return SparsePoints(
        np.asarray([p.point3d_id for p in rows], dtype=np.int64),
        rec.points3d_xyz(),
        np.asarray([p.rgb for p in rows], dtype=np.uint8).reshape(-1, 3),
        np.asarray([p.error for p in rows], dtype=np.float64),
        np.asarray([len(p.track) for p in rows], dtype=np.int64),
    )
