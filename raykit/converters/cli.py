"""``raykit convert SRC DST``: the command line of :func:`raykit.converters.convert`."""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

from raykit.converters.convert import POSE_SOURCES, SOURCES, convert
from raykit.converters.images import EXIF_POLICIES
from raykit.converters.normalize import NORMALIZE_MODES
from raykit.converters.pose_cli import add_pose_arguments, pose_options_from_args

__all__ = ["register", "run_convert"]


def register(subparsers: Any) -> None:
    """Add the ``convert`` subcommand."""
    parser = subparsers.add_parser(
        "convert",
        help="convert a COLMAP, Blender, instant-ngp/nerfstudio or LLFF capture into a ray store",
        description="Convert a capture into a ray store. Every problem with the capture is listed, one per "
        "line, and nothing is written; the store appears at DST only when complete, and rerunning an "
        "interrupted conversion resumes it.",
    )
    parser.add_argument("src", metavar="SRC", help="capture folder (or a transforms.json file)")
    parser.add_argument("dst", metavar="DST", help="store to create")
    parser.add_argument(
        "--from",
        dest="source",
        choices=(*SOURCES, *POSE_SOURCES),
        default="auto",
        help="capture format; photos (a folder) or video (a file): poses estimated first into DST.poses",
    )
    parser.add_argument(
        "--format", dest="backend", choices=("zarr", "wds"), default="zarr", help="store backend"
    )
    parser.add_argument("--downscale", type=int, default=1, metavar="N", help="area-downscale images by N")
    parser.add_argument(
        "--split",
        default="auto",
        help="auto | source | all | every:N | test=FILE[,val=FILE][,train=FILE] (default: auto = the "
        "source's own splits, else every 8th sorted image is test)",
    )
    parser.add_argument("--normalize", choices=NORMALIZE_MODES, default="none", help="world normalisation")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--workers", type=int, default=1, metavar="N", help="N > 1: local Dask cluster")
    group.add_argument("--scheduler", metavar="ADDRESS", help="existing Dask scheduler, e.g. tcp://host:8786")
    parser.add_argument(
        "--threads",
        type=int,
        metavar="T",
        help="threads per worker (default: all cores for one worker, else 1; the output is the same)",
    )
    parser.add_argument("--skip-missing", action="store_true", help="skip frames whose image is missing")
    parser.add_argument(
        "--images", metavar="DIR", help="COLMAP image folder (default: found beside the model)"
    )
    parser.add_argument(
        "--allow-outside",
        action="append",
        default=[],
        metavar="DIR",
        help="let image paths point into DIR outside the capture folder (repeatable; default: refused)",
    )
    parser.add_argument(
        "--exif",
        choices=EXIF_POLICIES,
        default="auto",
        help="EXIF orientation policy (default auto: per image, the layout whose size matches its camera)",
    )
    parser.add_argument("--near", type=float, help="override every image's near bound (source units)")
    parser.add_argument("--far", type=float, help="override every image's far bound (source units)")
    parser.add_argument("--chunk-rays", type=int, metavar="N", help="rays per chunk (default: the writer's)")
    parser.add_argument(
        "--shard-chunks", type=int, metavar="N", help="chunks per shard (default: the writer's)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the train split's ray permutation")
    parser.add_argument(
        "--rgba-codec", choices=("lz4", "zstd"), help="zarr colour codec: lz4 (default, fast) or zstd (small)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing store at DST")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    parser.add_argument(
        "--profile", action="store_true", help="print where the time went (per writer step and task phase)"
    )
    group = parser.add_argument_group("pose estimation (--from photos|video; see raykit poses)")
    add_pose_arguments(group, skip=("threads", "seed"))
    parser.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    """Handler of ``raykit convert``; returns the exit status."""
    from raykit.store.writer import format_phases, recording_phases

    start = time.perf_counter()
    recording: contextlib.AbstractContextManager[dict[str, Any]]
    recording = recording_phases() if args.profile else contextlib.nullcontext({})
    with recording as phases:
        store = _convert(args)
    seconds = time.perf_counter() - start
    splits = ", ".join(
        f"{name}: {info.n_images} images, {info.n_rays} rays" for name, info in store.splits.items()
    )
    print(f"wrote {args.dst} ({store.backend}; {splits})")
    if args.profile:
        pixels = sum(info.n_rays for info in store.splits.values()) / 1e6
        print(f"converted {pixels:.1f} M pixels in {seconds:.2f} s ({pixels / seconds:.1f} M pixels/s)")
        for line in format_phases(phases, seconds):
            print("  " + line)
    return 0


def _convert(args: argparse.Namespace) -> Any:
    return convert(
        args.src,
        args.dst,
        source=args.source,
        backend=args.backend,
        downscale=args.downscale,
        split=args.split,
        normalize=args.normalize,
        workers=args.workers,
        scheduler=args.scheduler,
        threads=args.threads,
        skip_missing=args.skip_missing,
        progress=args.progress,
        images=args.images,
        exif=args.exif,
        near=args.near,
        far=args.far,
        chunk_rays=args.chunk_rays,
        shard_chunks=args.shard_chunks,
        seed=args.seed,
        rgba_codec=args.rgba_codec,
        overwrite=args.overwrite,
        allow_outside=args.allow_outside,
        poses=pose_options_from_args(args) if args.source in POSE_SOURCES else None,
    )
