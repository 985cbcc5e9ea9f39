"""Masks, depth maps and per-frame metadata of a capture (docs/format.md, "Components").

A view's mask (``SourceView.mask_path``: any single-channel image, 0 = pixel not used) and depth map
(``depth_path``: a 16- or 32-bit single-channel image or a ``.npy``, times ``depth_scale`` = metres)
are read by picklable loaders (``ComponentFile``) when the store is written, brought to the image's
stored size by the conversion's downscale rule (``fit_component``: the nearest sample).
``component_problems`` checks every file's size before anything is written: one line per bad file. A
photo's EXIF exposure, ISO, shutter and time come from ``raykit.converters.images.probe_image``.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raykit.cameras import Camera
from raykit.converters.base import SourceView
from raykit.errors import ConfigError, SourceError
from raykit.fileio import IMAGE_FILE_LIMIT, UntrustedFileError, open_regular, read_bounded, safe_path
from raykit.imagedecode import downscale_nearest, open_image
from raykit.ranges import Range
from raykit.store import COMPONENTS, RayStore, open_store

__all__ = [
    "ComponentFile",
    "add_component_files",
    "component_problems",
    "component_size",
    "depth_scale_problem",
    "fit_component",
    "read_component_file",
]


def fit_component(
    name: str, values: np.ndarray, height: int, width: int, factor: int, rule: str, where: str
) -> np.ndarray:
    """A source component (H0, W0) brought to its image's stored size ``(height, width)``: itself when it
    has that size, else downscaled by ``factor`` under the conversion's ``rule`` (``exact``: H0 == k H,
    level rule; ``mipnerf360``: round_half_up(H0 / k) == H) with the nearest sample
    (``raykit.imagedecode.downscale_nearest``, as ``raykit.image_geometry.downscale_mask`` and
    ``downscale_depth``).
    """
    h0, w0 = values.shape[:2]
    if (h0, w0) == (height, width):
        return values
    if factor > 1 and rule == "exact" and (h0, w0) == (height * factor, width * factor):
        return downscale_nearest(values, factor)
    halves = ((2 * h0 + factor) // (2 * factor), (2 * w0 + factor) // (2 * factor))  # round half up
    if factor > 1 and rule == "mipnerf360" and halves == (height, width):
        return downscale_nearest(values, factor, (height, width))
    expected = f"{width}x{height}" + (
        f" (or {width * factor}x{height * factor} before --downscale {factor})" if factor > 1 else ""
    )
    raise SourceError(f"{where}: {name} is {w0}x{h0}, its image is {expected}")


def component_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` of a mask or depth file from its header (``.npy``: its shape); a regular
    file only (``fileio.open_regular``: never a FIFO or a device).
    """
    try:
        with open_regular(path, limit=IMAGE_FILE_LIMIT) as handle:
            if path.suffix.lower() == ".npy":
                fmt = np.lib.format
                version = fmt.read_magic(handle)
                header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
                shape = header(handle)[0]  # the header only
            else:
                with open_image(handle) as image:
                    shape = (image.size[1], image.size[0], len(image.getbands()))
    except UntrustedFileError as exc:
        raise SourceError(str(exc)) from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise SourceError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    channels = 1 if len(shape) == 2 else shape[2] if len(shape) == 3 else 0
    if channels != 1:
        raise SourceError(f"{path}: expected a single-channel file, got shape {tuple(shape)}")
    return int(shape[1]), int(shape[0])


