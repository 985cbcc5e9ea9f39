"""``raykit info``, ``raykit validate`` and ``raykit copy``."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from raykit.errors import StoreCorruptError, StoreVersionError
from raykit.store.reader import RayStore, open_store
from raykit.store.validate import validate_store
from raykit.store.writer import BACKENDS, copy_store

__all__ = ["register", "store_summary"]


def register(subparsers: Any) -> None:
    """Add the ``info``, ``validate`` and ``copy`` subcommands."""
    info = subparsers.add_parser("info", help="summarise a ray store", description="Summarise a ray store.")
    info.add_argument("store", help="store path or URL")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.set_defaults(func=_info)
    validate = subparsers.add_parser(
        "validate",
        help="check a ray store completely",
        description="Recompute every checksum and check "
        "schema, shapes, value ranges and camera/ray consistency. Exit status 0 only if all holds.",
    )
    validate.add_argument("store", help="store path or URL")
    validate.set_defaults(func=_validate)
    copy = subparsers.add_parser(
        "copy",
        help="copy a store to another backend",
        description="Copy a store; the copy has identical logical content and content fingerprint.",
    )
    copy.add_argument("src", help="source store path or URL")
    copy.add_argument("dst", help="destination directory")
    copy.add_argument("--format", choices=BACKENDS, required=True, help="backend of the copy")
    copy.add_argument("--overwrite", action="store_true", help="replace an existing store at DST")
    copy.add_argument("--progress", action="store_true", help="show a progress bar")
    copy.set_defaults(func=_copy)


def store_summary(store: RayStore) -> dict[str, Any]:
    """JSON-able summary: splits, counts, cameras, bytes on disk, bytes per ray, layout."""
    files = store.files
    payload = sum(
        v["size"] for k, v in files.items() if k.startswith(("zarr/", "wds/")) and "zarr.json" not in k
    )
    total = sum(v["size"] for v in files.values())
    n_rays = sum(info.n_rays for info in store.splits.values())
    table = store.table
    return {
        "store": store.url,
        "backend": store.backend,
        "format_version": store.manifest["format_version"],
        "content_fingerprint": store.fingerprint,
        "splits": {name: info.to_dict() for name, info in store.splits.items()},
        "fields": {name: spec.to_dict() for name, spec in store.fields.items()},
        "layout": store.manifest["layout"],
        "cameras": {
            "n_images": len(table.names),
            "n_cameras": len(table.cameras),
            "models": sorted({cam.model for cam in table.cameras}),
            "sizes": sorted({f"{cam.width}x{cam.height}" for cam in table.cameras}),
            "with_alpha": int(table.has_alpha.sum()),
        },
        "scene": store.manifest["scene"],
        "bytes_on_disk": total,
        "payload_bytes": payload,
        "n_rays": n_rays,
        "bytes_per_ray": payload / max(n_rays, 1),
    }


def _info(args: argparse.Namespace) -> int:
    summary = store_summary(open_store(args.store))
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    print(f"store       {summary['store']} ({summary['backend']}, format v{summary['format_version']})")
    print(f"fingerprint {summary['content_fingerprint']}")
    for name, split in summary["splits"].items():
        order = "shuffled" if split["shuffled"] else "image order"
        print(
            f"split       {name}: {split['n_images']} images, {split['n_rays']} rays, "
            f"{split['n_chunks']} chunks ({order})"
        )
    cams = summary["cameras"]
    print(
        f"cameras     {cams['n_cameras']} ({', '.join(cams['models'])}; {', '.join(cams['sizes'])}), "
        f"{cams['with_alpha']} images with alpha"
    )
    fields = [f"{name} {spec['dtype']}x{spec['channels'] or 1}" for name, spec in summary["fields"].items()]
    print(f"fields      {', '.join(fields)}")
    layout = summary["layout"]
    print(f"layout      {layout['chunk_rays']} rays/chunk, {layout['shard_chunks']} chunks/shard")
    print(f"seed        {layout['seed']}")
    print(f"size        {summary['bytes_on_disk']} bytes on disk")
    print(f"bytes/ray   {summary['bytes_per_ray']:.3f} (payload)")
    return 0


def _validate(args: argparse.Namespace) -> int:
    # No store there, or unreachable: an error (exit 2). A damaged store: its problems (exit 1).
    with contextlib.suppress(StoreCorruptError, StoreVersionError):
        open_store(args.store)
    problems = validate_store(args.store)
    for problem in problems:
        print(f"FAIL {problem}")
    if problems:
        print(f"{args.store}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"OK {args.store}")
    return 0


def _copy(args: argparse.Namespace) -> int:
    store = copy_store(
        args.src, args.dst, backend=args.format, progress=args.progress, overwrite=args.overwrite
    )
    print(f"{store.url}: {store.backend} copy, content fingerprint {store.fingerprint}")
    return 0
