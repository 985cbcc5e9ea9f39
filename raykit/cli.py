"""The ``raykit`` command line. Each feature module contributes its subcommands via ``register``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from raykit.errors import RaykitError, SourceError

__all__ = ["build_parser", "main"]

# Modules that define ``register(subparsers) -> None``; each adds parsers with ``set_defaults(func=...)``
# where ``func(args) -> int`` is the exit status.
COMMAND_MODULES: tuple[str, ...] = (
    "raykit.scene.cli",
    "raykit.converters.cli",
    "raykit.converters.pose_cli",
    "raykit.store.cli",
    "raykit.profiling.cli",
    "raykit.trainer.cli",
    "raykit.demo.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raykit", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except SourceError as exc:
        for problem in exc.problems:
            print(f"raykit: error: {problem}", file=sys.stderr)
        return 2
    except RaykitError as exc:
        print(f"raykit: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the machine's fault, not the input's (disk full, I/O error): status 1
        print(f"raykit: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("raykit: interrupted", file=sys.stderr)
        return 130


def _version() -> str:
    from raykit import __version__

    return f"raykit {__version__}"
