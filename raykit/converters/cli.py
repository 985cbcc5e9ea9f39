"""``raykit convert SRC DST``: the command line of :func:`raykit.converters.convert`."""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

import raykit.recorder
from raykit.converters.config import ConvertConfig
from raykit.converters.convert import POSE_SOURCES, convert
from raykit.errors import ConfigError
from raykit.options import add_arguments, add_command, from_args
from raykit.poses import PoseOptions
from raykit.temporal_weights import TemporalWeightsConfig

__all__ = ["register", "run_add_component", "run_convert"]


def register(subparsers: Any) -> None:
    """Add the ``convert`` subcommand."""
    parser = add_command(
        subparsers,
        "convert",
        "convert a COLMAP, Blender, instant-ngp/nerfstudio or LLFF capture into a ray store",
        run_convert,
        config=ConvertConfig,
        description="Convert a capture into a ray store. Every problem with the capture is listed, one per "
        "line, and nothing is written; the store appears at DST only when complete, and rerunning an "
        "interrupted conversion resumes it.",
    )
    parser.add_argument(
        "--allow-outside",
        action="append",
        default=[],
        metavar="DIR",
        help="let image paths point into DIR outside the capture folder (repeatable; default: refused)",
    )
    group = parser.add_argument_group("pose estimation (--from photos|video; see raykit poses)")
    add_arguments(group, PoseOptions, skip=("threads", "seed"))  # type: ignore[arg-type]
    add = add_command(
        subparsers,
        "add-component",
        "add masks, depth maps or temporal weights to a store (its pixels are not rewritten)",
        run_add_component,
        description="Add a per-image component to a local store: one file per image in DIR, named as "
        "the image (its name less its suffix, or its last part) with .png/.jpg/.tif (masks) or "
        ".png/.tif/.npy (depth). Files of the source resolution of a store converted with --downscale "
        "are downscaled by its rule (nearest sample). Only the component's files and the manifest "
        "are written; the content fingerprint is unchanged. A missing or wrongly sized file: one "
        "line, and the store is unchanged. 'temporal' (no DIR) computes DyNeRF's ISG and IST weights of "
        "a multi-view video store from its own images, camera by camera, as components isg and ist.",
    )
    add.add_argument("store", help="local store path")
    add.add_argument("component", choices=("masks", "mask", "depth", "temporal"), help="the component")
    add.add_argument("dir", nargs="?", help="folder of one file per image (masks, depth)")
    add.add_argument(
        "--dtype",
        default=None,
        choices=("bit", "uint8", "float16", "float32"),
        help="stored type (masks: bit (default) or uint8; depth: float32 (default) or float16)",
    )
    add.add_argument(
        "--depth-scale",
        type=float,
        default=None,
        metavar="F",
        help="depth file values times F are metres (e.g. 0.001 for millimetre PNGs); default: unit unknown",
    )
    add.add_argument(
        "--factor", type=int, default=None, metavar="K",
        help=f"temporal: the weights' level (K x K blocks averaged; default {TemporalWeightsConfig.factor})",
    )  # fmt: skip
    add.add_argument("--progress", action="store_true", help="show a progress bar")


def run_convert(args: argparse.Namespace) -> int:
    """Handler of ``raykit convert``; returns the exit status."""
    from raykit.store import format_phases

    config: ConvertConfig = from_args(ConvertConfig, args)
    start = time.perf_counter()
    recording = raykit.recorder.recording() if config.profile else contextlib.nullcontext(None)
    with recording as recorder:
        poses = from_args(PoseOptions, args) if config.source in POSE_SOURCES else None
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
        for line in format_phases(recorder.seconds if recorder else {}, seconds):
            print("  " + line)
    return 0


def run_add_component(args: argparse.Namespace) -> int:
    """Handler of ``raykit add-component``; returns the exit status."""
    from raykit.converters.components import add_component_files

    if args.component == "temporal":
        from raykit.converters.weights import add_temporal_weights

        factor = {} if args.factor is None else {"factor": args.factor}
        store = add_temporal_weights(args.store, TemporalWeightsConfig(**factor), progress=args.progress)
        isg = store.components["isg"]
        print(f"added isg, ist to {store.url}: {isg.n_images} images, 2 x {isg.stored_bytes} bytes "
              f"(float16 at level {isg.factor}); store fingerprint {store.store_fingerprint}")  # fmt: skip
        return 0
    if args.dir is None:
        raise ConfigError(f"add-component {args.component}: expected a folder of one file per image")
    store = add_component_files(
        args.store,
        args.component,
        args.dir,
        dtype=args.dtype or "",
        depth_scale=args.depth_scale,
        progress=args.progress,
    )
    kind = "mask" if args.component.startswith("mask") else "depth"
    info = store.components[kind]
    print(
        f"added {kind} to {store.url}: {info.n_images} images, {info.stored_bytes} bytes ({info.dtype}"
        f"{', ' + info.unit if info.unit else ''}); store fingerprint {store.store_fingerprint}"
    )
    return 0
