"""Progress bars that suit where the output goes: a live bar on a terminal, plain lines in a log.

A bar that redraws itself with carriage returns is right on a terminal and wrong in a file: a cluster
job's log fills with thousands of ``\\r`` updates. :func:`progress` gives tqdm's bar when standard
error is a terminal, and otherwise the same figures as whole lines, one every ``every_s`` seconds and
one when the phase ends.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO, Any, TypeVar

from tqdm import tqdm

__all__ = ["LOG_EVERY_S", "LineStream", "progress"]

T = TypeVar("T")
LOG_EVERY_S = 10.0  # seconds between two lines of a bar written to a file or pipe


class LineStream:
    """A text stream for tqdm that turns each redraw (``\\r`` + the bar) into one line of its own."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def progress(
    iterable: Iterable[T] | None = None,
    *,
    every_s: float = LOG_EVERY_S,
    file: IO[str] | None = None,
    **options: Any,
) -> tqdm:
    """A tqdm bar over ``iterable`` (tqdm's ``options``) on a terminal; lines every ``every_s`` elsewhere.

    ``file`` defaults to standard error; whether it is a terminal decides. Off a terminal the bar is
    drawn in ASCII and at most once per ``every_s`` seconds, each time as a whole line, so a log keeps
    one line per update and the last line gives the totals.
    """
    stream = sys.stderr if file is None else file
    if stream.isatty() or options.get("disable"):
        return tqdm(iterable, file=stream, **options)
    options.update(mininterval=every_s, maxinterval=every_s, ascii=True, dynamic_ncols=False, ncols=100)
    return tqdm(iterable, file=LineStream(stream), **options)
