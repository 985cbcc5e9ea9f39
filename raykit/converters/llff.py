"""LLFF captures: ``poses_bounds.npy`` beside ``images/`` (and downscaled copies ``images_N/``).

``poses_bounds.npy`` is ``(I, 17)`` float: a ``3 x 5`` matrix per image (row-major) whose columns are
the camera's down, right and backward axes, its centre, and ``(H, W, focal)`` of the full-resolution
images, then the image's near and far bounds (which become the view's near/far). Images are the
``.png``/``.jpg`` files of the folder in sorted order, as LLFF's loader reads them, and must be as
many as the poses.

With ``downscale = N`` and an ``images_N/`` folder present, its images are used as they are (no
further filtering) and the camera is rescaled to their actual size: ``f * w/W``, principal point at
the image centre. Without such a folder the full-resolution images are area-downscaled at load time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raykit.cameras import Camera
from raykit.conventions import opengl_to_opencv_c2w
from raykit.converters.base import Capture, Problems, SourceView, check_rigid
from raykit.converters.images import probe_image, used_size
from raykit.converters.paths import ImageRoots
from raykit.errors import CameraError, SourceError

__all__ = ["llff_c2w", "load_poses_bounds", "parse_llff"]

_LLFF_EXTENSIONS = (".png", ".jpg", ".jpeg")


def llff_c2w(pose: np.ndarray) -> np.ndarray:
    """(3, 5) LLFF pose (columns down, right, back, centre, hwf) -> (4, 4) OpenGL camera-to-world."""
    c2w = np.eye(4)
    c2w[:3, 0], c2w[:3, 1], c2w[:3, 2] = pose[:, 1], -pose[:, 0], pose[:, 2]
    c2w[:3, 3] = pose[:, 3]
    return c2w


def load_poses_bounds(path: Path) -> np.ndarray:
    """``poses_bounds.npy`` as float64 ``(I, 17)``; SourceError naming the file otherwise."""
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise SourceError(f"{path}: file not found") from None
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: cannot read ({exc})") from None
    if array.ndim != 2 or array.shape[1] != 17 or not np.issubdtype(array.dtype, np.number):
        raise SourceError(f"{path}: expected a numeric (I, 17) array, got {array.dtype} {array.shape}")
    return array.astype(np.float64)


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in _LLFF_EXTENSIONS and p.is_file())


def _uniform(size: tuple[int, int], width: float, height: float) -> bool:
    sx, sy = size[0] / width, size[1] / height
    return abs(sx - sy) <= 0.01 * max(sx, sy)


def _auto_size(image: Path, width: float, height: float) -> tuple[int, int]:
    """``exif="auto"``: the layout (stored or rotated) that is a uniform rescale of the poses' size;
    a file whose size cannot decide is refused later, by the converter's image check."""
    header = probe_image(image, exif="ignore", verify=False)
    stored = (header.width, header.height)
    if header.orientation == 1:
        return stored
    fits = [size for size in (stored, stored[::-1]) if _uniform(size, width, height)]
    return fits[0] if len(fits) == 1 else stored


def _camera(hwf: np.ndarray, image: Path, label: str, exif: str) -> Camera:
    height, width, focal = (float(v) for v in hwf)
    w, h = _auto_size(image, width, height) if exif == "auto" else used_size(image, exif)
    sx, sy = w / width, h / height
    if abs(sx - sy) > 0.01 * max(sx, sy):
        raise SourceError(
            f"{image}: image is {w}x{h}, not a uniform rescale of the "
            f"{width:g}x{height:g} poses_bounds.npy expects"
        )
    return Camera("PINHOLE", w, h, (focal * sx, focal * sy, w / 2, h / 2), label=label)


def _no_folder(src: Path, folder: Path) -> str:
    """The missing-folder problem, naming the ``images_N`` folders there are and the flag to use them."""
    factors = sorted(
        int(p.name[7:])
        for p in src.glob("images_*")
        if p.is_dir() and p.name[7:].isdigit() and p.name[7:] != "0"
    )
    if not factors:
        return f"{folder}: images folder not found"
    found = ", ".join(f"images_{n}" for n in factors)
    flags = " or ".join(f"--downscale {n}" for n in factors)
    return (
        f"{folder}: images folder not found; the capture has {found} (downscaled copies): pass {flags} "
        "(downscale=N) to use them"
    )


def parse_llff(
    src: Path, *, downscale: int = 1, exif: str = "auto", allow_outside: Sequence[Path] = ()
) -> Capture:
    """Parse ``src/poses_bounds.npy`` and its images.

    Image files (symlinks resolved) must lie in ``src`` or one of ``allow_outside``.

    Returns:
        A capture whose ``params["prescaled"]`` is the factor already applied by an ``images_N``
        folder (1 when the full-resolution images are used).
    """
    path = src / "poses_bounds.npy"
    data = load_poses_bounds(path)
    prescaled = downscale if downscale > 1 and (src / f"images_{downscale}").is_dir() else 1
    folder = src / ("images" if prescaled == 1 else f"images_{downscale}")
    if not folder.is_dir():
        raise SourceError(_no_folder(src, folder))
    files = _image_files(folder)
    problems = Problems()
    if len(files) != len(data):
        problems.add(f"{path}: {len(data)} poses but {len(files)} images in {folder}")
    views, roots = [], ImageRoots(src, allow_outside)
    for index, (row, image) in enumerate(zip(data, files, strict=False)):
        where = f"{path}: pose {index} ({image.name})"
        outside = roots.outside(image, where, f"{folder.name}/{image.name}")
        if outside:
            problems.add(outside)
            continue
        pose, bounds = row[:15].reshape(3, 5), row[15:]
        c2w_gl, bad = check_rigid(llff_c2w(pose), where)
        if not np.all(np.isfinite(bounds)) or not 0 < bounds[0] < bounds[1]:
            problems.add(f"{where}: expected bounds 0 < near < far, got {bounds.tolist()}")
        try:
            camera = _camera(pose[:, 4], image, str(path), exif)
        except (SourceError, CameraError) as exc:
            problems.extend(getattr(exc, "problems", [str(exc)]))
            continue
        if bad or c2w_gl is None:
            problems.add(bad or where)
            continue
        c2w = opengl_to_opencv_c2w(c2w_gl)
        near, far = float(bounds[0]), float(bounds[1])
        views.append(SourceView(image.name, camera, c2w, image, None, near, far))
    problems.raise_if_fatal(views)
    params = {"prescaled": prescaled, "images": str(folder)}
    return Capture("llff", views, problems=problems.lines, params=params)
