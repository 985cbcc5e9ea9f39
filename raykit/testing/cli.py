"""``raykit scene make DIR``: render the built-in scene and write it as Blender or COLMAP data (or
its small dynamic variant as a D-NeRF or Neural 3D Video capture)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError
from raykit.fileio import atomic_write_json, read_json, sha256_file
from raykit.testing.builtin import SCENE_CAMERA_MODELS, SIZES, render_scene
from raykit.testing.dynamic import render_dynamic, write_dnerf, write_n3dv
from raykit.testing.writers import write_blender, write_colmap

__all__ = ["register"]

FORMATS = ("blender", "colmap", "colmap-text", "dnerf", "n3dv")
WRITTEN = ".raykit-scene.json"  # DIR/.raykit-scene.json: the files `scene make` wrote there (sha256)


def register(subparsers: Any) -> None:
    """Add ``scene make`` to the ``raykit`` command line."""
    scene = subparsers.add_parser("scene", help="the built-in procedural scene")
    commands = scene.add_subparsers(dest="scene_command", required=True, metavar="COMMAND")
    make = commands.add_parser("make", help="render the built-in scene and write it to DIR")
    make.add_argument("dir", metavar="DIR", help="output folder")
    make.add_argument(
        "--size", choices=list(SIZES), default="tiny", help="views and resolution (default: tiny)"
    )
    make.add_argument(
        "--format",
        choices=FORMATS,
        default="blender",
        help="output layout (default: blender); dnerf: the dynamic variant, 4 cameras x 6 times at 32x32; "
        "n3dv: the same as a Neural 3D Video capture (camNN.mp4, lossless H.264, and poses_bounds.npy)",
    )
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
    _check_folder(Path(args.dir))
    if args.format in ("dnerf", "n3dv"):
        if args.format == "dnerf":
            write_dnerf(render_dynamic(args.seed), args.dir)
        else:
            write_n3dv(render_dynamic(args.seed, own_intrinsics=-1), args.dir)
        _record_folder(Path(args.dir))
        kind = "a D-NeRF" if args.format == "dnerf" else "a Neural 3D Video"
        print(f"wrote the built-in dynamic scene (seed {args.seed}) as {kind} capture to {args.dir}")
        return 0
    scene = render_scene(
        args.size, args.seed, args.camera_model, workers=args.workers, unbounded=args.unbounded
    )
    start = time.perf_counter()
    if args.format == "blender":
        write_blender(scene, args.dir)
    else:
        write_colmap(scene, args.dir, binary=args.format == "colmap")
    _record_folder(Path(args.dir))
    print(scene.summary())
    print(f"wrote {args.format} layout to {args.dir} in {time.perf_counter() - start:.1f} s")
    return 0


def _files(root: Path) -> dict[str, Path]:
    """Every entry of ``root`` but its folders (a symlink to a folder counts), by relative name."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_dir():
            found[path.relative_to(root).as_posix()] = path
    found.pop(WRITTEN, None)
    return found


def _check_folder(root: Path) -> None:
    """Refuse ``root`` when it holds a file this command did not write, or one changed since (the
    user's ``transforms_train.json``...): a new or empty folder, or one of its own earlier outputs."""
    if not root.exists():
        return
    if not root.is_dir():
        raise ConfigError(f"{root}: not a folder")
    written: dict[str, str] = {}
    if (root / WRITTEN).exists():
        try:
            written = dict(read_json(root / WRITTEN)["files"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{root / WRITTEN}: not a record of `raykit scene make` ({exc})") from None
    for rel, path in _files(root).items():
        ours = rel in written and path.is_file() and not path.is_symlink()
        if not ours or sha256_file(path) != written[rel]:
            raise ConfigError(
                f"{path}: a file `raykit scene make` did not write{' (or changed since)' if ours else ''}; "
                "not overwritten: choose a new or empty folder"
            )


def _record_folder(root: Path) -> None:
    """Record every file of ``root`` (all written by this command, ``_check_folder``) and its sha256."""
    files = {rel: sha256_file(path) for rel, path in _files(root).items()}
    atomic_write_json(root / WRITTEN, {"files": files})
