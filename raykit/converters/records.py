"""A parsed capture -> checked image records and the scene record (:func:`build_records`).

Every image is probed (exists, is readable and complete, has the size its camera expects, EXIF policy),
every camera rescaled for the downscale factor, the splits assigned and the world normalised; all the
problems are raised at once, before anything is written.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from raykit.cameras import Camera
from raykit.converters.base import Capture, Problems, SourceView
from raykit.converters.components import ComponentFile, component_problems, merged_metadata
from raykit.converters.downscale import DOWNSCALE_RULES, mipnerf360_camera
from raykit.converters.exif import choose_layout
from raykit.converters.images import ImageFileDecoder, probe_image
from raykit.converters.normalize import apply_similarity, normalization
from raykit.converters.splits import assign_splits
from raykit.errors import CameraError, ConfigError, RaykitWarning, SourceError
from raykit.progress import progress as progress_bar
from raykit.ranges import IMAGE_PIXELS_WARN
from raykit.store import ImageRecord, SceneInfo

__all__ = ["build_records"]


def _image_problems(view: SourceView, exif: str) -> tuple[list[str], str, Mapping[str, Any]]:
    """The image's problems, the EXIF policy to decode it with (``auto`` resolved per image) and its
    EXIF facts for the frame's metadata (``ImageHeader.exif``), from one opening of the file."""
    cam = view.camera
    if view.frame is not None:  # no file of its own: its parser checked its size
        return [], exif, {}
    try:
        header = probe_image(view.image_path, exif="ignore" if exif == "auto" else exif)
        size = (header.width, header.height)
        if exif == "auto" and header.orientation != 1:
            exif = choose_layout(view.image_path, header.orientation, size, (cam.width, cam.height))
            return [], exif, header.exif  # the chosen layout has the camera's size
    except SourceError as exc:
        return exc.problems, exif, {}
    if size != (cam.width, cam.height):
        return (
            [
                f"{view.image_path}: image is {size[0]}x{size[1]}, its camera "
                f"({_camera_name(cam)}) expects {cam.width}x{cam.height}"
            ],
            exif,
            header.exif,
        )
    return [], exif, header.exif


def _camera_name(cam: Camera) -> str:
    """``label`` (a source file or record), with the camera id when the source numbers cameras."""
    if cam.camera_id and cam.label:
        return f"camera {cam.camera_id} in {cam.label}"
    return cam.label or f"camera {cam.camera_id}"


def _duplicates(views: Sequence[SourceView]) -> list[str]:
    seen: dict[str, SourceView] = {}
    problems = []
    for view in views:
        if view.name in seen:
            problems.append(f"{view.image_path}: image {view.name!r} is listed more than once")
        seen[view.name] = view
    return problems


def _checked_cameras(
    capture: Capture, exif: str, factor: int, progress: bool = False, threads: int = 1, rule: str = "exact"
) -> tuple[list[Camera], list[str], list[Mapping[str, Any]]]:
    """Probe every image (size, integrity, EXIF) and rescale every camera; ``threads`` > 1 probes that
    many images at a time (reading and checksumming files release the GIL).

    Returns:
        The rescaled cameras, each image's EXIF policy (``auto`` resolved) and its EXIF facts.
    """
    views = capture.views
    if not isinstance(factor, int) or factor < 1:
        raise ConfigError(f"downscale: expected a positive integer, got {factor!r}")
    problems, cameras, policies, exif_facts = Problems(), [], [], []
    problems.extend(capture.problems)
    problems.extend(_duplicates(views))
    with contextlib.ExitStack() as stack:
        probed: Iterable[tuple[list[str], str, Mapping[str, Any]]] = (
            _image_problems(view, exif) for view in views
        )
        if threads > 1 and len(views) > 1:
            pool = stack.enter_context(ThreadPoolExecutor(threads, "raykit-probe"))
            probed = pool.map(_image_problems, views, [exif] * len(views))
        found_all = list(
            progress_bar(probed, total=len(views), desc="check images", unit="image", disable=not progress)
        )
    for view, (found, policy, facts) in zip(views, found_all, strict=True):
        problems.extend(found)
        policies.append(policy)
        exif_facts.append(facts)
        try:
            if factor == 1:
                cameras.append(view.camera)
            elif rule == "mipnerf360":
                cameras.append(mipnerf360_camera(view.camera, factor))
            else:
                cameras.append(view.camera.scaled(factor))
        except CameraError as exc:
            problems.add(f"{view.image_path}: {exc}")
    if len(cameras) == len(views):  # masks and depth maps that do not fit their image, one line each
        problems.extend(component_problems(views, cameras, factor, rule))
    problems.raise_if_any()
    _warn_large(views)
    return cameras, policies, exif_facts


def _warn_large(views: Sequence[SourceView]) -> None:
    """One warning line for the images over :data:`raykit.ranges.IMAGE_PIXELS_WARN` (89 Mpx): each
    takes gigabytes to decode (Pillow's own warning is not shown)."""
    large = [v for v in views if v.camera.width * v.camera.height > IMAGE_PIXELS_WARN]
    if large:
        first = max(large, key=lambda v: v.camera.width * v.camera.height)
        size = f"{first.camera.width}x{first.camera.height}"
        warnings.warn(
            f"{len(large)} image(s) over {IMAGE_PIXELS_WARN / 1e6:.0f} Mpx (largest {first.image_path}, "
            f"{size}): each takes {first.camera.width * first.camera.height * 4 / 1e9:.1f} GB or more to "
            "decode; pass --downscale N to store them smaller",
            RaykitWarning,
            stacklevel=3,
        )


