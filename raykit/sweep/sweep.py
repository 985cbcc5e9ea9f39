"""``run_sweep``: check the SPEC, convert each capture once, run what has not finished, write the results
and the report.

Order: the SPEC is read and checked (:func:`raykit.sweep.spec.load_spec`); each capture is converted
into ``OUT/stores/<key>/`` by ``raykit run``'s own stages (:func:`raykit.pipeline.capture_and_store`,
make-like: a capture already converted with the same options is not converted again, and two entries
of one capture share a store); every run's identity is computed and two runs with one identity are an
error, all before any run starts. Then the runs without a finished ``row.json`` execute (locally or on
Dask), each finished row updates ``OUT/results.parquet`` and ``OUT/results.csv``, and at the end
``OUT/report.md`` and ``OUT/report.html`` are written. ``OUT/sweep.json`` records each invocation:
which runs it ran and which it found finished.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import raykit
from raykit.converters import ConvertConfig
from raykit.errors import ConfigError
from raykit.fileio import atomic_write_json
from raykit.options import option
from raykit.pipeline import (
    RunConfig,
    StageConfigs,
    StageRunner,
    capture_and_store,
    fingerprint,
    tree_fingerprint,
)
from raykit.poses import PoseOptions
from raykit.sweep.executors import run_dask, run_local
from raykit.sweep.report import write_report
from raykit.sweep.results import write_results
from raykit.sweep.runs import RunTask, finished_row, run_tasks, warm_starter
from raykit.sweep.spec import Capture, SweepSpec, load_spec
from raykit.trainer import TrainConfig

__all__ = ["SWEEP_FILE", "SweepOptions", "plan_sweep", "run_sweep"]

SWEEP_FILE = "sweep.json"
SWEEP_LOCK = "sweep.lock"  # held by the one `raykit sweep` writing OUT (raykit.store.lock)
TRACKERS = ("none", "mlflow")


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep executes (never what it computes: that is the SPEC)."""

    jobs: int = option(1, "local: concurrent runs, the machine's cores split between them")
    scheduler: str | None = option(
        None,
        "run on the Dask cluster at URL (tcp://host:8786); workers' GPU resources held one per run",
        metavar="URL",
    )
    retries: int = option(
        0, "retry a run's stage that failed for a machine reason (killed, out of memory, I/O)"
    )
    tracking: str = option("none", "also log each run to MLflow (the mlflow extra)", choices=TRACKERS)
    tracking_uri: str | None = option(
        None, "MLflow tracking server or store (default: sqlite:///OUT/mlflow.db)", metavar="URI"
    )
    threads: int | None = option(None, "CPU threads of the conversions (default: the converter's choice)")

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ConfigError(f"--jobs: expected >= 1, got {self.jobs}")
        if self.retries < 0:
            raise ConfigError(f"--retries: expected >= 0, got {self.retries}")
        if self.tracking not in TRACKERS:
            raise ConfigError(f"--tracking: expected none or mlflow, got {self.tracking!r}")
        if self.scheduler is not None and "://" not in self.scheduler:
            raise ConfigError(
                f"--scheduler: expected an address like tcp://host:8786, got {self.scheduler!r}"
            )


def _scene_source(capture: Capture, out: Path) -> Path:
    """The built-in scene rendered once into ``OUT/scenes/<key>/`` (Blender form), atomically."""
    from raykit.testing import render_scene, write_blender

    dst = out / "scenes" / f"{capture.scene}-{capture.key()[:12]}"
    if dst.is_dir():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=dst.parent))
    try:
        scene = render_scene(capture.scene, seed=capture.scene_seed, camera_model=capture.camera_model)
        write_blender(scene, tmp / "scene")
        (tmp / "scene").rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def _convert(
    capture: Capture, out: Path, options: SweepOptions, echo: Callable[[str], None]
) -> dict[str, Any]:
    """Convert ``capture`` (or open it, when it is a store) with ``raykit run``'s stages."""
    src = Path(capture.path) if capture.path else _scene_source(capture, out)
    folder = out / "stores" / capture.key()[:16]
    convert = ConvertConfig(
        src=str(src), dst="", progress=False, threads=options.threads, **dict(capture.convert)
    )
    run = RunConfig(
        src=str(src),
        out=str(folder),
        retries=options.retries,
        seed=convert.seed,
        threads=options.threads,
        progress=False,
    )
    cfg = StageConfigs(run=run, convert=convert, poses=PoseOptions(seed=convert.seed), train=TrainConfig())
    folder.mkdir(parents=True, exist_ok=True)
    echo(f"capture {capture.name}: {src}")
    results = capture_and_store(cfg, folder, StageRunner(folder, options.retries, echo=echo))
    store = results["store"]
    source = store["output"] if results["kind"] == "store" else tree_fingerprint(src)
    return {"url": store["url"], "output": store["output"], "source": source, "kind": results["kind"]}


