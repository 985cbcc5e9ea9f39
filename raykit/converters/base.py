"""What every source parser produces, and the checks they share.

A parser turns a capture folder into a :class:`Capture`: one :class:`SourceView` per image with its
camera (at the source image resolution), its OpenCV camera-to-world pose in the source's world frame,
the image file, an optional fixed split (Blender) and optional near/far bounds. Parsers never stop at
the first problem: they append one line per problem to a :class:`Problems` list and the caller raises
a single :class:`~raykit.errors.SourceError` listing them all (a parser raises itself only for
unreadable files or when no view is usable: :meth:`Problems.raise_if_fatal`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raykit.cameras import Camera
from raykit.errors import SourceError
from raykit.store import FrameTime, SparsePoints

__all__ = [
    "IMAGE_EXTENSIONS",
    "LISTED",
    "Capture",
    "Problems",
    "SourceView",
    "add_listed",
    "check_rigid",
    "check_similarity",
    "load_json",
    "relative_name",
    "resolve_image",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG", ".tif", ".tiff", ".bmp", ".webp")
RIGID_TOLERANCE = 1e-4


@dataclass(frozen=True, eq=False)
class SourceView(FrameTime):
    """One image of a capture as its source describes it.

    Attributes:
        name: unique image name, relative path with ``/`` separators.
        camera: intrinsics at the resolution of the file at ``image_path``.
        c2w: (4, 4) float64 camera-to-world, OpenCV camera axes, source world frame.
        image_path: the image file.
        split: the split the source assigns (Blender's files), or None to apply the split rule.
        near, far: ray bounds in source units when the source knows them, else None.
        mask_path, depth_path: the view's mask and depth map files when the source names them
            (nerfstudio ``mask_path``, ``depth_file_path``), at the image's resolution.
        depth_scale: the factor from the depth file's values to metres (``depth_unit_scale_factor``).
        metadata: JSON-able per-frame facts the converter keeps (``RayStore.frame_metadata``).
        frame: for a view that is no image file of its own (a video's frame), a picklable callable
            returning its pixels ``uint8 (H, W, 3|4)`` at the camera's size; ``image_path`` then names
            the file they come from (in messages); None for an image file.
        time, camera_index, frame_index: when and by which rig camera (``raykit.store.FrameTime``).
    """

    name: str
    camera: Camera
    c2w: np.ndarray
    image_path: Path
    split: str | None = None
    near: float | None = None
    far: float | None = None
    mask_path: Path | None = None
    depth_path: Path | None = None
    depth_scale: float = 1e-3
    metadata: Mapping[str, Any] = field(default_factory=dict)
    frame: Callable[[], np.ndarray] | None = None


@dataclass
class Capture:
    """A parsed capture: its views and, when the source has them, scene points in the source frame.

    Attributes:
        source: format name (``colmap``, ``blender``, ``ngp``, ``llff``, ``n3dv``).
        views: every image, in the source's order.
        points: (P, 3) float64 scene points (COLMAP points3D), or None.
        sparse: the same points with colour, error and track length (stored as the store's
            ``points3D.parquet``), or None.
        near, far: default ray bounds for views without their own, or None.
        bounds: the scene box ``((x0, y0, z0), (x1, y1, z1))`` in the source frame when known.
        problems: problems found while parsing that did not stop it (bad frames, missing images);
            the converter adds the image checks' problems and raises them all together.
        params: format-specific facts kept in the store's scene record (e.g. ``aabb_scale``).
        assumed: ``(topic, line)`` for each default the parser fell back to or each thing it skipped,
            which the converter reports as warnings; topic ``"bounds"`` (near/far; not reported when
            the user sets both) or ``"splits"``.
    """

    source: str
    views: list[SourceView]
    points: np.ndarray | None = None
    sparse: SparsePoints | None = None
    near: float | None = None
    far: float | None = None
    bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    problems: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    assumed: list[tuple[str, str]] = field(default_factory=list)


class Problems:
    """An ordered list of problem lines; :meth:`raise_if_any` raises one SourceError with all of them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        self.lines.append(line)

    def extend(self, lines: list[str]) -> None:
        self.lines.extend(lines)

    def __bool__(self) -> bool:
        return bool(self.lines)

    def __iter__(self) -> Iterator[str]:
        return iter(self.lines)

    def capture(self, exc: SourceError) -> None:
        self.lines.extend(exc.problems)

    def raise_if_any(self) -> None:
        if self.lines:
            raise SourceError(self.lines)

    def raise_if_fatal(self, views: list[SourceView]) -> None:
        """Raise now when nothing can be checked further (no usable view); else keep collecting."""
        if self.lines and not views:
            raise SourceError(self.lines)


LISTED = 10
"""Problems of one kind (missing images) listed one per line; the rest are summarised in one line."""


def add_listed(
    problems: Problems, items: list[str], line: Callable[[str], str], rest: Callable[[list[str]], str]
) -> None:
    """``line(item)`` for the first :data:`LISTED` items, then ``rest(the other items)`` once: 100,000
    missing frames print 11 lines, not 100,000."""
    for item in items[:LISTED]:
        problems.add(line(item))
    if len(items) > LISTED:
        problems.add(rest(items[LISTED:]))


def load_json(path: Path) -> Any:
    """Parse a JSON file; malformed JSON raises SourceError naming the file, line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SourceError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: cannot read ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}") from None


def check_rigid(matrix: Any, where: str) -> tuple[np.ndarray | None, str | None]:
    """Validate a camera-to-world matrix and return it as a float64 (4, 4) with an exact rotation.

    Accepts (4, 4) with last row ``0 0 0 1`` or (3, 4). The rotation must be orthonormal with
    determinant +1 within ``1e-4`` (values stored as float32 text pass); it is then replaced by the
    nearest rotation (SVD) so downstream rays are exactly unit.

    Returns:
        ``(c2w, None)`` or ``(None, problem line)``.
    """
    c2w, scale, bad = check_similarity(matrix, where)
    if bad is None and scale != 1.0:
        return None, _not_rigid(where, np.asarray(matrix, dtype=np.float64)[:3, :3])
    return c2w, bad


def check_similarity(matrix: Any, where: str) -> tuple[np.ndarray | None, float, str | None]:
    """:func:`check_rigid` that also accepts a rotation scaled uniformly (``s R``, ``s > 0``).

    The scale is taken out (the rotation becomes the nearest rotation to ``R``); the translation is
    kept, so every ray (origin, normalised direction) is unchanged. Scales within ``1e-4`` of the
    same value on all three axes count as uniform; non-uniform scale, shear and reflection are refused.

    Returns:
        ``(c2w, s, None)`` (``s == 1.0`` exactly for a rigid matrix) or ``(None, 1.0, problem line)``.
    """
    try:
        m = np.asarray(matrix, dtype=np.float64)
    except (TypeError, ValueError):
        return None, 1.0, f"{where}: expected a 4x4 numeric matrix, got {str(matrix)[:60]}"
    if m.shape not in ((4, 4), (3, 4)):
        return None, 1.0, f"{where}: expected a 4x4 (or 3x4) matrix, got shape {m.shape}"
    if not np.all(np.isfinite(m)):
        return None, 1.0, f"{where}: matrix contains NaN or inf"
    if m.shape == (4, 4) and np.max(np.abs(m[3] - [0, 0, 0, 1])) > RIGID_TOLERANCE:
        return None, 1.0, f"{where}: last row expected [0, 0, 0, 1], got {m[3].tolist()}"
    rot = m[:3, :3]
    scale = _uniform_scale(rot)
    if scale is None:
        return None, 1.0, _not_rigid(where, rot)
    u, _, vt = np.linalg.svd(rot)
    out = np.eye(4)
    out[:3, :3] = u @ vt
    out[:3, 3] = m[:3, 3]
    return out, scale, None


def _uniform_scale(rot: np.ndarray) -> float | None:
    """(3, 3) -> 1.0 when rigid, ``s`` when ``s * rotation`` (uniform within the tolerance), else None."""
    det = float(np.linalg.det(rot))
    if det <= 0:
        return None
    if float(np.max(np.abs(rot.T @ rot - np.eye(3)))) <= RIGID_TOLERANCE:
        return 1.0
    scale = det ** (1.0 / 3.0)
    if float(np.max(np.abs(rot.T @ rot / scale**2 - np.eye(3)))) > RIGID_TOLERANCE:
        return None
    return scale


def _not_rigid(where: str, rot: np.ndarray) -> str:
    err = float(np.max(np.abs(rot.T @ rot - np.eye(3))))
    det = float(np.linalg.det(rot))
    return (
        f"{where}: transform is not rigid (max |R^T R - I| = {err:.3g}, det R = {det:.4g}; "
        "expected a rotation, optionally scaled uniformly: no non-uniform scale, shear or reflection)"
    )


def resolve_image(base: Path, file_path: str) -> Path | None:
    """Find the image a transforms file refers to.

    ``file_path`` may use Windows separators, start with ``./`` and lack an extension (Blender);
    the first existing candidate among the path itself and the path with each known extension wins.
    """
    rel = file_path.replace("\\", "/")
    candidate = base / rel
    if candidate.is_file():
        return candidate
    for ext in IMAGE_EXTENSIONS:
        with_ext = base / (rel + ext)
        if with_ext.is_file():
            return with_ext
    return None


def relative_name(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` with ``/`` separators (the path itself when not below base)."""
    try:
        return Path(os.path.relpath(path, base)).as_posix()
    except ValueError:
        return path.as_posix()