def read_component_file(path: Path, kind: str, scale: float = 1.0) -> np.ndarray:
    """A mask file -> ``uint8 (H, W)`` (8-bit values as they are; 1-bit and 16-bit masks as 0/255)
    or a depth file -> ``float32 (H, W)`` times ``scale``."""
    try:
        data = io.BytesIO(read_bounded(path, limit=IMAGE_FILE_LIMIT))  # a regular file, read once
        if path.suffix.lower() == ".npy":
            values = np.load(data, allow_pickle=False)
        else:
            with open_image(data) as image:
                values = np.asarray(image)
    except UntrustedFileError as exc:
        raise SourceError(str(exc)) from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise SourceError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if values.ndim == 3 and values.shape[2] == 1:
        values = values[..., 0]
    if values.ndim != 2:
        raise SourceError(f"{path}: expected a single-channel {kind}, got shape {values.shape}")
    if kind == "mask":
        return values if values.dtype == np.uint8 else np.where(values > 0, 255, 0).astype(np.uint8)
    if not (np.issubdtype(values.dtype, np.number) or values.dtype == np.bool_):
        raise SourceError(f"{path}: expected numeric depths, got {values.dtype}")
    depth = values.astype(np.float32) * np.float32(scale)
    lost = np.isfinite(values) & (values != 0) & ((depth == 0) | ~np.isfinite(depth))
    if lost.any():
        raise SourceError(
            f"{path}: depth {values[lost].flat[0]} times the scale {scale:g} is "
            f"{depth[lost].flat[0]} in float32 ({int(lost.sum())} pixels); check the depth scale"
        )
    return depth


def depth_scale_problem(scale: float, dtype: str = "") -> str | None:
    """Why ``scale`` (file values -> metres) cannot scale depths stored as ``dtype`` (default
    ``float32``): not a positive number, or one that underflows or overflows that type, or None."""
    info = np.finfo(np.float16 if dtype == "float16" else np.float32)
    return Range(float(info.tiny), float(info.max)).problem("--depth-scale", scale)


@dataclass(frozen=True)
class ComponentFile:
    """Picklable loader of one image's mask or depth map at the image's stored size."""

    path: str
    kind: str  # "mask" | "depth"
    scale: float  # depth: file values -> metres
    height: int
    width: int
    factor: int  # the conversion's downscale factor and rule
    rule: str

    def __call__(self) -> np.ndarray:
        values = read_component_file(Path(self.path), self.kind, self.scale)
        return fit_component(self.kind, values, self.height, self.width, self.factor, self.rule, self.path)


def component_problems(
    views: Sequence[SourceView], cameras: Sequence[Camera], factor: int, rule: str
) -> list[str]:
    """One line per mask or depth file that cannot be read or whose size does not fit its image
    (``cameras``: the stored cameras; the file has the view's source size or the stored size)."""
    problems = []
    for view, camera in zip(views, cameras, strict=True):
        for kind, path in (("mask", view.mask_path), ("depth", view.depth_path)):
            if path is None:
                continue
            try:
                width, height = component_size(path)
                empty = np.zeros((height, width), dtype=np.uint8)  # the size rule only, no pixels read
                fit_component(kind, empty, camera.height, camera.width, factor, rule, str(path))
            except SourceError as exc:
                problems.extend(exc.problems)
    return problems


def merged_metadata(view: SourceView, exif: Mapping[str, Any]) -> dict[str, Any]:
    """A view's frame metadata: what the parser kept, then EXIF facts under ``exif``."""
    return {**dict(view.metadata), **exif}


# ``raykit add-component STORE masks|depth DIR``

