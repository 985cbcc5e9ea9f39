"""One run of a sweep: its identity, its task (picklable, for any executor) and its result row.

A run is named by its identity, the sha256 of the store fingerprint, the config hash, the seed and the
raykit version; it lives in ``OUT/runs/<id[:16]>/``. There ``raykit run``'s stages do the work
(:func:`raykit.pipeline.training_stage`, then :func:`raykit.pipeline.export_stage` when asked) through
a :class:`raykit.pipeline.StageRunner` with its own ``pipeline.json``: a killed run resumes training
from its newest checkpoint, machine faults are retried, bad input is not. ``row.json``, written
(atomically) last, marks the run finished: a finished run is never run again.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import raykit
from raykit.errors import ConfigError, RaykitError
from raykit.fileio import atomic_write_json, json_safe, read_json
from raykit.locks import lock_owner, lock_path
from raykit.pipeline import (
    StageError,
    StageRunner,
    WarmStarter,
    export_stage,
    fingerprint,
    machine_fault,
    read_jsonl,
    training_stage,
)
from raykit.sweep.spec import Capture, Configuration, config_hash
from raykit.trainer import TrainConfig

__all__ = [
    "ROW_FILE",
    "TIMING_COLUMNS",
    "RunTask",
    "execute_run",
    "finished_row",
    "run_identity",
    "run_tasks",
]

ROW_FILE = "row.json"
RUNS = "runs"
# Row columns that measure time or the machine: they differ between two sweeps of the same runs.
TIMING_COLUMNS = (
    "wall_s",
    "train_s",
    "eval_s",
    "overhead_s",
    "rays_per_s",
    "peak_rss_mb",
    "peak_gpu_mb",
    "loader_wait_fraction",
    "train_peak_memory_mb",
    "finished_at",
    "executor",
    "threads",
    "host",
    "curve",
    "attempts",
)


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` less what measures time or the machine (``TIMING_COLUMNS``, every ``*_seconds`` figure
    of eval.json): what two sweeps of the same runs must agree on."""
    return {k: v for k, v in row.items() if k not in TIMING_COLUMNS and not k.endswith("_seconds")}


def run_identity(store_fp: str, config: TrainConfig, seed: int, version: str = raykit.__version__) -> str:
    """sha256 of what decides a run's result: store fingerprint, config hash, seed, raykit version."""
    return fingerprint({"store": store_fp, "config": config_hash(config), "seed": seed, "raykit": version})


@dataclass(frozen=True)
class RunTask:
    """Everything a worker needs to execute one run (plain data: it travels to Dask workers)."""

    run_id: str
    index: int
    run_dir: str
    capture: str
    config_name: str
    seed: int
    store_url: str
    store_fp: str
    source_fp: str
    train: dict[str, Any]  # TrainConfig.to_dict(), store/out/seed set, threads left to the executor
    export: bool
    retries: int

    @property
    def label(self) -> str:
        return f"{self.capture} / {self.config_name} / seed {self.seed}"


def run_tasks(
    out: Path,
    captures: Iterable[Capture],
    stores: dict[str, dict[str, Any]],
    configs: Iterable[Configuration],
    seeds: Iterable[int],
    *,
    export: bool,
    retries: int,
) -> list[RunTask]:
    """Every run, captures x configurations x seeds, in that order. ``stores``: capture name ->
    ``{"url", "output" (store fingerprint), "source"}``."""
    tasks: list[RunTask] = []
    configs, seeds = list(configs), list(seeds)
    for capture in captures:
        store = stores[capture.name]
        for config in configs:
            for seed in seeds:
                run_id = run_identity(store["output"], config.train, seed)
                run_dir = out / RUNS / run_id[:16]
                train = config.train.replace(
                    store=store["url"], out=str(run_dir / "train"), seed=seed, resume=True, progress=False
                )
                tasks.append(
                    RunTask(
                        run_id,
                        len(tasks),
                        str(run_dir),
                        capture.name,
                        config.name,
                        seed,
                        store["url"],
                        store["output"],
                        store["source"],
                        train.to_dict(),
                        export,
                        retries,
                    )
                )
    return tasks


ROW_LIMIT = 16 << 20  # bytes of a row.json (a row with its curve is kilobytes)


def finished_row(task: RunTask) -> dict[str, Any] | None:
    """The row of a run that finished (successfully) under this identity, else None."""
    path = Path(task.run_dir) / ROW_FILE
    try:
        row = read_json(path, limit=ROW_LIMIT)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path}: unreadable run row ({text}); remove it to rerun the run") from None
    if not isinstance(row, dict):
        raise ConfigError(
            f"{path}: expected a JSON object (a run's row), got {type(row).__name__}; remove it to rerun "
            "the run"
        )
    return row if row.get("run_id") == task.run_id and row.get("status") == "done" else None


def _metrics(run_dir: Path) -> dict[str, Any]:
    """Every figure of ``eval.json``, read generically: ``<split>_<name>`` for each number or string
    of each split (means over images), and the protocol block (any top-level table but the splits)."""
    evaluation = read_json(run_dir / "eval.json")
    columns: dict[str, Any] = {}
    for split, figures in evaluation.get("splits", {}).items():
        for name, value in figures.items():
            if name == "images":
                continue
            if isinstance(value, bool | int | float | str):
                columns[f"{split}_{name}"] = value
            elif isinstance(value, dict):
                columns[f"{split}_{name}"] = json.dumps(value, sort_keys=True)
    for name, value in evaluation.items():
        if name not in ("splits", "step", "checkpoint"):
            columns[f"eval_{name}"] = (
                json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value
            )
    return columns


