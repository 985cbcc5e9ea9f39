"""``raykit compare RUN_A RUN_B``: metric differences between two runs' ``eval.json``.

Per split: ``psnr``, ``ssim`` and ``lpips`` under the community protocol. A run evaluated before the
protocol has only float figures: its ``psnr``/``ssim`` are shown as ``psnr_float``/``ssim_float`` and its
protocol figures are missing ("-"), so a row never sets figures of two protocols against each other; those
rows appear only when a run has such figures (the float columns of earlier releases' ``eval.json`` too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raykit.errors import ResumeError
from raykit.metrics import METRIC_KEYS, OLD_PROTOCOL, protocol_of
from raykit.ranges import Range

__all__ = ["TRAIN_METRICS", "MetricDiff", "compare", "eval_protocols", "format_table"]

_FLOAT_KEYS = ("psnr_float", "ssim_float")  # figures of runs scored before the protocol (never written now)


@dataclass(frozen=True)
class MetricDiff:
    """One split's metric in both runs; ``delta = b - a`` (None when a run lacks it)."""

    split: str
    metric: str
    a: float | None
    b: float | None

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    def to_dict(self) -> dict[str, Any]:
        return {"split": self.split, "metric": self.metric, "a": self.a, "b": self.b, "delta": self.delta}


def _read_eval(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "eval.json"
    if not path.is_file():
        raise ResumeError(f"{path}: no eval.json (train the run or `raykit render {run_dir}` first)")
    data = _parse(path, path.read_text(errors="replace"))
    if not isinstance(data, dict) or not isinstance(data.get("splits"), dict):
        raise ResumeError(f"{path}: expected an object with 'splits' (rerun `raykit render {run_dir}`)")
    return data


def _parse(path: Path, text: str, line: int = 0) -> Any:
    """JSON ``text`` of ``path`` (from its ``line``-th line); malformed JSON raises ResumeError naming it."""
    try:
        return json.loads(text)
    except ValueError as exc:
        where = getattr(exc, "lineno", 1) + line
        raise ResumeError(f"{path}:{where}: malformed JSON ({exc}); the run's files are damaged") from None


def _final_log(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "log.jsonl"
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    record = _parse(path, lines[-1], len(lines) - 1) if lines else {}
    return record if isinstance(record, dict) else {}


_METRIC = Range(optional=True)  # a finite number, or absent


def _metric(record: Any, key: str, path: Path, where: str) -> float | None:
    """``record[key]`` (None when absent); anything but a finite number raises ResumeError naming it."""
    value = record.get(key) if isinstance(record, dict) else None
    if problem := _METRIC.problem(f"{where}{key}", value):
        raise ResumeError(f"{path}: {problem}; the run's files are damaged")
    return None if value is None else float(value)


def _figures(evaluation: dict[str, Any], path: Path) -> dict[str, dict[str, Any]]:
    """Per split, the figures by metric name; an old-protocol run's PSNR/SSIM become the float ones
    (checked under the names its ``eval.json`` gives them)."""
    if protocol_of(evaluation) != OLD_PROTOCOL:
        return evaluation["splits"]
    return {
        split: {
            "psnr_float": _metric(f, "psnr", path, f"splits.{split}."),
            "ssim_float": _metric(f, "ssim", path, f"splits.{split}."),
        }
        for split, f in evaluation["splits"].items()
    }


def eval_protocols(run_a: str | Path, run_b: str | Path) -> tuple[str, str]:
    """The protocol each run's ``eval.json`` was scored under (``OLD_PROTOCOL`` before it existed)."""
    return protocol_of(_read_eval(Path(run_a))), protocol_of(_read_eval(Path(run_b)))


def compare(run_a: str | Path, run_b: str | Path) -> list[MetricDiff]:
    """Per-split figures of both runs (module docstring), then training figures from the last log record.

    Raises:
        ResumeError: a run without ``eval.json``, or a file of it that is malformed or holds a metric
            that is not a finite number (the file and the metric named).
    """
    a_dir, b_dir = Path(run_a), Path(run_b)
    a = _figures(_read_eval(a_dir), a_dir / "eval.json")
    b = _figures(_read_eval(b_dir), b_dir / "eval.json")
    rows = []
    for split in sorted(set(a) | set(b)):
        figures = [f for f in (a.get(split), b.get(split)) if isinstance(f, dict)]
        for metric in (*METRIC_KEYS, *(k for k in _FLOAT_KEYS if any(k in f for f in figures))):
            values = [
                _metric(splits.get(split), metric, run / "eval.json", f"splits.{split}.")
                for splits, run in ((a, a_dir), (b, b_dir))
            ]
            rows.append(MetricDiff(split, metric, *values))
    log_a, log_b = _final_log(a_dir), _final_log(b_dir)
    for metric in TRAIN_METRICS:
        values = [
            _metric(log, metric, run / "log.jsonl", "last record: ")
            for log, run in ((log_a, a_dir), (log_b, b_dir))
        ]
        rows.append(MetricDiff("train", metric, *values))
    return rows


# From the last log record: how each run spends its time and samples (rays and samples per step show
# how a sampler spends a --samples-per-step budget; step_memory_mb is the memory after a forward pass).
TRAIN_METRICS = (
    "step",
    "elapsed_s",
    "samples_per_ray",
    "rays_per_s",
    "rays_per_step",
    "samples_per_step",
    "step_memory_mb",
    "peak_memory_mb",
    "psnr",
)


def format_table(rows: list[MetricDiff], name_a: str = "A", name_b: str = "B") -> str:
    """Plain-text table: split, metric, A, B, B - A."""

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    lines = [f"{'split':<8} {'metric':<16} {name_a:>14} {name_b:>14} {'B - A':>12}"]
    for row in rows:
        lines.append(
            f"{row.split:<8} {row.metric:<16} {cell(row.a):>14} {cell(row.b):>14} {cell(row.delta):>12}"
        )
    return "\n".join(lines)
