"""``raykit bench STORE``: profile loading a store (see :mod:`raykit.profiling.loader`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from raykit.fileio import atomic_write_json

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure loader throughput by stage, cold and warm",
        description="Measure rays/s and MB/s of loading a ray store: cold and warm, by stage "
        "(read+decompress, shuffle/gather, ray generation, host-to-device), and the shuffle quality.",
    )
    parser.add_argument("store", help="store path or URL")
    parser.add_argument("--split", default="train", help="split to read (default: train)")
    parser.add_argument("--batch-size", type=int, default=4096, help="rays per batch (default: 4096)")
    parser.add_argument("--workers", type=int, default=0, help="chunk-reading worker processes (default: 0)")
    parser.add_argument(
        "--cache-mb", type=float, default=512, help="decoded-chunk cache budget in MB (default: 512)"
    )
    parser.add_argument("--device", default="cpu", help="where rays are generated (default: cpu)")
    parser.add_argument("--batches", type=int, default=200, help="batches per measurement (default: 200)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    parser.add_argument("--json", metavar="OUT", help="write the report as JSON")
    parser.add_argument("--png", metavar="OUT", help="write a bar chart (PNG)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from raykit.profiling.loader import format_table, run_bench, write_png
    from raykit.store import open_store

    report = run_bench(
        open_store(args.store),
        split=args.split,
        batch_size=args.batch_size,
        workers=args.workers,
        cache_mb=args.cache_mb,
        device=args.device,
        batches=args.batches,
        seed=args.seed,
    )
    print(format_table(report))
    if args.json:
        atomic_write_json(args.json, json.loads(json.dumps(report)))
    if args.png:
        write_png(report, args.png)
    return 0
