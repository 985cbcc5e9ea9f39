"""``raykit bench STORE``: profile loading a store (see :mod:`raykit.profiling.loader`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError
from raykit.fileio import atomic_path, atomic_write_json, output_problem
from raykit.loaders import RAY_CACHE_BYTES
from raykit.options import add_command, config_problems, from_args, option
from raykit.ranges import SEED, Range, worker_range

__all__ = ["BenchConfig", "register", "run"]

MB = 1 << 20


@dataclass(frozen=True)
class BenchConfig:
    """The options of ``raykit bench``; all but ``store``, ``json`` and ``png`` go to ``run_bench``."""

    store: str = option("", "store path or URL", positional=True)
    split: str = option("train", "split to read")
    batch_size: int = option(4096, "rays per batch", valid=Range(1, integer=True))
    workers: int = option(0, "chunk-reading worker processes", valid=worker_range())
    # the flag's unit is MB; run_bench (and every loader) takes it as cache_bytes
    cache_mb: float = option(RAY_CACHE_BYTES / MB, "decoded-chunk cache budget in MB", valid=Range(0))
    device: str = option("cpu", "where rays are generated")
    batches: int = option(200, "batches per measurement", valid=Range(1, integer=True))
    seed: int = option(0, "sampling seed", valid=SEED)
    json: str | None = option(None, "write the report as JSON to this file", metavar="OUT")
    png: str | None = option(None, "write a bar chart (PNG) to this file", metavar="OUT")

    def __post_init__(self) -> None:
        problems = config_problems(self)
        for flag in ("json", "png"):
            if (problem := _output_problem(f"--{flag}", getattr(self, flag), self.store)) is not None:
                problems.append(problem)
        if problems:
            raise ConfigError("; ".join(problems))


def _output_problem(flag: str, path: str | None, store: str) -> str | None:
    """Why ``path`` cannot receive an output file (not a regular file, its folder is missing, or inside
    the store read), or None."""
    if path is None:
        return None
    inputs = [] if "://" in store or not store else [store]
    if (problem := output_problem(path, inputs=inputs)) is not None:
        return f"{flag} {problem}"
    if not Path(path).resolve().parent.is_dir():
        return f"{flag} {path}: its folder {Path(path).resolve().parent} does not exist"
    return None


def register(subparsers: Any) -> None:
    """Add the ``bench`` subcommand."""
    add_command(
        subparsers,
        "bench",
        "measure loader throughput by stage, cold and warm",
        run,
        config=BenchConfig,
        description="Measure rays/s and MB/s of loading a ray store: cold and warm, by stage "
        "(read+decompress, shuffle/gather, ray generation, host-to-device), and the shuffle quality.",
    )


def run(args: argparse.Namespace) -> int:
    """Handler of ``raykit bench``; returns the exit status."""
    from raykit.profiling.loader import format_table, run_bench, write_png
    from raykit.store import open_store

    config: BenchConfig = from_args(BenchConfig, args)
    store = open_store(config.store)
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("store", "json", "png")}
    settings["cache_bytes"] = int(settings.pop("cache_mb") * MB)
    report = run_bench(store, **settings)
    print(format_table(report))
    if config.json:
        atomic_write_json(config.json, json.loads(json.dumps(report)))
    if config.png:
        with atomic_path(config.png) as tmp, open(tmp, "wb") as handle:
            write_png(report, handle)
    return 0
