"""``raykit info``, ``raykit validate`` and ``raykit copy``."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from raykit.errors import StoreCorruptError, StoreVersionError
from raykit.store.backends import BACKENDS
from raykit.store.reader import open_store
from raykit.store.spec import LAYOUTS
from raykit.store.summary import store_summary
from raykit.store.validate import validate_store

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``info``, ``validate`` and ``copy`` subcommands."""
    info = subparsers.add_parser("info", help="summarise a ray store", description="Summarise a ray store.")
    info.add_argument("store", help="store path or URL")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=_info)
    validate = subparsers.add_parser(
        "validate",
        help="check a ray store completely",
        description="Recompute every checksum (SHA-256 of every file) and check the schema, the camera "
        "table, each stored image's format and size and each ray order; with --deep, also decode every "
        "chunk and image and check their values (every pixel once, alpha, materialised rays). Exit "
        "status 0 only if all holds.",
    )
    validate.add_argument("store", help="store path or URL")
    validate.add_argument(
        "--deep", action="store_true", help="also decode every chunk and image (slower: decoding)"
    )
    validate.set_defaults(func=_validate)
    copy = subparsers.add_parser(
        "copy",
        help="copy a store to another backend",
        description="Copy a store; the copy has identical logical content and content fingerprint "
        "(with or without --with-pids).",
    )
    copy.add_argument("src", help="source store path or URL")
    copy.add_argument("dst", help="destination directory")
    copy.add_argument("--format", choices=BACKENDS, required=True, help="backend of the copy")
    copy.add_argument(
        "--layout", choices=LAYOUTS, default=None, help="layout of the copy (default: the source's)"
    )
    copy.add_argument("--overwrite", action="store_true", help="replace an existing store at DST")
    copy.add_argument("--progress", action="store_true", help="show a progress bar")
    copy.add_argument(
        "--with-pids",
        action="store_true",
        help="store every split's pixel ids explicitly (format 3 derives them from the split's order; "
        "for readers that want them)",
    )
    copy.set_defaults(func=_copy)


def _info(args: argparse.Namespace) -> int:
    summary = store_summary(open_store(args.store))
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    print(f"store       {summary['store']} ({summary['backend']}, format v{summary['format_version']})")
    print(f"fingerprint {summary['content_fingerprint']}")
    for name, split in summary["splits"].items():
        order = "shuffled" if split["shuffled"] else "image order"
        if split["holds_images"]:
            order = "images layout: encoded images, shuffled at load time"
        pids = split.get("pids", "stored")
        print(
            f"split       {name}: {split['n_images']} images, {split['n_rays']} rays, "
            f"{split['n_chunks']} chunks ({order}; pids {pids})"
        )
        per_field = ", ".join(f"{k} {v:.3f}" for k, v in summary["split_bytes_per_ray"][name].items())
        print(f"            bytes/ray {per_field}")
    cams = summary["cameras"]
    print(
        f"cameras     {cams['n_cameras']} ({', '.join(cams['models'])}; {', '.join(cams['sizes'])}), "
        f"{cams['with_alpha']} images with alpha"
    )
    fields = [f"{name} {spec['dtype']}x{spec['channels'] or 1}" for name, spec in summary["fields"].items()]
    print(f"fields      {', '.join(fields)}")
    spec = summary["spec"]
    print(f"chunking    {spec['chunk_rays']} rays/chunk, {spec['shard_chunks']} chunks/shard")
    print(f"seed        {spec['seed']}")
    for name, images in summary["images_layout"].items():
        print(
            f"images      {name}: {images['stored_bytes']} bytes stored ({', '.join(images['formats'])}), "
            f"{images['passthrough']} passed through unchanged"
        )
    for name, comp in summary["components"].items():
        unit = f", unit {comp['unit']}" if comp["unit"] else ""
        print(
            f"component   {name}: {comp['dtype']}{unit}, {comp['n_images']} images, "
            f"{comp['stored_bytes']} bytes ({comp['index']})"
        )
    if summary["components"]:
        print(f"store fp    {summary['store_fingerprint']} (pixels and components)")
    if time := summary["time"]:
        lo, hi = time["span"]
        per_camera, per_instant = (
            "-".join(dict.fromkeys(map(str, v)))
            for v in (time["frames_per_camera"], time["cameras_per_instant"])
        )
        print(
            f"time        {lo:g} to {hi:g} ({time['n_instants']} instants); {time['n_cameras']} cameras "
            f"(by {time['cameras_by']}): {per_camera} frames per camera, {per_instant} cameras per instant"
        )
    if frames := summary["frame_metadata"]:
        print(f"metadata    {frames['n_frames']} frames ({frames['path']})")
    points = summary["points"]
    if points is not None:
        print(
            f"points      {points['n_points']} sparse points ({points['file']}, store world frame), "
            f"mean track length {points['mean_track_length']:.2f}"
        )
    print(f"size        {summary['bytes_on_disk']} bytes on disk")
    by_field = ", ".join(f"{k} {v:.3f}" for k, v in summary["bytes_per_ray_by_field"].items())
    print(f"bytes/ray   {summary['bytes_per_ray']:.3f} (payload: {by_field})")
    if summary["store_to_source"] is None:
        print("source      image bytes unknown (not recorded, source files not found)")
    else:
        print(
            f"source      {summary['source_image_bytes']} bytes of images; store/source "
            f"{summary['store_to_source']:.2f}x"
        )
    return 0


def _validate(args: argparse.Namespace) -> int:
    # No store there, or unreachable: an error (exit 2). A damaged store: its problems (exit 1).
    with contextlib.suppress(StoreCorruptError, StoreVersionError):
        open_store(args.store)
    problems = validate_store(args.store, deep=args.deep)
    for problem in problems:
        print(f"FAIL {problem}")
    if problems:
        print(f"{args.store}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"OK {args.store}")
    return 0


def _copy(args: argparse.Namespace) -> int:
    from raykit.store.write import copy_store  # the writer's imports only for a copy

    store = copy_store(
        args.src, args.dst, backend=args.format, progress=args.progress, overwrite=args.overwrite,
        layout=args.layout,
        with_pids=args.with_pids,
    )  # fmt: skip
    print(f"{store.url}: {store.backend} copy, content fingerprint {store.fingerprint}")
    return 0
