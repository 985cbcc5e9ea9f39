"""The ``raykit`` command line. Each feature module contributes its subcommands via ``register``."""

from __future__ import annotations

import argparse
import errno
import importlib
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from raykit.errors import RaykitError, RaykitWarning, SourceError

_MACHINE_FAULTS = frozenset({errno.ENOSPC, errno.EIO, errno.EDQUOT})
PROBLEMS_SHOWN = 20  # a capture with 100,000 problems prints these and one line for the rest

__all__ = ["build_parser", "main"]

# Each subcommand and the module that registers it: ``register(subparsers) -> None`` adds parsers with
# ``set_defaults(func=...)``, where ``func(args) -> int`` is the exit status. ``raykit NAME ...`` imports
# only NAME's module, so a quick command (``raykit info``) does not pay for the others' imports (torch's
# among them); ``raykit --help`` imports them all. tests/test_package.py checks the table against what
# each module registers.
COMMANDS: dict[str, str] = {
    "scene": "raykit.testing.cli",
    "convert": "raykit.converters.cli",
    "add-component": "raykit.converters.cli",
    "poses": "raykit.poses.cli",
    "info": "raykit.store.cli",
    "validate": "raykit.store.cli",
    "copy": "raykit.store.cli",
    "bench": "raykit.profiling.cli",
    "train": "raykit.trainer.cli",
    "render": "raykit.trainer.cli",
    "export": "raykit.trainer.cli",
    "compare": "raykit.trainer.cli",
    "evaluate": "raykit.evaluation.cli",
    "run": "raykit.pipeline.cli",
    "demo": "raykit.demo.cli",
    "sweep": "raykit.sweep.cli",
}
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMANDS.values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or only of ``command``'s module when ``command`` is one."""
    parser = argparse.ArgumentParser(prog="raykit", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run the subcommand; every raykit error becomes ``raykit: error:`` lines and exit status 2."""
    try:
        return int(args.func(args))
    except SourceError as exc:
        for problem in exc.problems[:PROBLEMS_SHOWN]:
            print(f"raykit: error: {problem}", file=sys.stderr)
        if len(exc.problems) > PROBLEMS_SHOWN:
            more = len(exc.problems) - PROBLEMS_SHOWN
            print(f"raykit: error: ... and {more:,} more problems (fix these first)", file=sys.stderr)
        return 2
    except RaykitError as exc:
        print(f"raykit: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # named by the OS: the machine's fault (disk full, I/O error) is status 1,
        print(f"raykit: error: {exc}{_partial_note(exc)}", file=sys.stderr)  # the environment's status 2
        return 1 if exc.errno in _MACHINE_FAULTS else 2
    except KeyboardInterrupt:
        print("raykit: interrupted", file=sys.stderr)
        return 130


def _partial_note(exc: OSError) -> str:
    """For a failed write inside a store's ``DST.partial`` folder: that the folder keeps the work so
    far, and what to do with it."""
    parts = Path(str(exc.filename or "")).parts
    partial = next((i for i, part in enumerate(parts) if part.endswith(".partial")), None)
    if partial is None:
        return ""
    folder = Path(*parts[: partial + 1])
    return f" ({folder} keeps the work so far: rerun the same command to resume, or delete it)"


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """RaykitWarning as one ``raykit: warning:`` line; other warnings as Python prints them."""
    if issubclass(category, RaykitWarning):
        print(f"raykit: warning: {message}", file=sys.stderr)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _version() -> str:
    from raykit.version import __version__

    return f"raykit {__version__}"
