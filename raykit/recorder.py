"""Measurement off the hot path: one recorder, held in a context variable, off by default.

Code that can tell where its time goes asks :func:`active` once, before its hot loop. Outside a
:func:`recording` block the answer is None and it measures nothing it would not measure anyway: the
trainer, for one, then times no phase of its step and synchronises the device only when it writes a
log record. Inside one, it adds seconds per phase to the yielded :class:`Recorder`::

    with raykit.recorder.recording() as recorder:
        train(config)
    recorder.seconds["train"]   # {"data": 1.2, "sampling": 20.3, "network": 41.0, ...}

A context variable, so concurrent work in other threads or tasks neither sees nor fills it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Recorder", "active", "recording"]


@dataclass
class Recorder:
    """Seconds per scope (``"train"``, ...) and phase, summed over everything recorded into it."""

    seconds: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, scope: str, phase: str, seconds: float) -> None:
        """Add ``seconds`` to ``phase`` of ``scope``."""
        phases = self.seconds.setdefault(scope, {})
        phases[phase] = phases.get(phase, 0.0) + seconds


_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("raykit_recorder", default=None)


def active() -> Recorder | None:
    """The recorder of the innermost :func:`recording` block of this thread or task, else None."""
    return _ACTIVE.get()


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """Record phase times into a fresh :class:`Recorder` while the block runs."""
    recorder = Recorder()
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)
