"""``OUT/results.parquet`` and ``OUT/results.csv``: one row per run, in the SPEC's order.

Columns: the identity (``run_id``, ``capture``, ``config``, ``seed``, fingerprints, ``config_hash``,
``raykit_version``), ``status`` and ``error``, ``steps``, every figure of the run's ``eval.json``
(``<split>_<metric>``, read generically), the measurements (``wall_s``, ``train_s``, ``eval_s``,
``overhead_s``, ``rays_per_s``, ``loader_wait_fraction``, peak memory) and every config field
(``config.<field>``). Both files are written atomically after every finished run.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError
from raykit.fileio import atomic_path, atomic_write_bytes

__all__ = ["RESULTS", "column_order", "read_results", "write_results"]

RESULTS = "results.parquet"
FIRST = ("run_id", "capture", "config", "seed", "status", "error", "steps")


def column_order(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Identity and status first, then metrics and measurements as first seen, config fields last."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    rest = [c for c in seen if c not in FIRST]
    return (
        [c for c in FIRST if c in seen]
        + [c for c in rest if not c.startswith("config.")]
        + [c for c in rest if c.startswith("config.")]
    )


def _cell(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value


def write_results(out: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``OUT/results.parquet`` and ``OUT/results.csv``; return the parquet path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = column_order(rows)
    data: dict[str, list[Any]] = {c: [_cell(r.get(c)) for r in rows] for c in columns}
    arrays = {}
    for name, values in data.items():
        if any(isinstance(v, float) for v in values) and all(
            v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in values
        ):
            values = [None if v is None else float(v) for v in values]
        arrays[name] = pa.array(values)
    table = pa.table(arrays) if arrays else pa.table({"run_id": pa.array([], pa.string())})
    path = out / RESULTS
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else _cell(row.get(c)) for c in columns])
    atomic_write_bytes(out / "results.csv", text.getvalue().encode(), sync=False)
    return path


def read_results(out: Path) -> list[dict[str, Any]]:
    """The rows of ``OUT/results.parquet``."""
    import pyarrow.parquet as pq

    path = out / RESULTS
    if not path.is_file():
        raise ConfigError(f"{path}: not found (not a sweep folder, or no run finished yet)")
    try:
        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises its own errors for a damaged file
        raise ConfigError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc
    return rows
