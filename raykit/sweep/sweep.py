"""``run_sweep``: check the SPEC, convert each capture once, run what has not finished, write the results
and the report (the order: docs/architecture.md, ``raykit.sweep``).

Everything is checked before any run starts: the SPEC, OUT (new, empty or a sweep's own folder:
``sweep.json``; files the sweep did not write are never overwritten), ``--scheduler`` and the tracking
server, and every run's identity (two runs with one identity are an error). ``OUT/sweep.json``
records each invocation: which runs it ran and which it found finished. Each trainer leads its own
process group, dies with the sweep (a SIGKILLed sweep included) and holds its run folder's lock while
it trains: a rerun never trains a second process into a live run folder.
"""

from __future__ import annotations

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
from raykit.errors import ConfigError, RaykitError
from raykit.fileio import atomic_write_json, read_bounded, read_json, replace_dir
from raykit.options import config_problems, option
from raykit.pipeline import (
    RunConfig,
    StageConfigs,
    StageRunner,
    capture_and_store,
    check_run_folder,
    fingerprint,
    tree_fingerprint,
)
from raykit.poses import PoseOptions
from raykit.ranges import Range
from raykit.sweep.executors import check_scheduler, run_dask, run_local
from raykit.sweep.report import write_report
from raykit.sweep.results import write_results
from raykit.sweep.runs import RunTask, finished_row, run_tasks, warm_starter
from raykit.sweep.spec import SPEC_LIMIT, Capture, SweepSpec, load_spec
from raykit.trainer import TrainConfig

__all__ = ["SWEEP_FILE", "RunsFailedError", "SweepOptions", "plan_sweep", "read_record", "run_sweep"]

SWEEP_FILE = "sweep.json"
SWEEP_LOCK = "sweep.lock"  # held by the one `raykit sweep` writing OUT (raykit.store.lock)
TRACKERS = ("none", "mlflow")
FORMAT = "raykit-sweep"
RECORD_LIMIT = 64 << 20  # bytes of sweep.json (a record per invocation of at most MAX_RUNS runs)


