"""instant-ngp / nerfstudio ``transforms.json`` captures.

Intrinsics come from the top level and may be overridden per frame by the same keys (read by
:mod:`raykit.camera_json`; ``w``, ``h`` default to the image file's size). Poses are OpenGL
camera-to-world (``transform_matrix``), converted to OpenCV; a rotation scaled uniformly (a
similarity, as some nerfstudio exports write) has its scale taken out, with one warning and
``rotation_scale`` in the store's ``source`` record. ``file_path`` may use Windows separators and may
lack an extension. Frames whose image is missing are all listed in one error unless ``skip_missing``.

Per frame, nerfstudio's ``mask_path`` and ``depth_file_path`` (relative to the JSON file, inside the
capture) become the store's ``mask`` and ``depth`` components (every frame has one or none does);
depth values are multiplied by ``depth_unit_scale_factor`` (top level or per frame; default 1e-3,
nerfstudio's: millimetres) to give metres. Every other per-frame key raykit does not interpret is
kept as the frame's metadata (``RayStore.frame_metadata``), but ``time`` (nerfstudio's dynamic
captures; D-NeRF's, in [0, 1], through :mod:`raykit.converters.blender`): the view's time
(``raykit.store.FrameTime``), a finite number on every frame or on none.

Near/far: instant-ngp maps source points ``p`` into its unit cube by ``p * scale + offset`` (after
cycling axes; defaults ``scale = 0.33``, ``offset = 0.5``) and the scene occupies a cube ``aabb_scale``
times larger around the cube's centre. Without ``aabb_scale`` (nerfstudio) the box is the camera
centres' bounding box doubled about its centre. Per view, ``far`` is the distance to the farthest box
corner and ``near`` the distance to the box (at least 1% of the box half-size).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from raykit.camera_json import INTRINSIC_KEYS, camera_from_intrinsics, image_size
from raykit.conventions import opengl_to_opencv_c2w
from raykit.converters.base import (
    Capture,
    Problems,
    SourceView,
    add_listed,
    check_rigid,
    check_similarity,
    load_json,
    relative_name,
    resolve_image,
)
from raykit.converters.images import used_size
from raykit.converters.paths import ImageRoots, shown_name
from raykit.errors import CameraError, SourceError
from raykit.ranges import Range, range_problems

__all__ = ["INTRINSIC_KEYS", "box_near_far", "camera_from_intrinsics", "parse_ngp", "scale_note"]


def box_near_far(center: np.ndarray, half: np.ndarray, origin: np.ndarray) -> tuple[float, float]:
    """Near/far of a camera at ``origin`` (3,) for the box ``center`` (3,) +- ``half`` (3,)."""
    outside = np.maximum(np.abs(origin - center) - half, 0.0)
    near = max(float(np.linalg.norm(outside)), 0.01 * float(np.max(half)))
    far = float(np.linalg.norm(np.abs(origin - center) + half))
    return near, max(far, 2 * near)


def _bounded(view: SourceView, centre: np.ndarray, half: np.ndarray) -> SourceView:
    near, far = box_near_far(centre, half, view.c2w[:3, 3])
    return replace(view, near=near, far=far)


_BOX_RANGES = {
    "aabb_scale": Range(0, 1e6, low_open=True),  # instant-ngp: a power of two, 1 to 128
    "scale": Range(0, 1e6, low_open=True),  # source units -> ngp's unit cube; default 0.33
}
"""Expected ranges of the numbers that place instant-ngp's scene box (``offset`` is any finite number)."""


def _box_problems(meta: Mapping[str, Any]) -> list[str]:
    """Every box number of ``meta`` outside its range (``aabb_scale`` 0 or -4 would clip the whole scene
    out of the rays' near/far; ``scale`` 0 divides by zero)."""
    problems = range_problems({key: (meta[key], r) for key, r in _BOX_RANGES.items() if key in meta})
    offset = meta.get("offset", 0.5)
    values = offset if isinstance(offset, list) and len(offset) == 3 else [offset]
    if not isinstance(offset, list | int | float) or (isinstance(offset, list) and len(offset) != 3):
        problems.append(f"offset: expected one number or three, got {offset!r}")
    else:
        problems += range_problems({f"offset[{i}]": (v, Range()) for i, v in enumerate(values)})
    return problems


