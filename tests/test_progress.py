"""raykit.progress: a live bar on a terminal, whole lines (no carriage returns) in a log."""

from __future__ import annotations

import io

from raykit.progress import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_whole_lines_and_the_totals() -> None:
    log = io.StringIO()
    for _ in progress(range(40), desc="decode", unit="image", file=log, every_s=0.0):
        pass
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) >= 2 and all(line.startswith("decode:") for line in lines)
    assert "40/40" in lines[-1]


def test_a_log_is_not_written_more_often_than_asked() -> None:
    log = io.StringIO()
    bar = progress(total=1000, desc="shards", file=log, every_s=3600.0)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) <= 3  # the start, at most one forced refresh, the end
    assert "1000/1000" in lines[-1]


def test_a_terminal_gets_the_live_bar() -> None:
    terminal = _Terminal()
    for _ in progress(range(5), desc="frames", file=terminal, every_s=0.0, mininterval=0.0):
        pass
    assert "\r" in terminal.getvalue()


def test_disabled_writes_nothing() -> None:
    log = io.StringIO()
    for _ in progress(range(5), file=log, disable=True):
        pass
    assert log.getvalue() == ""
