"""``convert``: a capture folder -> a validated, atomic ray store.

Steps: detect the format, parse it (every problem listed at once), probe every image (exists, is
readable and complete, has the size its camera expects, EXIF policy), rescale cameras for the
downscale factor, assign splits, normalise the world, then hand picklable image records to
:func:`raykit.store.write_store`, which writes in ``<dst>.partial`` and renames it to ``dst`` only
when complete (a rerun resumes from the finished work). Nothing is written before every check passes.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raykit.cameras import Camera
from raykit.converters.base import Capture, Problems, SourceView
from raykit.converters.components import ComponentFile, component_problems, merged_metadata
from raykit.converters.config import SOURCES, ConvertConfig
from raykit.converters.decoding import decode_problems, discard_partial
from raykit.converters.downscale import DOWNSCALE_RULES, mipnerf360_camera
from raykit.converters.executor import conversion_executor
from raykit.converters.images import ImageFileDecoder, choose_layout, probe_image
from raykit.converters.normalize import apply_similarity, normalization
from raykit.converters.splits import assign_splits
from raykit.errors import CameraError, ConfigError, RaykitWarning, SourceError
from raykit.options import with_keywords
from raykit.poses import POSE_SOURCES, VIDEO_EXTENSIONS, PoseOptions, poses_for_convert
from raykit.progress import progress as progress_bar
from raykit.ranges import IMAGE_PIXELS_WARN
from raykit.store import LAYOUTS, ComponentInfo, ImageRecord, SceneInfo, SparsePoints, is_url

if TYPE_CHECKING:
    from raykit.store import RayStore

__all__ = ["POSE_SOURCES", "SOURCES", "build_records", "convert", "detect_source", "parse_source"]


def detect_source(src: Path) -> str:
    """The format of the capture at ``src`` (``blender``, ``ngp``, ``llff`` or ``colmap``)."""
    from raykit.converters.colmap import find_colmap_model

    if src.is_file() and src.suffix == ".json":
        return "ngp"
    if any((src / f"transforms_{s}.json").is_file() for s in ("train", "val", "test")):
        return "blender"
    if (src / "transforms.json").is_file():
        return "ngp"
    if (src / "poses_bounds.npy").is_file():
        return "llff"
    if find_colmap_model(src) is not None:
        return "colmap"
    if src.is_file() and src.suffix.lower() in VIDEO_EXTENSIONS:
        raise SourceError(f"{src}: a video; pass --from video to estimate its poses and convert its frames")
    raise SourceError(
        f"{src}: cannot tell the capture format (no transforms_*.json, transforms.json, poses_bounds.npy "
        "or COLMAP model); pass --from, e.g. --from photos for photos without poses"
    )


def parse_source(
    src: Path,
    source: str,
    *,
    images: Path | None,
    skip_missing: bool,
    downscale: int,
    exif: str = "auto",
    allow_outside: Sequence[Path] = (),
) -> Capture:
    """Parse ``src`` as ``source`` (``auto`` detects it); images must lie inside the capture (or
    ``images``) or one of ``allow_outside``."""
    if source not in SOURCES:
        raise ConfigError(f"source: expected one of {', '.join(SOURCES)}, got {source!r}")
    if not src.exists():
        raise SourceError(f"{src}: capture not found")
    kind = detect_source(src) if source == "auto" else source
    if images is not None and kind != "colmap":
        raise ConfigError(f"--images applies to COLMAP captures only, got a {kind} capture")
    if kind == "colmap":
        from raykit.converters.colmap import parse_colmap

        return parse_colmap(src, images=images, skip_missing=skip_missing, allow_outside=allow_outside)
    if kind == "blender":
        from raykit.converters.blender import parse_blender

        return parse_blender(src, skip_missing=skip_missing, exif=exif, allow_outside=allow_outside)
    if kind == "ngp":
        from raykit.converters.ngp import parse_ngp

        return parse_ngp(src, skip_missing=skip_missing, exif=exif, allow_outside=allow_outside)
    from raykit.converters.llff import parse_llff

    return parse_llff(src, downscale=downscale, exif=exif, allow_outside=allow_outside)


def _image_problems(view: SourceView, exif: str) -> tuple[list[str], str, Mapping[str, Any]]:
    """The image's problems, the EXIF policy to decode it with (``auto`` resolved per image) and its
    EXIF facts for the frame's metadata (``ImageHeader.exif``), from one opening of the file."""
    cam = view.camera
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

    Raises:
        SourceError: the parser's problems and these, all at once.
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
        str(view.image_path), source.width, source.height, factor, exif, _camera_name(source), resize_to
    )
    c2w = apply_similarity(matrix, view.c2w)
    parts = {}
    for kind, file, scale in (("mask", view.mask_path, 1.0), ("depth", view.depth_path, view.depth_scale)):
        if file is not None:
            parts[kind] = ComponentFile(str(file), kind, scale, camera.height, camera.width, factor, rule)
    metadata = merged_metadata(view, exif_facts)
    path = str(view.image_path)
    return ImageRecord(view.name, split, camera, c2w, near, far, path, loader, "", parts, metadata)


