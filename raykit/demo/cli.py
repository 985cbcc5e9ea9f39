"""``raykit demo``: the main job end to end on the built-in scene."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``raykit demo`` to the ``raykit`` parser."""
    parser = subparsers.add_parser(
        "demo",
        help="raykit run on the built-in scene (every sampler) with the demo's comparisons and a report",
    )
    parser.add_argument(
        "--out",
        default="demo-out",
        help="output directory (a rerun skips the stages that are up to date; default: demo-out)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny scene and short budgets (about a minute)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the scene, layout and training")
    parser.add_argument(
        "--dynamic",
        action="store_true",
        help="the built-in dynamic scene too: the static field against the time-conditioned one (kplanes) "
        "for the same time, test PSNR against scene time and a test camera's video in the report "
        "(adds about 20 s with --quick, 2 minutes without)",
    )
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from raykit.demo import run_demo

    run_demo(args.out, quick=args.quick, seed=args.seed, dynamic=args.dynamic)
    return 0
