"""Camera poses from photos or a video with pycolmap: ``raykit poses SRC OUT``.

Stages (each timed, with a progress bar): ``frames`` (video input only: :mod:`raykit.poses.video`),
``features`` (SIFT), ``matching`` (exhaustive or sequential, with geometric verification), ``mapping``
(incremental structure from motion) and, on request, ``undistort``. The result is a COLMAP capture
that ``raykit convert OUT`` reads. What is written, the defaults and why, and how a rerun resumes:
docs/poses.md.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raykit.cameras import CAMERA_MODELS
from raykit.errors import ConfigError, RaykitError, SourceError
from raykit.options import config_problems, option
from raykit.poses import sfm
from raykit.poses.photos import check_photos, list_photos, looks_like_frames, one_device
from raykit.poses.state import MAX_LISTED, PoseState, PoseSummary, listing, pose_cache
from raykit.poses.video import VIDEO_EXTENSIONS, extract_frames
from raykit.progress import progress as progress_bar
from raykit.ranges import IMAGE_SIDE, Range

__all__ = [
    "MATCHERS",
    "POSE_SOURCES",
    "PoseOptions",
    "PoseSummary",
    "estimate_poses",
    "poses_for_convert",
]

MATCHERS = ("auto", "exhaustive", "sequential")
POSE_SOURCES = ("photos", "video")
SEQUENTIAL_ABOVE = 200
MIN_REGISTERED_FRACTION = 0.5


_SIDE = Range(16, IMAGE_SIDE.high, integer=True)  # pixels of an image's longest side


@dataclass(frozen=True)
class PoseOptions:
    """Options of pose estimation; the fields generate the ``raykit poses`` flags (see ``pose_cli``)."""

    matcher: str = option(
        "auto",
        "exhaustive (all pairs), sequential (neighbours in name order) or auto: sequential for "
        f"video-frame names or more than {SEQUENTIAL_ABOVE} photos",
        choices=MATCHERS,
    )
    camera_model: str = option(
        "SIMPLE_RADIAL",
        "COLMAP camera model fitted; OPENCV suits wide-angle lenses",
        choices=tuple(CAMERA_MODELS),
        metavar="NAME",
    )
    single_camera: bool | None = option(
        None, "share one camera between all photos (default: when size and EXIF make/model/focal agree)"
    )
    max_image_size: int = option(
        3200, "longest side in pixels that features are extracted at", valid=_SIDE, metavar="N"
    )
    max_features: int = option(
        8192, "SIFT features per photo at most", valid=Range(16, integer=True), metavar="N"
    )
    threads: int | None = option(
        None, "CPU threads (default: all)", valid=Range(1, integer=True, optional=True), metavar="N"
    )
    fps: float = option(
        2.0,
        "video input: frames kept per second of video",
        metavar="N",
        valid=Range(0, 1000, low_open=True),
    )
    seed: int = option(
        0, "seed of the random sampling in matching and mapping", valid=Range(0, integer=True), metavar="N"
    )
    brute_force_matching: bool = option(
        False,
        "match by exact brute force rather than pycolmap's FAISS index: exact nearest neighbours, the "
        "same on every run by construction, about 25x slower",
    )
    undistort: bool = option(False, "also write undistorted images and a PINHOLE model in OUT/undistorted")

    def __post_init__(self) -> None:
        problems = config_problems(self)  # every option in its range or among its choices
        if problems:
            raise ConfigError("invalid pose options: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return dataclasses.asdict(self)


def _source_kind(src: Path, source: str) -> str:
    if source not in ("auto", *POSE_SOURCES):
        raise ConfigError(f"source: expected auto, photos or video, got {source!r}")
    if not src.exists():
        raise SourceError(f"{src}: not found")
    kind = "video" if src.is_file() and src.suffix.lower() in VIDEO_EXTENSIONS else "photos"
    kind = kind if source == "auto" else source
    if kind == "photos" and not src.is_dir():
        raise SourceError(f"{src}: expected a folder of photos (or a video: {', '.join(VIDEO_EXTENSIONS)})")
    if kind == "video" and not src.is_file():
        raise SourceError(f"{src}: expected a video file")
    return kind


def _photos_input(src: Path, kind: str, state: PoseState, options: PoseOptions, progress: bool) -> Path:
    """Where the photos are (the folder, or the frames cut from the video), linked as ``OUT/images``."""
    if kind == "video":
        stat = src.stat()
        key = {
            "video": str(src.resolve()),
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "fps": options.fps,
        }
        if state.begin("frames", key):
            start = time.perf_counter()
            state.make_frames_folder()
            with progress_bar(desc="frames", unit="frame", disable=not progress) as bar:
                extract_frames(src, state.out / "images", options.fps, progress=bar.update)
            state.finish("frames", time.perf_counter() - start)
        return state.out / "images"
    state.link_images(src)
    return src


def _photo_names(photos: Path, src: Path, out: Path) -> list[str]:
    names = list_photos(photos, exclude=out)
    if len(names) < 2:
        found = f"found {len(names)}" + (f" ({names[0]})" if names else "")
        raise SourceError(
            f"{src}: pose estimation needs at least 2 overlapping photos (in practice 20 or more), {found}"
        )
    check_photos(photos, names)
    return names


def _features_key(photos: Path, names: list[str], options: PoseOptions, single: bool) -> dict[str, Any]:
    files = [[n, (photos / n).stat().st_size, (photos / n).stat().st_mtime_ns] for n in names]
    return {
        "photos": str(photos.resolve()),
        "files": files,
        "camera_model": options.camera_model,
        "single_camera": single,
        "max_image_size": options.max_image_size,
        "max_features": options.max_features,
    }


def _check_database(database: Path, photos: Path, names: list[str]) -> None:
    """Every photo has its row in the database (pycolmap read it)."""
    pycolmap = sfm.import_pycolmap()
    db = pycolmap.Database.open(str(database))
    try:
        known = {image.name for image in db.read_all_images()}
    finally:
        db.close()
    missing = [n for n in names if n not in known]
    if missing:
        raise SourceError([f"{photos / n}: pycolmap could not read this photo" for n in missing])


def _check_matches(database: Path, src: Path, names: list[str]) -> None:
    if sfm.verified_pairs(database) == 0:
        raise SourceError(
            f"{src}: the photos share no features: no pair of the {len(names)} photos has enough "
            f"geometrically verified matches ({listing(names)}); no model written"
        )


def _map(state: PoseState, photos: Path, names: list[str], options: PoseOptions) -> tuple[Any, list[str]]:
    """Run the mapper; return the largest model and the names it left out (fewer than half: error)."""
    scratch = state.out / ".mapping"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    models = sfm.map_incremental(
        state.out / "database.db",
        photos,
        scratch,
        n_images=len(names),
        threads=_threads(options),
        seed=options.seed,
        progress=state.progress,
    )
    shutil.rmtree(scratch, ignore_errors=True)
    if not models:
        raise SourceError(
            f"{photos}: no reconstruction: no pair of photos has enough matches and baseline to start one "
            f"({len(names)} photos); no model written"
        )
    best = max(models.values(), key=lambda rec: rec.num_reg_images())
    registered = {image.name for image in best.images.values() if image.has_pose}
    left_out = [n for n in names if n not in registered]
    if len(registered) < MIN_REGISTERED_FRACTION * len(names):
        raise SourceError(
            [
                f"{photos}: only {len(registered)} of {len(names)} photos registered (fewer than half); "
                "no model written"
            ]
            + [f"{photos / n}: not registered" for n in left_out[:MAX_LISTED]]
        )
    return best, left_out


def _threads(options: PoseOptions) -> int:
    return options.threads or -1  # pycolmap: -1 = every core


def _features_stage(state: PoseState, photos: Path, names: list[str], key: dict[str, Any],
                    options: PoseOptions, single: bool, progress: bool) -> None:  # fmt: skip
    if not state.begin("features", key):
        return
    start = time.perf_counter()
    database = state.out / "database.db"
    sfm.extract(
        database, photos, names, camera_model=options.camera_model, single=single,
        max_image_size=options.max_image_size, max_features=options.max_features,
        threads=_threads(options), progress=progress,
    )  # fmt: skip
    _check_database(database, photos, names)
    state.finish("features", time.perf_counter() - start)


def _matching_stage(
    state: PoseState, kind: str, names: list[str], features_key: dict[str, Any], options: PoseOptions
) -> str:
    """Match (unless done with this matcher and seed); return the matcher's name.

    The database keeps what another matcher or seed did only where this run would have done the
    same: raw matches are kept unless the matcher now pairs fewer photos (exhaustive, then
    sequential) or brute force was switched, verifications only under the same seed. So a folder
    rerun with other options holds the matches a new folder would.
    """
    auto_sequential = kind == "video" or looks_like_frames(names) or len(names) > SEQUENTIAL_ABOVE
    sequential = options.matcher == "sequential" or (options.matcher == "auto" and auto_sequential)
    matcher = "sequential" if sequential else "exhaustive"
    brute_force = options.brute_force_matching
    key = {"features": features_key, "matcher": matcher, "brute_force": brute_force, "seed": options.seed}
    before = state.data["stages"].get("matching", {}).get("key")
    if state.begin("matching", key):
        start = time.perf_counter()
        database = state.out / "database.db"
        if isinstance(before, dict):  # an earlier matching run on these features (older keys lack fields)
            fewer_pairs = before.get("matcher") == "exhaustive" and sequential
            raw = fewer_pairs or before.get("brute_force", False) != brute_force
            if raw or before.get("seed") != options.seed:
                sfm.discard_matches(database, raw=raw)
        sfm.match(
            database, sequential=sequential, brute_force=brute_force, threads=_threads(options),
            seed=options.seed, progress=state.progress,
        )  # fmt: skip
        state.finish("matching", time.perf_counter() - start)
    return matcher


def _mapping_stage(
    state: PoseState, photos: Path, names: list[str], options: PoseOptions, matcher: str, single: bool
) -> None:
    """Map (unless done with these matches and seed and the model is there); record the summary."""
    key = {"matching": state.key("matching"), "seed": options.seed}
    if not state.begin("mapping", key, force=not (state.out / "sparse" / "0").is_dir()):
        return
    start = time.perf_counter()
    model, left_out = _map(state, photos, names, options)
    state.write_model(model)
    registered = tuple(n for n in names if n not in left_out)
    summary = PoseSummary(
        out=str(state.out),
        given=len(names),
        registered=registered,
        unregistered=tuple(left_out),
        cameras=model.num_cameras(),
        points=model.num_points3D(),
        reprojection_error=float(model.compute_mean_reprojection_error()),
        matcher=matcher,
        single_camera=single,
    )
    state.finish("mapping", time.perf_counter() - start, summary=summary.to_dict())


def estimate_poses(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: PoseOptions | None = None,
    *,
    source: str = "auto",
    restart: bool = False,
    progress: bool = False,
) -> PoseSummary:
    """Estimate camera poses of the photos in ``src`` (a folder, or a video file) into ``out``.

    Args:
        source: ``auto`` (a file with a video extension is a video), ``photos`` or ``video``.
        restart: start over when ``out`` holds work on other photos or with other feature options.
        progress: progress bars per stage (on stderr).

    Raises:
        SourceError: unreadable photos, fewer than 2 photos, photos that share no features, fewer than
            half registered (nothing is written to ``out/sparse`` then).
        ResumeError: ``out`` holds work on other inputs and ``restart`` is False.
        ConfigError: invalid options, or ``out`` is a folder that raykit did not create.
    """
    options = options or PoseOptions()
    src, out = Path(src), Path(out)
    kind = _source_kind(src, source)
    state = PoseState.open(out, kind, src, restart, progress)
    with sfm.quiet_pycolmap():
        photos = _photos_input(src, kind, state, options, progress)
        names = _photo_names(photos, src, out)
        single = options.single_camera if options.single_camera is not None else one_device(photos, names)
        features_key = _features_key(photos, names, options, single)
        _features_stage(state, photos, names, features_key, options, single, progress)
        matcher = _matching_stage(state, kind, names, features_key, options)
        _check_matches(out / "database.db", src, names)
        _mapping_stage(state, photos, names, options, matcher, single)
        if options.undistort and state.begin("undistort", {"mapping": state.key("mapping")}):
            start = time.perf_counter()
            state.write_undistorted(photos, _threads(options), progress)
            state.finish("undistort", time.perf_counter() - start)
    return state.summary()


def poses_for_convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    source: str,
    options: PoseOptions | None,
    *,
    exif: str,
    threads: int | None,
    progress: bool,
) -> tuple[Path, str, str]:
    """Poses into the cache folder ``<dst>.poses`` for ``convert --from photos|video``.

    A cache this call created is removed again when the photos or video are refused.

    Returns ``(capture folder, "colmap", exif policy)``: the undistorted capture with ``undistort``;
    the policy is ``ignore`` because pycolmap read the pixels as stored (``apply`` is refused).
    """
    if exif == "apply":
        raise ConfigError(
            "exif='apply' cannot be used with photos: pycolmap estimates poses on the stored pixels"
        )
    options = options or PoseOptions()
    if options.threads is None and threads is not None:
        options = dataclasses.replace(options, threads=threads)
    cache = pose_cache(Path(dst))
    fresh = not cache.exists()
    try:
        summary = estimate_poses(src, cache, options, source=source, restart=True, progress=progress)
    except (
        RaykitError
    ):  # bad photos or a bad video: no DST.poses left behind (an interrupted run keeps its work)
        if fresh:
            shutil.rmtree(cache, ignore_errors=True)
        raise
    if progress:
        print("\n".join(summary.lines()), file=sys.stderr)
    return (cache / "undistorted" if options.undistort else cache), "colmap", "ignore"
