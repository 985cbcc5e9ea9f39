"""Where a store write's time goes (``raykit convert --profile``, ``benchmarks/bench_convert.py``).

Each task times its phases with a ``PhaseClock`` and returns the seconds with its result; the writer
sums them per kind of task and laps its own wall clock per step (``Profile``). A finished write hands
its profile to the innermost ``recording_phases`` block of the calling thread or task (a context
variable: concurrent writes do not mix) and logs it at DEBUG level.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["PhaseClock", "Profile", "format_phases", "recording_phases"]

_log = logging.getLogger("raykit.store.write")


class PhaseClock:
    """Seconds spent per phase of a task, by laps: ``lap(name)`` charges the time since the last lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now


class Profile:
    """Where a write's time went: wall seconds of the calling process per phase (laps), and the
    tasks' own seconds per phase summed over all tasks (whichever worker ran them).

    ``finish`` hands them to the innermost ``recording_phases`` of this thread (or task) and logs them
    at DEBUG level on ``raykit.store.write``.
    """

    def __init__(self) -> None:
        self.wall = PhaseClock()
        self.tasks: dict[str, dict[str, float]] = {}

    def absorb(self, kind: str, results: list[dict[str, Any]]) -> None:
        totals = self.tasks.setdefault(kind, {})
        for res in results:
            for phase, seconds in res.pop("seconds", {}).items():
                totals[phase] = totals.get(phase, 0.0) + seconds

    def finish(self, dst: Path) -> None:
        phases = {"wall": self.wall.seconds, "tasks": self.tasks}
        recording = _RECORDING.get()
        if recording is not None:
            recording.clear()
            recording.update(phases)
        _log.debug("wrote %s: %s", dst, json.dumps(phases))


# The dict the current ``recording_phases`` block collects into (None outside one). A context variable,
# so concurrent writes in other threads or tasks neither see nor overwrite it.
_RECORDING: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "raykit_phases", default=None
)


@contextlib.contextmanager
def recording_phases() -> Iterator[dict[str, Any]]:
    """Inside, the last store write's phase times land in the yielded dict:
    ``{"wall": {phase: s}, "tasks": {"stage" | "shard": {phase: s}}}`` (``Profile``).

    ``wall`` is the writing process's wall time per step (``stage`` and ``shards`` cover the tasks);
    ``tasks`` sums each task's own time per phase over all tasks, whichever thread or worker ran it.
    """
    found: dict[str, Any] = {}
    token = _RECORDING.set(found)
    try:
        yield found
    finally:
        _RECORDING.reset(token)


def format_phases(phases: Mapping[str, Any], seconds: float | None = None) -> list[str]:
    """Human lines for ``recording_phases``' dict: wall time per step, then task time per phase."""
    wall, tasks = phases.get("wall", {}), phases.get("tasks", {})
    lines = ["wall s   " + "  ".join(f"{k} {v:.2f}" for k, v in wall.items())]
    for kind, label in (("stage", "decode tasks"), ("shard", "shard tasks")):
        if tasks.get(kind):
            total = sum(tasks[kind].values())
            parts = "  ".join(f"{k} {v:.2f}" for k, v in sorted(tasks[kind].items(), key=lambda kv: -kv[1]))
            lines.append(f"{label} (summed over workers, {total:.2f} s): {parts}")
    if seconds is not None:
        outside = seconds - sum(wall.values())
        lines.append(
            f"total {seconds:.2f} s, of which outside the writer (parsing, probing, start-up) {outside:.2f} s"
        )
    return lines
