"""The sweep's report: ``OUT/report.md`` and a self-contained ``OUT/report.html``, from ``results.parquet``.

Sections: the runs (finished, failed and why); per capture, a table of every run and the mean and
standard deviation over seeds of each configuration; a paired comparison of the configurations (for
each pair, on how many (capture, seed) pairs each wins on the SPEC's metric, and by how much); and
PSNR against training time, one figure per capture (``OUT/figures/curves-<capture>.png``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raykit.report import Block, Code, Figure, Section, Table, para, pyplot, save_figure
from raykit.report import write_report as render_report
from raykit.sweep.results import read_results
from raykit.sweep.spec import LOWER_IS_BETTER

__all__ = ["paired_comparison", "summarise", "write_report"]

SKIP_FIGURES = ("n_images", "seconds")


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def metric_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The evaluation figures present (``<split>_<metric>``, numbers), primary split first."""
    splits: list[str] = []
    for row in rows:
        for split in str(row.get("config.eval_splits") or "test").split(","):
            if split.strip() and split.strip() not in splits:
                splits.append(split.strip())
    columns = []
    for split in splits:
        for row in rows:
            for key, value in row.items():
                if (
                    key.startswith(f"{split}_")
                    and key not in columns
                    and isinstance(value, int | float)
                    and not isinstance(value, bool)
                    and key.removeprefix(f"{split}_") not in SKIP_FIGURES
                ):
                    columns.append(key)
    return columns


def primary_column(rows: Sequence[dict[str, Any]], metric: str) -> str | None:
    """The column compared: the metric on the first evaluated split."""
    return next((c for c in metric_columns(rows) if c.endswith(f"_{metric}")), None)


def summarise(rows: Sequence[dict[str, Any]], column: str) -> dict[tuple[str, str], dict[str, float]]:
    """(capture, config) -> ``{"mean", "std", "n"}`` of ``column`` over the finished seeds (std with
    one degree of freedom; 0 for one seed)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        value = row.get(column)
        if row.get("status") == "done" and isinstance(value, int | float):
            groups.setdefault((row["capture"], row["config"]), []).append(float(value))
    return {
        key: {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, "n": len(v)}
        for key, v in groups.items()
    }


def paired_comparison(
    rows: Sequence[dict[str, Any]], column: str, higher_is_better: bool = True
) -> list[dict[str, Any]]:
    """For each pair of configurations, over the (capture, seed) pairs both finished: wins of each,
    ties, the mean difference A - B and its range, and how many captures each wins on the mean."""
    value: dict[tuple[str, str, int], float] = {}
    configs: list[str] = []
    for row in rows:
        if row["config"] not in configs:
            configs.append(row["config"])
        figure = row.get(column)
        if row.get("status") == "done" and isinstance(figure, int | float):
            value[(row["config"], row["capture"], row["seed"])] = float(figure)
    sign = 1.0 if higher_is_better else -1.0
    pairs = []
    for a, b in itertools.combinations(configs, 2):
        keys = sorted(
            {(c, s) for (cfg, c, s) in value if cfg == a} & {(c, s) for (cfg, c, s) in value if cfg == b}
        )
        diffs = [value[(a, c, s)] - value[(b, c, s)] for c, s in keys]
        captures = sorted({c for c, _ in keys})
        per_capture = {
            c: float(np.mean([d for (cc, _), d in zip(keys, diffs, strict=True) if cc == c]))
            for c in captures
        }
        pairs.append(
            {
                "a": a,
                "b": b,
                "pairs": len(diffs),
                "a_wins": sum(1 for d in diffs if sign * d > 0),
                "b_wins": sum(1 for d in diffs if sign * d < 0),
                "ties": sum(1 for d in diffs if d == 0),
                "mean_diff": float(np.mean(diffs)) if diffs else None,
                "min_diff": float(np.min(diffs)) if diffs else None,
                "max_diff": float(np.max(diffs)) if diffs else None,
                "captures_a": sum(1 for d in per_capture.values() if sign * d > 0),
                "captures_b": sum(1 for d in per_capture.values() if sign * d < 0),
                "captures": len(captures),
            }
        )
    return pairs


def _curves_figure(rows: Sequence[dict[str, Any]], capture: str, path: Path) -> str | None:
    plt = pyplot()

    mine = [r for r in rows if r["capture"] == capture and r.get("status") == "done" and r.get("curve")]
    if not mine:
        return None
    configs = list(dict.fromkeys(r["config"] for r in mine))
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for row in mine:
        curve = np.asarray(json.loads(row["curve"]), dtype=np.float64).reshape(-1, 2)
        index = configs.index(row["config"])
        first = all(r["config"] != row["config"] for r in mine[: mine.index(row)])
        ax.plot(
            curve[:, 0],
            curve[:, 1],
            "-o",
            ms=2.5,
            color=colours(index % 10),
            alpha=0.85,
            label=row["config"] if first else None,
        )
    kinds = {r.get("curve_kind") for r in mine}
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("test PSNR (dB)" if kinds == {"test"} else "PSNR (dB, training batches)")
    ax.set_title(capture)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path).name


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "capture"


def _capture(rows: Sequence[dict[str, Any]], capture: str, figures: list[str], out: Path) -> Section:
    """Every run of ``capture``, the mean and standard deviation over seeds, its curves' figure."""
    mine = [r for r in rows if r["capture"] == capture]
    runs = [
        [r["config"], str(r["seed"]), str(r.get("status")), _fmt(r.get("steps")),
         *[_fmt(r.get(f)) for f in figures], _fmt(r.get("train_s"), 1), _fmt(r.get("rays_per_s"), 0),
         _fmt(r.get("loader_wait_fraction"), 3), _fmt(r.get("peak_rss_mb"), 0)]
        for r in mine
    ]  # fmt: skip
    stats = {f: summarise(mine, f) for f in figures}
    summary = [
        [config, str(stats[figures[0]].get((capture, config), {}).get("n", 0)) if figures else "0",
         *[(f"{s['mean']:.3f} ± {s['std']:.3f}" if (s := stats[f].get((capture, config))) else "-")
           for f in figures]]
        for config in dict.fromkeys(r["config"] for r in rows)
    ]  # fmt: skip
    header = ["config", "seed", "status", "steps", *figures, "train s", "rays/s", "loader wait", "peak MB"]
    blocks: list[Block] = [
        Table(header, runs),
        para("Mean ± standard deviation over seeds:"),
        Table(["config", "seeds", *figures], summary),
    ]
    name = _curves_figure(rows, capture, out / "figures" / f"curves-{_slug(capture)}.png")
    if name is not None:
        blocks.append(Figure(name, f"curves {capture}"))
    return Section(f"Capture: {capture}", blocks)