def component_infos(
    records: Sequence[ImageRecord], views: Sequence[SourceView], config: ConvertConfig
) -> list[ComponentInfo]:
    """The components the records carry (``ImageRecord.components``), as the store records them."""
    infos = []
    if any("mask" in r.components for r in records):
        infos.append(ComponentInfo("mask", config.mask_dtype, source={"from": "mask_path"}))
    if any("depth" in r.components for r in records):
        scales = sorted({v.depth_scale for v in views if v.depth_path is not None})
        source = {
            "from": "depth_file_path",
            "depth_unit_scale_factor": scales if len(scales) > 1 else scales[0],
        }
        infos.append(
            ComponentInfo(
                "depth", config.depth_dtype, "m", scales[0] if len(scales) == 1 else 1.0, source=source
            )
        )
    return infos


def _pick(
    override: float | None, own: float | None, default: float | None, what: str, view: SourceView
) -> float:
    value = override if override is not None else own if own is not None else default
    if value is None:
        raise SourceError(f"{view.image_path}: no {what} bound known; pass {what}=")
    return float(value)


def _world_points(capture: Capture, scene: SceneInfo) -> SparsePoints | None:
    """The capture's sparse points in the store's world frame, or None."""
    return None if capture.sparse is None else capture.sparse.transformed(scene.matrix())


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    poses: PoseOptions | None = None,
    allow_outside: Sequence[str | os.PathLike[str]] = (),
    **options: Any,
) -> RayStore:
    """Convert the capture at ``src`` into a ray store at ``dst`` and return it opened.

    Args:
        options: the fields of :class:`~raykit.converters.config.ConvertConfig` (``raykit convert``'s
            flags: ``backend="wds"``, ``layout="images"``, ``downscale=2``, ...) with its defaults, but
            ``progress`` (no bars unless asked); ``convert(config.src, config.dst,
            **config.convert_options())`` runs a config. ``split`` may also be explicit lists (see
            :mod:`raykit.converters.splits`).
        allow_outside: folders outside the capture that its image paths may point into (by default
            every image must lie inside the capture folder, or ``images``; see
            :mod:`raykit.converters.paths`).
        poses: :class:`~raykit.poses.estimate.PoseOptions` for ``source="photos"`` or ``"video"``,
            whose poses are estimated into ``<dst>.poses`` first (see :func:`poses_for_convert`).

    Raises:
        SourceError: every problem with the capture, one line each; nothing is written.
        ConfigError: invalid options.
        TypeError: a keyword that is no option.
    """
    config: ConvertConfig = with_keywords(
        ConvertConfig(progress=False), options, "convert()", fixed=("src", "dst", "profile")
    )
    if config.layout not in LAYOUTS:
        raise ConfigError(f"layout: expected one of {', '.join(LAYOUTS)}, got {config.layout!r}")
    source, exif, threads = config.source, config.exif, config.threads
    if source in POSE_SOURCES:
        src, source, exif = poses_for_convert(
            src, dst, source, poses, exif=exif, threads=threads, progress=config.progress
        )
    capture = parse_source(
        Path(src),
        source,
        images=None if config.images is None else Path(config.images),
        skip_missing=config.skip_missing,
        downscale=config.downscale if config.downscale_rule == "exact" else 1,
        exif=exif,
        allow_outside=[Path(p) for p in allow_outside],
    )
    if not capture.views:
        raise SourceError(f"{src}: no images to convert")
    for topic, line in capture.assumed:
        if topic != "bounds" or config.near is None or config.far is None:
            warnings.warn(line, RaykitWarning, stacklevel=2)
    if threads is None:
        threads = (os.cpu_count() or 1) if config.workers == 1 and config.scheduler is None else 1
    records, scene = build_records(
        capture,
        downscale=config.downscale,
        downscale_rule=config.downscale_rule,
        split=config.split,
        normalize=config.normalize,
        exif=exif,
        near=config.near,
        far=config.far,
        progress=config.progress,
        threads=threads if config.scheduler is None else 1,
    )
    info = {"format": capture.source, "path": str(Path(src).resolve()), "downscale": config.downscale,
            "downscale_rule": config.downscale_rule,
            "exif": exif, **{k: v for k, v in capture.params.items() if k != "prescaled"}}  # fmt: skip
    components = component_infos(records, capture.views, config)
    write = _Write(records, scene, config, threads, info, _world_points(capture, scene), tuple(components))
    if is_url(str(dst)):  # object storage: written locally, then uploaded with the manifest last
        from raykit.store import work_folder, write_remote

        local_dst = work_folder(str(dst)) / "store"
        try:
            return write_remote(str(dst), write.to, overwrite=config.overwrite)
        except SourceError as exc:
            discard_partial(local_dst)
            raise SourceError(decode_problems(records, exc)) from None
    try:
        return write.to(Path(dst), config.overwrite)
    except SourceError as exc:  # an image that fails only when decoded: list them all, keep nothing
        discard_partial(Path(dst))
        raise SourceError(decode_problems(records, exc)) from None


@dataclass(frozen=True)
class _Write:
    """The store write of a checked capture: records, scene, options, source description, points."""

    records: list[ImageRecord]
    scene: SceneInfo
    config: ConvertConfig
    threads: int
    info: Mapping[str, Any]
    points: SparsePoints | None
    components: tuple[ComponentInfo, ...] = ()

    def to(self, dst: Path, overwrite: bool = False) -> RayStore:
        from raykit.store import write_store

        config = self.config
        with conversion_executor(config.workers, config.scheduler, self.threads) as executor:
            return write_store(
                dst,
                self.records,
                scene=self.scene,
                **config.store_options(),
                executor=executor,
                progress=config.progress,
                source=self.info,
                overwrite=overwrite,
                points=self.points,
                components=self.components,
            )
