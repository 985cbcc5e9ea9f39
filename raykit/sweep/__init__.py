"""raykit.sweep: ``raykit sweep SPEC OUT``, experiments over captures x configurations x seeds.

SPEC (TOML, :mod:`raykit.sweep.spec`) names the captures, the trainer configurations (a grid or a list
over any ``TrainConfig`` field), the seeds and the evaluation. Each capture is converted once by
``raykit run``'s stages; each run (identity: store fingerprint, config hash, seed, raykit version)
trains and evaluates through them in ``OUT/runs/<id>/`` (:mod:`raykit.sweep.runs`), locally or on a
Dask cluster (:mod:`raykit.sweep.executors`); a finished run is never run again. Results:
``OUT/results.parquet`` and ``results.csv`` (:mod:`raykit.sweep.results`), ``OUT/report.md`` and
``report.html`` (:mod:`raykit.sweep.report`), and optionally MLflow (:mod:`raykit.sweep.tracking`).
OUT holds only what the sweep wrote (a folder with other files is refused); a SPEC of more than
``MAX_RUNS`` runs is refused with its count; when every run failed, :class:`RunsFailedError`.
"""

from __future__ import annotations

from raykit.sweep.report import paired_comparison, summarise, write_report
from raykit.sweep.results import RESULTS, read_results, write_results
from raykit.sweep.runs import TIMING_COLUMNS, RunTask, comparable, execute_run, run_identity
from raykit.sweep.spec import MAX_RUNS, Capture, Configuration, SweepSpec, config_hash, load_spec
from raykit.sweep.sweep import SWEEP_FILE, RunsFailedError, SweepOptions, plan_sweep, run_sweep

__all__ = [
    "MAX_RUNS",
    "RESULTS",
    "SWEEP_FILE",
    "TIMING_COLUMNS",
    "Capture",
    "Configuration",
    "RunTask",
    "RunsFailedError",
    "SweepOptions",
    "SweepSpec",
    "comparable",
    "config_hash",
    "execute_run",
    "load_spec",
    "paired_comparison",
    "plan_sweep",
    "read_results",
    "run_identity",
    "run_sweep",
    "summarise",
    "write_report",
    "write_results",
]