def _paired(rows: Sequence[dict[str, Any]], column: str, higher: bool) -> Section:
    table = [
        [p["a"], p["b"], *(str(p[k]) for k in ("pairs", "a_wins", "b_wins", "ties")), _fmt(p["mean_diff"]),
         f"{_fmt(p['min_diff'])} .. {_fmt(p['max_diff'])}",
         f"{p['captures_a']} / {p['captures_b']} of {p['captures']}"]
        for p in paired_comparison(rows, column, higher)
    ]  # fmt: skip
    header = [
        "A",
        "B",
        "pairs",
        "A wins",
        "B wins",
        "ties",
        "mean A - B",
        "range",
        "captures won (mean) A / B",
    ]
    return Section("Paired comparison", [
        para("Each pair of configurations on the (capture, seed) pairs both finished: wins on ", Code(column),
             ", and the difference A - B."),
        Table(header, table),
    ])  # fmt: skip


def _sections(out: Path, rows: Sequence[dict[str, Any]], metric: str) -> list[Section]:
    higher = not any(word in metric.lower() for word in LOWER_IS_BETTER)
    column = primary_column(rows, metric)
    done = [r for r in rows if r.get("status") == "done"]
    failed = [r for r in rows if r.get("status") != "done"]
    captures = list(dict.fromkeys(r["capture"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    seeds = ", ".join(str(s) for s in sorted({r["seed"] for r in rows}))
    overview: list[Block] = [
        para(f"{len(rows)} runs: {len(done)} finished, {len(failed)} failed; {len(captures)} captures x "
             f"{len(configs)} configurations x seeds {seeds}. Compared on ", Code(column or metric),
             f" ({'higher' if higher else 'lower'} is better)."),
    ]  # fmt: skip
    if failed:
        errors = [[r["capture"], r["config"], str(r["seed"]), str(r.get("error"))] for r in failed]
        overview.append(Table(["capture", "config", "seed", "error"], errors))
    sections = [Section("Runs", overview)]
    sections += [_capture(rows, capture, metric_columns(rows), out) for capture in captures]
    if column is not None and len(configs) > 1:
        sections.append(_paired(rows, column, higher))
    timing = [
        [r["capture"], r["config"], str(r["seed"]),
         *(_fmt(r.get(k), 1) for k in ("wall_s", "train_s", "eval_s", "overhead_s"))]
        for r in done
    ]  # fmt: skip
    costs: list[Block] = [
        para("Wall time of each run, its training and evaluation time, and the rest (overhead: process "
             "start, checkpoints, records)."),
        Table(["capture", "config", "seed", "wall s", "train s", "eval s", "overhead s"], timing),
    ]  # fmt: skip
    return [*sections, Section("Costs", costs)]


def write_report(out: Path) -> Path:
    """Write ``OUT/report.md`` and ``OUT/report.html`` from ``OUT/results.parquet``; return the first."""
    rows = read_results(out)
    record_path = out / "sweep.json"
    metric = "psnr"
    if record_path.is_file():
        with contextlib.suppress(ValueError):
            metric = json.loads(record_path.read_text()).get("metric", metric)
    md, _ = render_report(out, f"raykit sweep: {out.resolve().name}", _sections(out, rows, metric))
    return md
