"""The sweep's report: ``OUT/report.md`` and a self-contained ``OUT/report.html``, from ``results.parquet``.

Sections: the runs (finished, failed and why); per capture, a table of every run and the mean and
standard deviation over seeds of each configuration; a paired comparison of the configurations (for
each pair, on how many (capture, seed) pairs each wins on the SPEC's metric, and by how much); and
PSNR against training time, one figure per capture (``OUT/figures/curves-<capture>.png``).
"""

from __future__ import annotations

import base64
import contextlib
import html
import itertools
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raykit.fileio import atomic_path, atomic_write_bytes
from raykit.sweep.results import read_results
from raykit.sweep.spec import LOWER_IS_BETTER

__all__ = ["Section", "paired_comparison", "summarise", "write_report"]

# A section is a title and blocks: ("text", str), ("table", header, rows) or ("image", path, alt).
Section = tuple[str, list[tuple[Any, ...]]]
SKIP_FIGURES = ("n_images", "seconds")

_CSS = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #bbb;padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;margin:.5em 0}
code{background:#eee;padding:0 3px}"""


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return path.name


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "capture"


def _sections(out: Path, rows: Sequence[dict[str, Any]], metric: str) -> list[Section]:
    higher = not any(word in metric.lower() for word in LOWER_IS_BETTER)
    column = primary_column(rows, metric)
    figures = metric_columns(rows)
    done = [r for r in rows if r.get("status") == "done"]
    failed = [r for r in rows if r.get("status") != "done"]
    captures = list(dict.fromkeys(r["capture"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    overview: list[tuple[Any, ...]] = [
        (
            "text",
            f"{len(rows)} runs: {len(done)} finished, {len(failed)} failed; "
            f"{len(captures)} captures x {len(configs)} configurations x seeds "
            f"{', '.join(str(s) for s in sorted({r['seed'] for r in rows}))}. "
            f"Compared on `{column or metric}` ({'higher' if higher else 'lower'} is better).",
        )
    ]
    if failed:
        overview.append(
            (
                "table",
                ["capture", "config", "seed", "error"],
                [[r["capture"], r["config"], str(r["seed"]), str(r.get("error"))] for r in failed],
            )
        )
    sections: list[Section] = [("Runs", overview)]
    for capture in captures:
        mine = [r for r in rows if r["capture"] == capture]
        header = [
            "config",
            "seed",
            "status",
            "steps",
            *figures,
            "train s",
            "rays/s",
            "loader wait",
            "peak MB",
        ]
        table = [
            [
                r["config"],
                str(r["seed"]),
                str(r.get("status")),
                _fmt(r.get("steps")),
                *[_fmt(r.get(f)) for f in figures],
                _fmt(r.get("train_s"), 1),
                _fmt(r.get("rays_per_s"), 0),
                _fmt(r.get("loader_wait_fraction"), 3),
                _fmt(r.get("peak_rss_mb"), 0),
            ]
            for r in mine
        ]
        stats = {f: summarise(mine, f) for f in figures}
        summary = [
            [
                config,
                str(stats[figures[0]].get((capture, config), {}).get("n", 0)) if figures else "0",
                *[
                    (f"{s['mean']:.3f} ± {s['std']:.3f}" if (s := stats[f].get((capture, config))) else "-")
                    for f in figures
                ],
            ]
            for config in configs
        ]
        blocks: list[tuple[Any, ...]] = [
            ("table", header, table),
            ("text", "Mean ± standard deviation over seeds:"),
            ("table", ["config", "seeds", *figures], summary),
        ]
        name = _curves_figure(rows, capture, out / "figures" / f"curves-{_slug(capture)}.png")
        if name is not None:
            blocks.append(("image", f"figures/{name}", f"curves {capture}"))
        sections.append((f"Capture: {capture}", blocks))
    if column is not None and len(configs) > 1:
        pairs = paired_comparison(rows, column, higher)
        table = [
            [
                p["a"],
                p["b"],
                str(p["pairs"]),
                str(p["a_wins"]),
                str(p["b_wins"]),
                str(p["ties"]),
                _fmt(p["mean_diff"]),
                f"{_fmt(p['min_diff'])} .. {_fmt(p['max_diff'])}",
                f"{p['captures_a']} / {p['captures_b']} of {p['captures']}",
            ]
            for p in pairs
        ]
        sections.append(
            (
                "Paired comparison",
                [
                    (
                        "text",
                        f"Each pair of configurations on the (capture, seed) pairs both finished: wins on "
                        f"`{column}`, and the difference A - B.",
                    ),
                    (
                        "table",
                        [
                            "A",
                            "B",
                            "pairs",
                            "A wins",
                            "B wins",
                            "ties",
                            "mean A - B",
                            "range",
                            "captures won (mean) A / B",
                        ],
                        table,
                    ),
                ],
            )
        )
    timing = [
        [
            r["capture"],
            r["config"],
            str(r["seed"]),
            _fmt(r.get("wall_s"), 1),
            _fmt(r.get("train_s"), 1),
            _fmt(r.get("eval_s"), 1),
            _fmt(r.get("overhead_s"), 1),
        ]
        for r in done
    ]
    sections.append(
        (
            "Costs",
            [
                (
                    "text",
                    "Wall time of each run, its training and evaluation time, and the rest (overhead: "
                    "process start, checkpoints, records).",
                ),
                ("table", ["capture", "config", "seed", "wall s", "train s", "eval s", "overhead s"], timing),
            ],
        )
    )
    return sections


def _markdown(title: str, sections: list[Section]) -> str:
    lines = [f"# {title}", ""]
    for heading, blocks in sections:
        lines += [f"## {heading}", ""]
        for block in blocks:
            if block[0] == "text":
                lines += [block[1], ""]
            elif block[0] == "table":
                header, body = block[1], block[2]
                lines.append("| " + " | ".join(header) + " |")
                lines.append("|" + "|".join("---" for _ in header) + "|")
                lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in body]
                lines.append("")
            else:
                lines += [f"![{block[2]}]({block[1]})", ""]
    return "\n".join(lines)


def _html(out: Path, title: str, sections: list[Section]) -> str:
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
    ]
    code = re.compile(r"`([^`]*)`")
    for heading, blocks in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        for block in blocks:
            if block[0] == "text":
                parts.append("<p>" + code.sub(r"<code>\1</code>", html.escape(block[1])) + "</p>")
            elif block[0] == "table":
                head = "".join(f"<th>{html.escape(h)}</th>" for h in block[1])
                body = "".join(
                    "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in block[2]
                )
                parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            else:
                data = base64.b64encode((out / block[1]).read_bytes()).decode()
                parts.append(f"<img alt='{html.escape(block[2])}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(out: Path) -> Path:
    """Write ``OUT/report.md`` and ``OUT/report.html`` from ``OUT/results.parquet``; return the first."""
    rows = read_results(out)
    record_path = out / "sweep.json"
    metric = "psnr"
    if record_path.is_file():
        with contextlib.suppress(ValueError):
            metric = json.loads(record_path.read_text()).get("metric", metric)
    sections = _sections(out, rows, metric)
    title = f"raykit sweep: {out.resolve().name}"
    md = out / "report.md"
    atomic_write_bytes(md, (_markdown(title, sections) + "\n").encode(), sync=False)
    atomic_write_bytes(out / "report.html", _html(out, title, sections).encode(), sync=False)
    return md