def _ngp_box(meta: Mapping[str, Any], centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if "aabb_scale" not in meta:
        lo, hi = centres.min(axis=0), centres.max(axis=0)
        return (lo + hi) / 2, np.maximum(hi - lo, 1.0)
    scale = float(meta.get("scale", 0.33))
    offset = np.broadcast_to(np.asarray(meta.get("offset", 0.5), dtype=np.float64), (3,))
    # instant-ngp cycles axes: ngp (x, y, z) = source (y, z, x).
    centre_ngp = (0.5 - offset) / scale
    centre = np.array([centre_ngp[2], centre_ngp[0], centre_ngp[1]])
    half = np.full(3, float(meta["aabb_scale"]) * 0.5 / scale)
    return centre, half


def _frame_view(
    frame: Any,
    index: int,
    meta: Mapping[str, Any],
    json_path: Path,
    problems: Problems,
    exif: str,
    roots: ImageRoots,
    bad_cameras: dict[str, list[int]],
    scales: list[float] | None,
    time_range: Range,
) -> tuple[SourceView | None, str | None]:
    """One frame -> (view, missing file path or None); other problems go to ``problems``, camera
    problems to ``bad_cameras`` (problem -> frame indices). With ``scales`` (a list), a uniformly
    scaled rotation is accepted and its scale appended; without, the pose must be rigid."""
    where = f"{json_path}: frame {index}"
    if not isinstance(frame, Mapping) or not isinstance(frame.get("file_path"), str):
        problems.add(f"{where}: expected an object with a string file_path")
        return None, None
    where = f"{where} ({shown_name(frame['file_path'], quoted=False)})"
    c2w_gl, bad = _frame_pose(frame.get("transform_matrix"), f"{where}: transform_matrix", scales)
    if bad:
        problems.add(bad)
    base = json_path.parent
    outside = roots.outside(base / frame["file_path"].replace("\\", "/"), where, frame["file_path"])
    image = None if outside else resolve_image(base, frame["file_path"])
    if image is not None:
        outside = roots.outside(image, where, frame["file_path"])
    if outside:
        problems.add(outside)
        return None, None
    if image is None:
        return None, frame["file_path"]
    if c2w_gl is None:
        return None, None
    intr = {k: meta[k] for k in INTRINSIC_KEYS if k in meta}
    intr.update({k: frame[k] for k in INTRINSIC_KEYS if k in frame})
    try:
        if "w" in intr and "h" in intr:
            width, height = image_size(intr["w"], intr["h"])
        else:
            width, height = used_size(image, exif)
        camera = camera_from_intrinsics(intr, width, height, label=f"{where}")
    except (SourceError, CameraError, TypeError, ValueError) as exc:
        text = "; ".join(getattr(exc, "problems", [str(exc)])).removeprefix(f"camera 0 ({where}): ")
        bad_cameras.setdefault(text, []).append(index)  # one line per bad camera, not per frame
        return None, None
    name = relative_name(image, base)
    paths = {}
    for key in COMPONENT_KEYS:
        rel = frame.get(key)
        if rel is None:
            continue
        if not isinstance(rel, str) or not rel:
            problems.add(f"{where}: {key}: expected a relative file path, got {rel!r}"[:300])
            return None, None
        path = base / rel.replace("\\", "/")
        outside = roots.outside(path, where, rel)
        if outside:
            problems.add(outside)
            return None, None
        if not path.exists():  # a FIFO or device is reported when its size is checked
            problems.add(f"{where}: {key} {shown_name(rel)} not found")
            return None, None
        paths[key] = path
    scale = frame.get(DEPTH_SCALE_KEY, meta.get(DEPTH_SCALE_KEY, NERFSTUDIO_DEPTH_SCALE))
    if "depth_file_path" in paths and not _positive(scale):
        problems.add(f"{where}: {DEPTH_SCALE_KEY}: expected a number > 0, got {scale!r}"[:300])
        return None, None
    time = frame.get("time")
    if time is not None and (bad := time_range.problem("time", time)):
        problems.add(f"{where}: {bad}")
        return None, None
    kept = {k: v for k, v in frame.items() if k not in _FRAME_KEYS}  # kept as per-frame metadata
    view = SourceView(
        name=name,
        camera=camera,
        c2w=opengl_to_opencv_c2w(c2w_gl),
        image_path=image,
        mask_path=paths.get("mask_path"),
        depth_path=paths.get("depth_file_path"),
        depth_scale=float(scale) if _positive(scale) else NERFSTUDIO_DEPTH_SCALE,
        metadata=kept,
        time=None if time is None else float(time),
    )
    return view, None


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


ANY_TIME = Range()  # nerfstudio's per-frame ``time``: any finite number
COMPONENT_KEYS = ("mask_path", "depth_file_path")
DEPTH_SCALE_KEY = "depth_unit_scale_factor"
NERFSTUDIO_DEPTH_SCALE = 1e-3  # nerfstudio's default: millimetre depth files
# keys read above, and nerf_synthetic's "rotation" (a constant of Blender's export script, meaningless)
_FRAME_KEYS = frozenset(
    {"file_path", "transform_matrix", "rotation", "time", *INTRINSIC_KEYS, *COMPONENT_KEYS, DEPTH_SCALE_KEY}
)


def component_problems(json_path: Path, views: Sequence[SourceView]) -> list[str]:
    """One line per component (or ``time``) that some frames name and others do not (nerfstudio:
    every frame or none)."""
    lines = []
    for what, key in (("mask_path", "mask_path"), ("depth_file_path", "depth_path"), ("time", "time")):
        have = [v for v in views if getattr(v, key) is not None]
        if have and len(have) != len(views):
            lacking = next(v for v in views if getattr(v, key) is None)
            lines.append(
                f"{json_path}: {len(have)} of {len(views)} frames have a {what} ({lacking.name!r} has none); "
                "expected every frame or none"
            )
    return lines


def _frame_pose(matrix: Any, where: str, scales: list[float] | None) -> tuple[np.ndarray | None, str | None]:
    if scales is None:
        return check_rigid(matrix, where)
    c2w, scale, bad = check_similarity(matrix, where)
    if c2w is not None and scale != 1.0:
        scales.append(scale)
    return c2w, bad


def scale_note(
    json_path: Path, scales: list[float], n_frames: int
) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """The scales taken out of similarity poses -> (``Capture.assumed`` lines, ``Capture.params``).

    One warning for the whole file, and ``rotation_scale`` ``{"frames", "min", "max"}`` for the
    store's ``source`` record; nothing when every pose was rigid.
    """
    if not scales:
        return [], {}
    lo, hi = min(scales), max(scales)
    shown = f"{lo:.4g}" if f"{lo:.4g}" == f"{hi:.4g}" else f"{lo:.4g} to {hi:.4g}"
    line = (
        f"{json_path}: {len(scales)} of {n_frames} frames have a camera-to-world rotation scaled uniformly "
        f"by {shown} (a similarity, not a rigid transform): the scale was taken out; rays are unchanged"
    )
    return [("poses", line)], {"rotation_scale": {"frames": len(scales), "min": lo, "max": hi}}


def parse_frames(
    json_path: Path,
    meta: Any,
    problems: Problems,
    exif: str = "auto",
    roots: ImageRoots | None = None,
    scales: list[float] | None = None,
    time_range: Range = ANY_TIME,
) -> tuple[list[SourceView], list[str]]:
    """Every frame of one transforms file -> (views, missing image paths).

    ``roots``: where image files may lie (default: the JSON file's folder only). ``scales``: when
    given, uniformly scaled rotations are accepted and their scales appended (see :func:`scale_note`);
    when None, every pose must be rigid. ``time_range``: the per-frame ``time`` values accepted.
    """
    roots = roots or ImageRoots(json_path.parent)
    if not isinstance(meta, Mapping) or not isinstance(meta.get("frames"), list):
        problems.add(f"{json_path}: expected an object with a 'frames' list")
        return [], []
    views, missing = [], []
    bad_cameras: dict[str, list[int]] = {}
    for index, frame in enumerate(meta["frames"]):
        view, gone = _frame_view(
            frame, index, meta, json_path, problems, exif, roots, bad_cameras, scales, time_range
        )
        if gone is not None:
            missing.append(gone)
        elif view is not None:
            views.append(view)
    problems.extend(_camera_lines(json_path, meta["frames"], bad_cameras))
    return views, missing


def _camera_lines(json_path: Path, frames: list[Any], bad: dict[str, list[int]]) -> list[str]:
    """One line per distinct camera problem (a bad camera shared by many frames is one line), naming
    the frames that use it."""
    lines = []
    for text, indices in bad.items():
        named = [f"{i} ({shown_name(frames[i]['file_path'], quoted=False)})" for i in indices]
        if len(named) == 1:
            lines.append(f"{json_path}: frame {named[0]}: {text}")
            continue
        more = f", ... (+{len(named) - 3})" if len(named) > 3 else ""
        lines.append(f"{json_path}: {len(named)} frames ({', '.join(named[:3])}{more}): {text}")
    return lines


def report_missing(json_path: Path, missing: list[str], skip_missing: bool, problems: Problems) -> None:
    """Missing frames are problem lines (the first ten one each, then one line) unless ``skip_missing``."""
    if skip_missing:
        return
    add_listed(
        problems,
        missing,
        lambda rel: f"{json_path}: frame image {shown_name(rel)} not found (pass --skip-missing to skip it)",
        lambda rest: (
            f"{json_path}: {len(rest):,} more frame images not found ({shown_name(rest[0])} to "
            f"{shown_name(rest[-1])}; {len(missing):,} in all; pass --skip-missing to skip them)"
        ),
    )


def parse_ngp(
    src: Path, *, skip_missing: bool = False, exif: str = "auto", allow_outside: Sequence[Path] = ()
) -> Capture:
    """Parse ``src/transforms.json`` (or ``src`` itself when it is the JSON file).

    Image files must lie in the JSON file's folder or one of ``allow_outside``
    (see :mod:`raykit.converters.paths`).
    """
    json_path = src if src.is_file() else src / "transforms.json"
    problems = Problems()
    meta = load_json(json_path)
    roots = ImageRoots(json_path.parent, allow_outside)
    scales: list[float] = []
    views, missing = parse_frames(json_path, meta, problems, exif, roots, scales)
    report_missing(json_path, missing, skip_missing, problems)
    problems.extend(component_problems(json_path, views))
    if not views and not problems:
        problems.add(f"{json_path}: no frames with images")
    problems.raise_if_fatal(views)
    centres = np.stack([v.c2w[:3, 3] for v in views])
    if box_problems := _box_problems(meta):
        raise SourceError([*problems.lines, *(f"{json_path}: {problem}" for problem in box_problems)])
    centre, half = _ngp_box(meta, centres)
    views = [_bounded(v, centre, half) for v in views]
    params = {k: meta[k] for k in ("aabb_scale", "scale", "offset") if k in meta}
    params["skipped_missing"] = sorted(missing) if skip_missing else []
    assumed, scaled = scale_note(json_path, scales, len(meta["frames"]))
    params.update(scaled)
    box = (tuple((centre - half).tolist()), tuple((centre + half).tolist())) if "aabb_scale" in meta else None
    return Capture("ngp", views, bounds=box, problems=problems.lines, params=params, assumed=assumed)