def _identity_columns(task: RunTask) -> dict[str, Any]:
    return {
        "run_id": task.run_id,
        "capture": task.capture,
        "config": task.config_name,
        "seed": task.seed,
        "store_fingerprint": task.store_fp,
        "source_fingerprint": task.source_fp,
        "config_hash": config_hash(TrainConfig.from_dict(task.train)),
        "raykit_version": raykit.__version__,
    }


def _config_columns(config: TrainConfig) -> dict[str, Any]:
    skip = ("store", "out", "seed", "resume", "force", "progress")
    return {f"config.{k}": v for k, v in config.to_dict().items() if k not in skip}


_STARTER: list[WarmStarter] = []
_STARTER_LOCK = threading.Lock()
# What every trainer child imports (torch._dynamo: torch's optimisers import it on first use).
PRELOAD = ("raykit.trainer.__main__", "torch._dynamo")


def warm_starter() -> WarmStarter:
    """This process's :class:`raykit.pipeline.WarmStarter` of trainer children (made once)."""
    with _STARTER_LOCK:
        if not _STARTER:
            _STARTER.append(WarmStarter(PRELOAD))
        return _STARTER[0]


def execute_run(task: RunTask, threads: int | None = None, executor: str = "local") -> dict[str, Any]:
    """Run ``task`` (train, evaluate, export when asked) and return its row; never raises for a failed
    run: the row says ``status = "failed"`` and why. ``threads``: torch threads of the trainer, unless
    the configuration sets them."""
    run_dir = Path(task.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = TrainConfig.from_dict(task.train)
    if config.threads is None and threads is not None:
        config = config.replace(threads=threads)
    row: dict[str, Any] = {**_identity_columns(task), "status": "failed", "error": None}
    row.update(_config_columns(config))
    log = (run_dir / "sweep.log").open("a")

    def echo(line: str) -> None:
        log.write(line + "\n")
        log.flush()

    started = time.perf_counter()
    runner: StageRunner | None = None
    try:
        owner = lock_owner(lock_path(config.out))
        if owner is not None:  # a trainer of an earlier sweep still runs there: never a second one
            raise ConfigError(
                f"{config.out}: a trainer still runs in this run folder (pid {owner.get('pid', '?')} on "
                f"host {owner.get('host', '?')}); rerun the sweep once it has ended"
            )
        runner = StageRunner(run_dir, task.retries, echo=echo, root=run_dir.parent.parent)
        summary = runner.execute(training_stage(config, task.store_fp, "train", starter=warm_starter()))
        if task.export:
            exported = runner.execute(export_stage(summary, run_dir, "model"))
            row["export_path"] = Path(exported["path"]).relative_to(run_dir.parent.parent).as_posix()
            row["export_verify_db"] = (exported.get("verify") or {}).get("difference_db")
        row.update(_measurements(run_dir, summary))
        row["status"] = "done"
    except Exception as exc:  # a failed run is a row, never the end of the sweep
        echo("".join(traceback.format_exception(exc)))
        kind = "machine" if machine_fault(exc) else "input" if isinstance(exc, RaykitError) else "error"
        if isinstance(exc, StageError):
            kind = "machine" if exc.machine else "input"
        row["error"] = f"{kind}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    finally:
        log.close()
    row["wall_s"] = time.perf_counter() - started
    if runner is not None:
        record = runner.records.get("train") or {}
        row["attempts"] = len(record.get("attempts", []))
        row["peak_rss_mb"] = record.get("peak_rss_mb")
        row["peak_gpu_mb"] = record.get("peak_gpu_mb")
    train_s, eval_s = row.get("train_s"), row.get("eval_s")
    if row["status"] == "done" and train_s is not None:
        row["overhead_s"] = max(row["wall_s"] - train_s - (eval_s or 0.0), 0.0)
    row.update(executor=executor, threads=config.threads, host=os.uname().nodename, finished_at=time.time())
    atomic_write_json(run_dir / ROW_FILE, json_safe(row))
    return dict(json_safe(row))


def _measurements(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Steps, metrics, training and evaluation seconds, rays/s, loader wait, the PSNR-against-time curve."""
    train_dir = Path(summary["run_dir"])
    evaluation = read_json(train_dir / "eval.json")
    eval_s = sum(float(f.get("seconds") or 0.0) for f in evaluation.get("splits", {}).values())
    log = read_jsonl(train_dir / "log.jsonl")
    if summary["progress"]:
        curve = [[p["elapsed_s"], p["psnr"]] for p in summary["progress"] if p.get("psnr") is not None]
        curve_kind = "test"
    else:  # no quick checks: the training batches' PSNR
        curve = [[r["elapsed_s"], r["psnr"]] for r in log if r.get("psnr") is not None]
        curve_kind = "train"
    return {
        "steps": summary["step"],
        **_metrics(train_dir),
        "train_s": summary["elapsed_s"],
        "eval_s": eval_s,
        "rays_per_s": summary["rays_per_s"],
        "loader_wait_fraction": summary["loader_wait_fraction"],
        "train_peak_memory_mb": summary["memory_mb"],
        "samples_per_ray": summary["samples_per_ray"],
        "curve_kind": curve_kind,
        "curve": json.dumps(curve),
    }
