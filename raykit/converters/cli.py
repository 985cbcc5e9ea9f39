"""``raykit convert SRC DST``: the command line of :func:`raykit.converters.convert`."""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

from raykit.converters.config import add_arguments, from_args
from raykit.converters.convert import POSE_SOURCES, convert
from raykit.poses.cli import add_pose_arguments, pose_options_from_args

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
    add_arguments(parser)
    parser.add_argument(
        "--allow-outside",
        action="append",
        default=[],
        metavar="DIR",
        help="let image paths point into DIR outside the capture folder (repeatable; default: refused)",
    )
    group = parser.add_argument_group("pose estimation (--from photos|video; see raykit poses)")
    add_pose_arguments(group, skip=("threads", "seed"))
    parser.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    """Handler of ``raykit convert``; returns the exit status."""
    from raykit.store import format_phases, recording_phases

    config = from_args(args)
    start = time.perf_counter()
    recording: contextlib.AbstractContextManager[dict[str, Any]]
    recording = recording_phases() if config.profile else contextlib.nullcontext({})
    with recording as phases:
        poses = pose_options_from_args(args) if config.source in POSE_SOURCES else None
        store = convert(
            config.src, config.dst, **config.convert_options(), poses=poses, allow_outside=args.allow_outside
        )
    seconds = time.perf_counter() - start
    splits = ", ".join(
        f"{name}: {info.n_images} images, {info.n_rays} rays" for name, info in store.splits.items()
    )
    print(f"wrote {config.dst} ({store.backend}; {splits})")
    if config.profile:
        pixels = sum(info.n_rays for info in store.splits.values()) / 1e6
        print(f"converted {pixels:.1f} M pixels in {seconds:.2f} s ({pixels / seconds:.1f} M pixels/s)")
        for line in format_phases(phases, seconds):
            print("  " + line)
    return 0
