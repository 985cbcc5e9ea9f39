"""``raykit run SRC OUT``: the whole pipeline, resumable (see :mod:`raykit.pipeline`)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``raykit run`` to the ``raykit`` parser."""
    from raykit.options import add_command
    from raykit.pipeline.config import add_arguments

    parser = add_command(
        subparsers,
        "run",
        "capture to verified model and report: poses, convert, validate, profile, train, export, report",
        _run,
        description="Run every stage from a capture (or a store) to an exported, verified model and "
        "OUT/report.md + OUT/report.html. OUT/pipeline.json records each stage's fingerprint, costs and "
        "command: a rerun skips unchanged stages, redoes those downstream of a change and resumes an "
        "interrupted one (training exactly, from its newest checkpoint).",
    )
    add_arguments(parser)


def _run(args: argparse.Namespace) -> int:
    from raykit.pipeline import run_pipeline
    from raykit.pipeline.config import from_args

    run_pipeline(from_args(args))
    return 0
