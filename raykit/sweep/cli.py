"""``raykit sweep SPEC OUT`` and ``raykit sweep --report OUT`` (see :mod:`raykit.sweep`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``raykit sweep`` to the ``raykit`` parser."""
    from raykit.options import add_arguments
    from raykit.sweep.sweep import SweepOptions

    parser = subparsers.add_parser(
        "sweep",
        help="experiments: captures x configurations x seeds, resumable, local or on Dask, one report",
        description="Run every (capture, configuration, seed) of the TOML file SPEC into OUT: each capture "
        "converted once, each run trained and evaluated by raykit run's stages and named by its identity "
        "(store fingerprint, config hash, seed, raykit version); a finished run is never run again, so a "
        "killed sweep reruns only what had not finished. Writes OUT/results.parquet, OUT/results.csv, "
        "OUT/report.md and OUT/report.html. OUT must be new, empty or an earlier sweep's (sweep.json): "
        "a folder holding other files is refused. A SPEC of more than 10,000 runs, an unreachable "
        "--scheduler or tracking server are refused before anything is converted; exit status 2 when "
        "every run failed.",
    )
    parser.add_argument("spec", nargs="?", metavar="SPEC", help="the sweep's TOML file")
    parser.add_argument("out", nargs="?", metavar="OUT", help="output folder (stores, runs, results, report)")
    parser.add_argument("--report", metavar="OUT", help="only (re)write OUT's report from its results")
    add_arguments(parser, SweepOptions)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from raykit.errors import ConfigError
    from raykit.options import from_args
    from raykit.sweep import SweepOptions, run_sweep, write_report

    if args.report is not None:
        if args.spec is not None:
            raise ConfigError("--report OUT takes no SPEC: raykit sweep --report OUT")
        out = Path(args.report)
        md = write_report(out)
        print(f"report: {md} and {md.with_suffix('.html')}")
        return 0
    if args.spec is None or args.out is None:
        raise ConfigError("expected SPEC and OUT (raykit sweep SPEC OUT), or --report OUT")
    options: SweepOptions = from_args(SweepOptions, args)
    run_sweep(args.spec, args.out, options)
    return 0