def _check_bounds(near: float | None, far: float | None) -> None:
    for name, value in (("near", near), ("far", far)):
        if value is not None and not (np.isfinite(value) and value >= 0):
            raise ConfigError(f"{name}: expected a finite value >= 0, got {value}")
    if near is not None and far is not None and not near < far:
        raise ConfigError(f"expected near < far, got near={near}, far={far}")


def _scene_info(capture: Capture, matrix: np.ndarray, params: Mapping[str, Any], method: str,
                nears: list[float], fars: list[float]) -> SceneInfo:  # fmt: skip
    box: np.ndarray | None = None
    if capture.bounds is not None:
        box = np.array(capture.bounds)
    elif capture.points is not None and len(capture.points):
        box = np.percentile(capture.points, [1.0, 99.0], axis=0)
    bounds = None
    if box is not None:
        corners = box @ matrix[:3, :3].T + matrix[:3, 3]
        bounds = (tuple(corners.min(axis=0).tolist()), tuple(corners.max(axis=0).tolist()))
    return SceneInfo(
        world_frame=f"{capture.source} source frame" + ("" if method == "identity" else f", {method}"),
        world_from_source=tuple(tuple(row) for row in matrix.tolist()),
        transform_method=method,
        transform_params=dict(params),
        bounds=bounds,
        near=min(nears),
        far=max(fars),
    )


def build_records(
    capture: Capture,
    *,
    downscale: int = 1,
    downscale_rule: str = "exact",
    split: Any = None,
    normalize: str = "none",
    exif: str = "auto",
    near: float | None = None,
    far: float | None = None,
    progress: bool = False,
    threads: int = 1,
) -> tuple[list[ImageRecord], SceneInfo]:
    """Checked image records (store world frame) and the scene record for a parsed capture
    (``threads``: images probed at a time)."""
    views = capture.views
    _check_bounds(near, far)
    factor = downscale // int(capture.params.get("prescaled", 1))
    if downscale_rule not in DOWNSCALE_RULES:
        raise ConfigError(
            f"downscale_rule: expected one of {', '.join(DOWNSCALE_RULES)}, got {downscale_rule!r}"
        )
    if downscale_rule == "mipnerf360" and factor != downscale:
        raise ConfigError("downscale_rule mipnerf360 downscales from full resolution, not from images_N")
    cameras, policies, exif_facts = _checked_cameras(capture, exif, factor, progress, threads, downscale_rule)
    splits = assign_splits([v.name for v in views], [v.split for v in views], split)
    centres = np.stack([v.c2w[:3, 3] for v in views])
    matrix, params = normalization(normalize, centres, capture.points)
    scale = float(np.cbrt(np.linalg.det(matrix[:3, :3])))
    nears = [scale * _pick(near, v.near, capture.near, "near", v) for v in views]
    fars = [scale * _pick(far, v.far, capture.far, "far", v) for v in views]
    records = [
        _record(view, camera, split_name, matrix, n, f, factor, policy, facts, downscale_rule)
        for view, camera, split_name, n, f, policy, facts in zip(
            views, cameras, splits, nears, fars, policies, exif_facts, strict=True
        )
    ]
    method = "identity" if normalize == "none" else f"normalize-{normalize}"
    return records, _scene_info(capture, matrix, params, method, nears, fars)


def _record(
    view: SourceView,
    camera: Camera,
    split: str,
    matrix: np.ndarray,
    near: float,
    far: float,
    factor: int,
    exif: str,
    exif_facts: Mapping[str, Any],
    rule: str = "exact",
) -> ImageRecord:
    source = view.camera
    resize_to = (camera.width, camera.height) if rule == "mipnerf360" and factor > 1 else None
    loader = ImageFileDecoder(
        str(view.image_path),
        source.width,
        source.height,
        factor,
        exif,
        _camera_name(source),
        resize_to,
        view.frame,
    )
    c2w = apply_similarity(matrix, view.c2w)
    parts = {}
    for kind, file, scale in (("mask", view.mask_path, 1.0), ("depth", view.depth_path, view.depth_scale)):
        if file is not None:
            parts[kind] = ComponentFile(str(file), kind, scale, camera.height, camera.width, factor, rule)
    metadata = merged_metadata(view, exif_facts)
    path = str(view.image_path) if view.frame is None else f"{view.image_path}#{view.frame_index}"
    return ImageRecord(
        view.name, split, camera, c2w, near, far, path, loader, "", parts, metadata,
        time=view.time, camera_index=view.camera_index, frame_index=view.frame_index,
    )  # fmt: skip


def _pick(
    override: float | None, own: float | None, default: float | None, what: str, view: SourceView
) -> float:
    value = override if override is not None else own if own is not None else default
    if value is None:
        raise SourceError(f"{view.image_path}: no {what} bound known; pass {what}=")
    return float(value)
