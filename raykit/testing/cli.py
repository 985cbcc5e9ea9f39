"""``raykit scene make DIR``: render the built-in scene and write it as Blender or COLMAP data."""

from __future__ import annotations

import argparse
import time
from typing import Any

from raykit.testing.builtin import SCENE_CAMERA_MODELS, SIZES, render_scene
from raykit.testing.writers import write_blender, write_colmap

__all__ = ["register"]

FORMATS = ("blender", "colmap", "colmap-text")


def register(subparsers: Any) -> None:
    """Add ``scene make`` to the ``raykit`` command line."""
    scene = subparsers.add_parser("scene", help="the built-in procedural scene")
    commands = scene.add_subparsers(dest="scene_command", required=True, metavar="COMMAND")
    make = commands.add_parser("make", help="render the built-in scene and write it to DIR")
    make.add_argument("dir", metavar="DIR", help="output folder")
    make.add_argument(
        "--size", choices=list(SIZES), default="tiny", help="views and resolution (default: tiny)"
    )
    make.add_argument("--format", choices=FORMATS, default="blender", help="output layout (default: blender)")
    make.add_argument(
        "--camera-model",
        choices=SCENE_CAMERA_MODELS,
        default="PINHOLE",
        help="OPENCV renders through lens distortion (COLMAP formats only)",
    )
    make.add_argument("--seed", type=int, default=0, help="scene and camera seed (default: 0)")
    make.add_argument("--workers", type=int, default=1, help="rendering processes (default: 1)")
    make.add_argument(
        "--unbounded", action="store_true", help="the unbounded variant: far background around the objects"
    )
    make.set_defaults(func=make_scene)


def make_scene(args: argparse.Namespace) -> int:
    """Handler of ``raykit scene make``; returns the exit status."""
    scene = render_scene(
        args.size, args.seed, args.camera_model, workers=args.workers, unbounded=args.unbounded
    )
    start = time.perf_counter()
    if args.format == "blender":
        write_blender(scene, args.dir)
    else:
        write_colmap(scene, args.dir, binary=args.format == "colmap")
    print(scene.summary())
    print(f"wrote {args.format} layout to {args.dir} in {time.perf_counter() - start:.1f} s")
    return 0