@dataclass(frozen=True)
class SweepOptions:
    """How a sweep executes (never what it computes: that is the SPEC)."""

    jobs: int = option(
        1, "local: concurrent runs, the machine's cores split between them", valid=Range(1, integer=True)
    )
    scheduler: str | None = option(
        None,
        "run on the Dask cluster at URL (tcp://host:8786); workers' GPU resources held one per run",
        metavar="URL",
    )
    retries: int = option(
        0,
        "retry a run's stage that failed for a machine reason (killed, out of memory, I/O)",
        valid=Range(0, integer=True),
    )
    tracking: str = option("none", "also log each run to MLflow (the mlflow extra)", choices=TRACKERS)
    tracking_uri: str | None = option(
        None, "MLflow tracking server or store (default: sqlite:///OUT/mlflow.db)", metavar="URI"
    )
    threads: int | None = option(None, "CPU threads of the conversions (default: the converter's choice)")

    def __post_init__(self) -> None:
        if problems := config_problems(self):  # --jobs, --retries in range, --tracking known
            raise ConfigError(problems[0])
        if self.scheduler is not None and "://" not in self.scheduler:
            raise ConfigError(
                f"--scheduler: expected an address like tcp://host:8786, got {self.scheduler!r}"
            )
        if self.tracking_uri is not None and "://" not in self.tracking_uri:
            raise ConfigError(
                "--tracking-uri: expected a URI with its scheme, like http://host:5000 or "
                f"sqlite:///path/mlflow.db, got {self.tracking_uri!r}"
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
        replace_dir(tmp / "scene", dst)
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
    results = capture_and_store(cfg, folder, StageRunner(folder, options.retries, echo=echo, root=out))
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
    """``OUT/sweep.json``: the plan and each invocation (what it ran, what it found finished). Written
    first (before any conversion): it is what makes OUT a sweep folder (``check_run_folder``)."""

    def __init__(self, out: Path, spec: SweepSpec, options: SweepOptions) -> None:
        self.path = out / SWEEP_FILE
        previous = read_record(out) if self.path.is_file() else {}
        self.data: dict[str, Any] = {
            "format": FORMAT,
            "version": 1,
            "spec": spec.path,
            "spec_fingerprint": fingerprint(
                read_bounded(spec.path, limit=SPEC_LIMIT).decode(errors="replace")
            ),
            "raykit_version": raykit.__version__,
            "metric": spec.metric,
            "runs": previous.get("runs", []),
            "invocations": list(previous.get("invocations", [])),
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
        self.save()

    def plan(self, tasks: list[RunTask]) -> None:
        self.data["runs"] = [
            {"run_id": t.run_id, "label": t.label, "dir": Path(t.run_dir).name} for t in tasks
        ]

    def save(self) -> None:
        with self.lock:
            atomic_write_json(self.path, self.data, sync=False)


def read_record(out: Path) -> dict[str, Any]:
    """``OUT/sweep.json``, read bounded (``fileio.read_json``) and checked to be a sweep's record."""
    path = out / SWEEP_FILE
    try:
        data = read_json(path, limit=RECORD_LIMIT)
    except (OSError, ValueError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path}: unreadable sweep record ({text}); remove it to start over") from None
    problem = None
    if not isinstance(data, dict):
        problem = f"expected a JSON object, got {type(data).__name__}"
    elif data.get("format", FORMAT) != FORMAT:
        problem = f"expected format {FORMAT!r}, got {data.get('format')!r}"
    elif not isinstance(data.get("invocations", []), list) or not all(
        isinstance(i, dict) for i in data.get("invocations", [])
    ):
        problem = "expected 'invocations' to be a list of objects"
    elif not isinstance(data.get("runs", []), list):
        problem = "expected 'runs' to be a list"
    if problem:
        raise ConfigError(f"{path}: not a sweep record ({problem}); remove it to start over"[:400])
    return dict(data)


class RunsFailedError(RaykitError, RuntimeError):
    """Every run of a sweep failed (its report says why, run by run)."""


def run_sweep(spec_path: str | Path, out: str | Path, options: SweepOptions | None = None) -> Path:
    """Run the sweep SPEC into OUT (see the module); return the path of ``report.md``.

    Before anything is converted: OUT must be new, empty or a sweep's own folder (files the sweep did
    not write are never overwritten), ``--scheduler`` and the tracking server must answer.

    Raises:
        ConfigError: bad SPEC, OUT, records or options (one line).
        RunsFailedError: every run failed (after the results and the report are written).
    """
    options = options or SweepOptions()
    out = Path(out)
    spec = load_spec(spec_path)
    check_run_folder(out, record=SWEEP_FILE, lock=SWEEP_LOCK, command="raykit sweep", read=read_record)
    if options.scheduler:
        check_scheduler(options.scheduler)
    if options.tracking == "mlflow":
        from raykit.sweep.tracking import check_tracking

        check_tracking(options.tracking_uri)
    out.mkdir(parents=True, exist_ok=True)
    from raykit.locks import store_lock

    with store_lock(out, path=out / SWEEP_LOCK, what="sweep folder"):  # one `raykit sweep` per OUT
        record = _Record(out, spec, options)
        tracker = None
        if options.tracking == "mlflow":
            from raykit.sweep.tracking import MlflowTracker

            tracker = MlflowTracker(options.tracking_uri, out, spec)  # its store checked before any run
        return _sweep_locked(spec, out, options, tracker, record)


def _sweep_locked(spec: SweepSpec, out: Path, options: SweepOptions, tracker: Any, record: _Record) -> Path:
    started = time.perf_counter()
    if not options.scheduler:
        warm_starter().start()  # torch and the trainer imported once, while the captures convert
    tasks = plan_sweep(spec, out, options)
    record.plan(tasks)
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
    if failed and len(failed) == len(ordered):
        first = str(failed[0].get("error") or "unknown").splitlines()[0][:300]
        raise RunsFailedError(
            f"{out}: every run failed ({len(failed)} of {len(ordered)}; the first: {first}); see {report}"
        )
    return report
