"""After a failed conversion: decode every image, so that every undecodable one is listed at once.

The up-front check reads each file's header and chunk structure, which catches missing, truncated and
mis-sized files without decoding pixels. A file whose compressed stream is corrupt (a PNG whose chunk
checksums are valid but whose deflate data is not) fails only when decoded, in the writer. The writer
stops at the first such file; :func:`decode_problems` then decodes every image (in threads: the
decoders release the GIL) and returns one line per failing image, and :func:`discard_partial` removes
the half-written store, since the capture has to be fixed before a rerun.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from raykit.errors import SourceError
from raykit.store import ImageRecord

__all__ = ["decode_problems", "discard_partial"]


def _problem(record: ImageRecord) -> list[str]:
    try:
        record.load()
    except SourceError as exc:
        return exc.problems
    return []


def decode_problems(records: Sequence[ImageRecord], first: SourceError) -> list[str]:
    """Every image's decode (or size) problem, in record order; ``first`` (what stopped the writer)
    is kept when decoding again does not reproduce it."""
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        # one line per problem: the frames of a video that does not decode share theirs
        found = list(dict.fromkeys(line for lines in pool.map(_problem, records) for line in lines))
    return found + [line for line in first.problems if line not in found]


def discard_partial(dst: Path) -> None:
    """Remove ``DST.partial`` (the work of a write that cannot succeed without fixing its input)."""
    shutil.rmtree(dst.with_name(dst.name + ".partial"), ignore_errors=True)
