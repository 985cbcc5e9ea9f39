"""Expected numeric ranges: the one check of every number that crosses a boundary.

A number read from a capture (a focal length, a quaternion's norm, ``aabb_scale``), given as a
command-line option (``--lr``, ``--max-seconds``, ``--cache-mb``) or passed to a loader
(``batch_size``, ``num_workers``) is checked against a :class:`Range` before anything is written or
started: of the right kind (an integer where one is expected; never a bool, NaN or infinity), inside
its bounds. A problem is one line, ``NAME: expected WHAT, got VALUE``; callers add the file or option
and raise their own error (``SourceError`` for captures, ``ConfigError`` for options and arguments,
``CameraError`` for cameras). :func:`device_problem` checks a device name the same way.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

__all__ = [
    "IMAGE_PIXELS",
    "IMAGE_PIXELS_WARN",
    "IMAGE_SIDE",
    "SEED",
    "Range",
    "device_problem",
    "image_size_problem",
    "max_workers",
    "range_problems",
    "worker_range",
]


@dataclass(frozen=True)
class Range:
    """The numbers a value may take.

    Attributes:
        low, high: bounds (None: unbounded on that side).
        low_open, high_open: the bound itself is excluded.
        integer: the value must be an integer (``int`` or a numpy integer; not a bool).
        optional: None is accepted (a default follows).
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    optional: bool = False

    def describe(self) -> str:
        """What is expected, e.g. ``an integer >= 1`` or ``a number in (0, 3.14159)``."""
        kind = "an integer" if self.integer else "a finite number"
        _fmt = _fmt_int if self.integer else _fmt_float
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"{kind} in {left}{_fmt(self.low)}, {_fmt(self.high)}{right}"
        if self.low is not None:
            return f"{kind} {'>' if self.low_open else '>='} {_fmt(self.low)}"
        if self.high is not None:
            return f"{kind} {'<' if self.high_open else '<='} {_fmt(self.high)}"
        return kind

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is a number of this range (None only when ``optional``)."""
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.integer and not isinstance(value, numbers.Integral):
            return False
        try:
            number = float(value)
        except OverflowError:  # an integer beyond float's range
            number = -math.inf if cast(int, value) < 0 else math.inf
        if not self.integer and not math.isfinite(number):
            return False
        low_ok = self.low is None or (number > self.low if self.low_open else number >= self.low)
        high_ok = self.high is None or (number < self.high if self.high_open else number <= self.high)
        return low_ok and high_ok

    def problem(self, name: str, value: Any) -> str | None:
        """``NAME: expected ..., got VALUE`` when ``value`` is outside this range, else None."""
        if self.contains(value):
            return None
        typed = self.integer and not isinstance(value, numbers.Integral | type(None))
        return f"{name}: expected {self.describe()}, got {_shown(value, typed)}"


def range_problems(values: Mapping[str, tuple[Any, Range]]) -> list[str]:
    """One line per ``name: (value, range)`` whose value is outside its range, in order."""
    return [p for name, (value, expected) in values.items() if (p := expected.problem(name, value))]


def _fmt_float(bound: float) -> str:
    return f"{bound:.6g}"


def _fmt_int(bound: float) -> str:
    return str(int(bound))


def _shown(value: Any, typed: bool = False) -> str:
    """``value`` for an error line: short (a 100,000-digit number is cut), with its type when not a
    number (``'3'`` is a str), a bool, or ``typed``."""
    try:
        text = repr(value)
    except ValueError:  # an integer of more digits than Python converts to text
        text = f"an integer of about {int(int(value).bit_length() * math.log10(2)) + 1} digits"
    if len(text) > 40:
        text = f"{text[:20]}...{text[-8:]} ({len(text)} characters)"
    if typed or isinstance(value, bool) or not isinstance(value, numbers.Real | type(None)):
        return f"{text} ({type(value).__name__})"
    return text


IMAGE_PIXELS_WARN = 89_478_485
"""Pixels of one image above which decoding needs gigabytes (Pillow's ``MAX_IMAGE_PIXELS``): one
warning line."""
IMAGE_PIXELS = Range(1, 2 * IMAGE_PIXELS_WARN, integer=True)
"""Pixels of one image (width x height): more is refused, as Pillow refuses decompression bombs."""
IMAGE_SIDE = Range(1, 65_535, integer=True)
"""Width or height of one image in pixels (JPEG's and WebP's limit)."""


SEED = Range(0, 2**32 - 1, integer=True)
"""A random seed (``--seed``, a sweep's seeds): 32 bits, as numpy's legacy seeding takes; the trainer
derives its generators' seeds as ``seed * 1_000_003 + k``, which torch takes below 2**64."""


def image_size_problem(width: Any, height: Any) -> str | None:
    """``image size: expected ...`` when ``width`` x ``height`` is not a sane image size, else None."""
    sides = range_problems({"width": (width, IMAGE_SIDE), "height": (height, IMAGE_SIDE)})
    if sides:
        return "; ".join(sides)
    if not IMAGE_PIXELS.contains(int(width) * int(height)):
        return (
            f"image size: expected at most {IMAGE_PIXELS.high:,.0f} pixels, got {width}x{height} "
            f"({int(width) * int(height):,} pixels)"
        )
    return None


def device_problem(device: Any) -> str | None:
    """``device: ...`` when ``device`` is not a device name (or ``torch.device``) this machine has."""
    if device == "cpu":
        return None
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        return f"device: expected cpu, cuda or cuda:N, got {device!r}"
    if parsed.type == "cuda" and not torch.cuda.is_available():
        return f"device: expected cpu (CUDA is not available on this machine), got {device!r}"
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        return f"device: expected cuda:0 to cuda:{torch.cuda.device_count() - 1}, got {device!r}"
    return None


def max_workers() -> int:
    """The most worker processes a loader starts: 4 per CPU core this process may use (at least 8)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(8, 4 * cores)


def worker_range() -> Range:
    """The :class:`Range` of a worker-process count: 0 (the calling process reads) to :func:`max_workers`."""
    return Range(0, max_workers(), integer=True, optional=True)
