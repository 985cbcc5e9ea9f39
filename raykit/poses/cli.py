"""``raykit poses SRC OUT``: camera poses from photos or a video (see :mod:`raykit.poses.estimate`).

The flags are generated from the fields of :class:`~raykit.poses.estimate.PoseOptions`;
``raykit convert --from photos|video`` adds the same flags.
"""

from __future__ import annotations

import argparse
from typing import Any

from raykit.options import add_command, from_args
from raykit.poses.estimate import PoseOptions, estimate_poses

__all__ = ["register", "run_poses"]


def register(subparsers: Any) -> None:
    """Add the ``poses`` subcommand."""
    parser = add_command(
        subparsers,
        "poses",
        "estimate camera poses of photos or a video with pycolmap (a COLMAP model for raykit convert)",
        run_poses,
        config=PoseOptions,
        description="Extract features, match them and run incremental structure from motion with pycolmap. "
        "Writes OUT/sparse/0 (binary COLMAP model of the registered photos) with OUT/images referring to the "
        "photos, then prints a summary. Rerunning continues an interrupted run and skips finished stages.",
    )
    parser.add_argument("src", metavar="SRC", help="folder of photos, or a video file (.mp4, .mov, ...)")
    parser.add_argument("out", metavar="OUT", help="output folder (a COLMAP capture)")
    parser.add_argument(
        "--overwrite", action="store_true", help="start over when OUT holds work on other photos or options"
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


def run_poses(args: argparse.Namespace) -> int:
    """Handler of ``raykit poses``; returns the exit status."""
    summary = estimate_poses(
        args.src, args.out, from_args(PoseOptions, args), restart=args.overwrite, progress=args.progress
    )
    for line in summary.lines():
        print(line)
    return 0