_SUFFIXES = {
    "mask": (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp"),
    "depth": (".png", ".tif", ".tiff", ".npy"),
}
KIND_NAMES = {"mask": "mask", "masks": "mask", "depth": "depth", "depths": "depth"}


def component_file(folder: Path, name: str, kind: str, *, shared: bool = False) -> Path | None:
    """The file of image ``name``'s ``kind`` in ``folder``: ``{name less its suffix}{suffix}`` for the
    kind's suffixes (``.png``... for masks; ``.png``, ``.tif``, ``.npy`` for depth), then the same with
    the name's last part only; None when there is none. ``shared``: another image of the store has the
    same last part (``train/r_0.png`` and ``test/r_0.png``), so the last part alone names no image.

    Raises:
        UntrustedFileError: a name that leaves ``folder`` (``..``, absolute, a link out).
        SourceError: ``shared``, and only the last part's file is there (which image's is it?).
    """
    stem = name.rsplit(".", 1)[0] if "." in name.rsplit("/", 1)[-1] else name
    for base in dict.fromkeys([stem, stem.rsplit("/", 1)[-1]]):
        for suffix in _SUFFIXES[kind]:
            path = safe_path(folder, base + suffix, where=str(folder))
            if path.is_file() and shared and base != stem:
                raise SourceError(
                    f"{path}: a {kind} file named by the last part of image {name!r}, which images of "
                    f"other splits share; put it at {stem}{suffix} in {folder} (by split and name)"
                )
            if path.is_file():
                return path
    return None


def add_component_files(
    store_path: str | Path,
    kind: str,
    folder: str | Path,
    *,
    dtype: str = "",
    depth_scale: float | None = None,
    progress: bool = False,
) -> RayStore:
    """Add the masks or depth maps of ``folder`` (one file per image, found by
    :func:`component_file`) to the local store at ``store_path`` as component ``kind``
    (``raykit.store.add_component``: its pixels are not rewritten). Files at the source resolution of
    a store converted with ``--downscale`` are downscaled by its rule. ``depth_scale``: file values ->
    metres (unit ``"m"``); None keeps the values with an unknown unit.

    Raises:
        SourceError: a missing, unreadable, unsafe or wrongly sized file (one line); the store is
            unchanged.
    """
    kind = KIND_NAMES.get(kind, kind)
    if kind not in COMPONENTS:
        raise ConfigError(f"component: expected masks or depth, got {kind!r}")
    if kind == "depth" and depth_scale is not None and (problem := depth_scale_problem(depth_scale, dtype)):
        raise ConfigError(f"{problem} (a smaller or larger factor stores every depth as 0 or infinity)")
    root = Path(folder)
    if not root.is_dir():
        raise SourceError(f"{root}: no such folder")
    store = open_store(store_path)
    source = store.manifest.get("source", {})
    factor, rule = int(source.get("downscale", 1) or 1), str(source.get("downscale_rule", "exact"))
    files: dict[str, Path] = {}
    missing: list[str] = []
    table = store.table
    last_parts = Counter(_last_stem(name) for name in table.names)
    for name in table.names:
        try:
            path = component_file(root, name, kind, shared=last_parts[_last_stem(name)] > 1)
        except UntrustedFileError as exc:
            raise SourceError(f"{exc}") from None
        if path is None:
            missing.append(name)
            continue
        files[name] = path
    if missing:
        raise SourceError(
            f"{root}: no {kind} file for image {missing[0]!r} ({len(missing)} of {len(table.names)} images "
            f"have none; looked for its name with {', '.join(_SUFFIXES[kind])})"
        )
    for row, name in enumerate(table.names):  # sizes from the headers: nothing decoded, nothing written
        width, height = component_size(files[name])
        empty = np.zeros((height, width), dtype=np.uint8)
        fit_component(
            kind, empty, int(table.height[row]), int(table.width[row]), factor, rule, str(files[name])
        )
    scale = 1.0 if depth_scale is None or kind == "mask" else float(depth_scale)
    unit = "m" if kind == "depth" and depth_scale is not None else ""
    load = _FolderLoad(files, kind, scale, factor, rule)
    described = {"from": str(root.resolve())}
    from raykit.store import add_component

    return add_component(
        store.url, kind, load, dtype=dtype, unit=unit, scale=scale, source=described, progress=progress
    )


def _last_stem(name: str) -> str:
    """``train/r_0.png`` -> ``r_0``: what a flat folder's file of that image is named."""
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(".", 1)[0] if "." in last else last


@dataclass(frozen=True)
class _FolderLoad:
    files: Mapping[str, Path]
    kind: str
    scale: float
    factor: int
    rule: str

    def __call__(self, name: str, height: int, width: int) -> np.ndarray:
        path = self.files[name]
        values = read_component_file(path, self.kind, self.scale)
        return fit_component(self.kind, values, height, width, self.factor, self.rule, str(path))