def plan_sweep(
    spec: SweepSpec, out: Path, options: SweepOptions, echo: Callable[[str], None] = print
) -> list[RunTask]:
    """Convert the captures and return every run; raise :class:`ConfigError` when two runs would
    have one identity (two captures that are one store)."""
    stores: dict[str, dict[str, Any]] = {}
    by_store: dict[str, str] = {}
    for capture in spec.captures:
        stores[capture.name] = _convert(capture, out, options, echo)
        fp = stores[capture.name]["output"]
        if fp in by_store:
            raise ConfigError(
                f"{spec.path}: capture {capture.name!r}: the same store as capture {by_store[fp]!r} "
                f"(fingerprint {fp[:16]}): its runs would repeat theirs"
            )
        by_store[fp] = capture.name
    tasks = run_tasks(
        out, spec.captures, stores, spec.configs, spec.seeds, export=spec.export, retries=options.retries
    )
    seen: dict[str, RunTask] = {}
    for task in tasks:  # the spec's checks make this unreachable but for a changed raykit (defensive)
        if task.run_id in seen:
            raise ConfigError(
                f"{spec.path}: run {task.label!r}: the same identity as {seen[task.run_id].label!r}"
            )
        seen[task.run_id] = task
    return tasks


class _Record:
    """``OUT/sweep.json``: the plan and each invocation (what it ran, what it found finished)."""

    def __init__(self, out: Path, spec: SweepSpec, tasks: list[RunTask], options: SweepOptions) -> None:
        self.path = out / SWEEP_FILE
        data: dict[str, Any] = {}
        if self.path.is_file():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    f"{self.path}: unreadable sweep record ({exc}); remove it to start over"
                ) from exc
        self.data: dict[str, Any] = {
            "format": "raykit-sweep",
            "version": 1,
            "spec": spec.path,
            "spec_fingerprint": fingerprint(Path(spec.path).read_text()),
            "raykit_version": raykit.__version__,
            "metric": spec.metric,
            "runs": [{"run_id": t.run_id, "label": t.label, "dir": Path(t.run_dir).name} for t in tasks],
            "invocations": list(data.get("invocations", [])),
        }
        self.invocation: dict[str, Any] = {
            "started": time.time(),
            "executor": f"dask {options.scheduler}" if options.scheduler else f"local --jobs {options.jobs}",
            "skipped": [],
            "ran": [],
            "failed": [],
            "status": "running",
        }
        self.data["invocations"].append(self.invocation)
        self.lock = threading.Lock()

    def save(self) -> None:
        with self.lock:
            atomic_write_json(self.path, self.data, sync=False)


def run_sweep(spec_path: str | Path, out: str | Path, options: SweepOptions | None = None) -> Path:
    """Run the sweep SPEC into OUT (see the module); return the path of ``report.md``."""
    options = options or SweepOptions()
    out = Path(out)
    spec = load_spec(spec_path)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory")
    tracker = None
    if options.tracking == "mlflow":
        from raykit.sweep.tracking import MlflowTracker

        tracker = MlflowTracker(options.tracking_uri, out, spec)  # checks the server before any run
    out.mkdir(parents=True, exist_ok=True)
    from raykit.locks import store_lock

    with store_lock(out, path=out / SWEEP_LOCK, what="sweep folder"):  # one `raykit sweep` per OUT
        return _sweep_locked(spec, out, options, tracker)


def _sweep_locked(spec: SweepSpec, out: Path, options: SweepOptions, tracker: Any) -> Path:
    started = time.perf_counter()
    if not options.scheduler:
        warm_starter().start()  # torch and the trainer imported once, while the captures convert
    tasks = plan_sweep(spec, out, options)
    record = _Record(out, spec, tasks, options)
    rows: dict[str, dict[str, Any]] = {}
    pending = []
    for task in tasks:
        row = finished_row(task)
        if row is None:
            pending.append(task)
        else:
            rows[task.run_id] = row
            record.invocation["skipped"].append(task.run_id)
    record.save()
    if tracker is not None:  # runs that finished before tracking was asked for (or before a kill)
        for task in tasks:
            if task.run_id in rows:
                tracker.log_run(task, rows[task.run_id])
    print(
        f"sweep: {len(tasks)} runs, {len(tasks) - len(pending)} finished before, {len(pending)} to run",
        flush=True,
    )
    lock = threading.Lock()
    done = [0]

    def on_row(task: RunTask, row: dict[str, Any]) -> None:
        with lock:
            rows[task.run_id] = row
            done[0] += 1
            key = "ran" if row.get("status") == "done" else "failed"
            record.invocation[key].append(task.run_id)
            record.save()
            write_results(out, [rows[t.run_id] for t in tasks if t.run_id in rows])
            figure = row.get(f"{spec.metric}") or next(
                (v for k, v in row.items() if k.endswith(f"_{spec.metric}") and isinstance(v, float)), None
            )
            what = f"{spec.metric} {figure:.2f}" if isinstance(figure, float) else row.get("error")
            print(
                f"[{done[0]}/{len(pending)}] {task.label}: {row.get('status')} ({what}, "
                f"{row.get('wall_s') or 0:.1f} s)",
                flush=True,
            )
            if tracker is not None:
                tracker.log_run(task, row)

    if options.scheduler:
        run_dask(pending, options.scheduler, on_row, options.retries)
    else:
        run_local(pending, options.jobs, on_row)
    ordered = [rows[t.run_id] for t in tasks if t.run_id in rows]
    write_results(out, ordered)
    report = write_report(out)
    record.invocation.update(status="done", finished=time.time(), seconds=time.perf_counter() - started)
    record.save()
    if tracker is not None:
        tracker.log_sweep(out, tasks, rows)
    failed = [r for r in ordered if r.get("status") != "done"]
    print(
        f"report: {report} and {report.with_suffix('.html')} ({time.perf_counter() - started:.1f} s; "
        f"ran {len(pending)}, {len(failed)} failed)",
        flush=True,
    )
    return report
