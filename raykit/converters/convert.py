"""``convert``: a capture folder -> a validated, atomic ray store.

Steps: detect the format, parse it (every problem listed at once), check every image and build its
record (:mod:`raykit.converters.records`), then hand the picklable image records to
:func:`raykit.store.write_store`, which writes in ``<dst>.partial`` and renames it to ``dst`` only
when complete (a rerun resumes from the finished work). Nothing is written before every check passes.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raykit.converters.base import Capture, SourceView
from raykit.converters.config import SOURCES, ConvertConfig
from raykit.converters.decoding import decode_problems, discard_partial
from raykit.converters.executor import conversion_executor
from raykit.converters.records import build_records
from raykit.converters.video import close_videos
from raykit.errors import ConfigError, RaykitWarning, SourceError
from raykit.options import with_keywords
from raykit.poses import POSE_SOURCES, VIDEO_EXTENSIONS, PoseOptions, poses_for_convert
from raykit.store import LAYOUTS, ComponentInfo, ImageRecord, SceneInfo, SparsePoints, is_url

if TYPE_CHECKING:
    from raykit.store import RayStore

__all__ = ["POSE_SOURCES", "SOURCES", "convert", "detect_source", "parse_source"]


def detect_source(src: Path) -> str:
    """The format of the capture at ``src`` (``blender``, ``ngp``, ``n3dv``, ``llff`` or ``colmap``)."""
    from raykit.converters.colmap import find_colmap_model
    from raykit.converters.n3dv import is_n3dv

    if src.is_file() and src.suffix == ".json":
        return "ngp"
    if any((src / f"transforms_{s}.json").is_file() for s in ("train", "val", "test")):
        return "blender"
    if (src / "transforms.json").is_file():
        return "ngp"
    if is_n3dv(src):
        return "n3dv"
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
    video: Mapping[str, Any] | None = None,
) -> Capture:
    """Parse ``src`` as ``source`` (``auto`` detects it); images must lie inside the capture (or
    ``images``) or one of ``allow_outside``; ``video``: the Neural 3D Video options
    (``ConvertConfig.video_options``), which other formats refuse unless they are the defaults."""
    if source not in SOURCES:
        raise ConfigError(f"source: expected one of {', '.join(SOURCES)}, got {source!r}")
    if not src.exists():
        raise SourceError(f"{src}: capture not found")
    kind = detect_source(src) if source == "auto" else source
    if images is not None and kind != "colmap":
        raise ConfigError(f"--images applies to COLMAP captures only, got a {kind} capture")
    from raykit.converters.n3dv import N3DV_DEFAULTS, parse_n3dv

    video = dict(video or {})
    if kind == "n3dv":
        return parse_n3dv(src, **video)
    changed = [name for name, value in video.items() if value != N3DV_DEFAULTS[name]]
    if changed:
        raise ConfigError(f"{', '.join(changed)}: Neural 3D Video (n3dv) options, got a {kind} capture")
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
        video=config.video_options(),
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
        finally:
            close_videos()
    try:
        return write.to(Path(dst), config.overwrite)
    except SourceError as exc:  # an image that fails only when decoded: list them all, keep nothing
        discard_partial(Path(dst))
        raise SourceError(decode_problems(records, exc)) from None
    finally:
        close_videos()


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
