"""``raykit bench STORE``: profile loading a store (see :mod:`raykit.profiling.loader`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from raykit.fileio import atomic_write_json
from raykit.loaders import RAY_CACHE_BYTES
from raykit.options import add_arguments, from_args, option

__all__ = ["BenchConfig", "register", "run"]

MB = 1 << 20


@dataclass(frozen=True)
class BenchConfig:
    """The options of ``raykit bench``; all but ``store``, ``json`` and ``png`` go to ``run_bench``."""

    store: str = option("", "store path or URL", positional=True)
    split: str = option("train", "split to read")
    batch_size: int = option(4096, "rays per batch")
    workers: int = option(0, "chunk-reading worker processes")
    # the flag's unit is MB; run_bench (and every loader) takes it as cache_bytes
    cache_mb: float = option(RAY_CACHE_BYTES / MB, "decoded-chunk cache budget in MB")
    device: str = option("cpu", "where rays are generated")
    batches: int = option(200, "batches per measurement")
    seed: int = option(0, "sampling seed")
    json: str | None = option(None, "write the report as JSON to this file", metavar="OUT")
    png: str | None = option(None, "write a bar chart (PNG) to this file", metavar="OUT")


def register(subparsers: Any) -> None:
    """Add the ``bench`` subcommand."""
    parser = subparsers.add_parser(
        "bench",
        help="measure loader throughput by stage, cold and warm",
        description="Measure rays/s and MB/s of loading a ray store: cold and warm, by stage "
        "(read+decompress, shuffle/gather, ray generation, host-to-device), and the shuffle quality.",
    )
    add_arguments(parser, BenchConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Handler of ``raykit bench``; returns the exit status."""
    from raykit.profiling.loader import format_table, run_bench, write_png
    from raykit.store import open_store

    config: BenchConfig = from_args(BenchConfig, args)
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("store", "json", "png")}
    settings["cache_bytes"] = int(settings.pop("cache_mb") * MB)
    report = run_bench(open_store(config.store), **settings)
    print(format_table(report))
    if config.json:
        atomic_write_json(config.json, json.loads(json.dumps(report)))
    if config.png:
        write_png(report, config.png)
    return 0
