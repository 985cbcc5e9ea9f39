"""``run_pipeline``: the stages in order, each skipped when up to date (see ``raykit.pipeline.runner``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError, SourceError
from raykit.fileio import UntrustedFileError, safe_path
from raykit.pipeline import stages
from raykit.pipeline.config import StageConfigs
from raykit.pipeline.records import PIPELINE_FILE, Records, fingerprint, tree_fingerprint
from raykit.pipeline.runner import Attempt, Stage, StageRunner
from raykit.report import Section

__all__ = ["RUN_LOCK", "ExtraStages", "capture_and_store", "check_run_folder", "run_pipeline"]

RUN_LOCK = "run.lock"  # OUT/run.lock: held by the one `raykit run` writing OUT (raykit.locks)

# Stages a caller adds after evaluation (the demo's comparisons): given the runner and the results so
# far, run them and return the report's extra sections (``raykit.report.Section``).
ExtraStages = Callable[[StageRunner, dict[str, Any]], list[Section]]


def run_pipeline(
    cfg: StageConfigs, *, extra: ExtraStages | None = None, runner: StageRunner | None = None
) -> Path:
    """Run every stage of ``cfg`` into ``cfg.run.out``; return the path of ``report.md``.

    ``runner``: one that already ran stages before these (the demo's scene), on the same folder.
    """
    out, src = Path(cfg.run.out), Path(cfg.run.src)
    if not src.exists():
        raise SourceError(f"{src}: not found")
    check_run_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    from raykit.locks import store_lock

    with store_lock(out, path=out / RUN_LOCK, what="run folder"):  # one `raykit run` per OUT
        return _run_locked(cfg, out, extra, runner)


def check_run_folder(
    out: Path,
    *,
    record: str = PIPELINE_FILE,
    lock: str = RUN_LOCK,
    command: str = "raykit run",
    read: Callable[[Path], object] = Records,
) -> None:
    """Refuse an ``OUT`` that exists and is not a folder of ``command``'s own: such a folder holds its
    ``record`` (``pipeline.json``; ``raykit sweep``: ``sweep.json``), or nothing but the ``lock`` left
    by a command killed before it wrote any. A rerun rewrites and removes what the command wrote in
    there, so nobody else's files (a ``report.md``, a ``results.csv``) may be in it.

    Raises:
        ConfigError: one line naming ``OUT``; nothing is read beyond its listing and its record
            (``read(out)`` checks the record: one line naming it), nothing written or removed.
    """
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory")
    if (out / record).is_file():
        read(out)
        return
    if {p.name for p in out.iterdir()} - {lock}:
        raise ConfigError(
            f"{out}: exists and is not a {command} folder (no {record}); {command} rewrites and removes "
            "what it wrote there on a rerun, so it refuses to write into another folder: choose a new "
            "or empty OUT"
        )


def _run_locked(cfg: StageConfigs, out: Path, extra: ExtraStages | None, runner: StageRunner | None) -> Path:
    runner = runner or StageRunner(out, cfg.run.retries)
    started = time.perf_counter()
    results = capture_and_store(cfg, out, runner)
    url, store_fp = results["store"]["url"], results["store"]["output"]
    results["validate"] = runner.execute(stages.validate_stage(url, store_fp))
    results["profile"] = runner.execute(stages.profile_stage(cfg, url, store_fp))
    runs = {s: runner.execute(stages.train_stage(cfg, url, store_fp, out, s)) for s in cfg.run.sampler_list()}
    for run in runs.values():  # read below: the run folder, its renders
        run_dir = own_path(out, run["run_dir"])
        run["renders"] = [str(own_path(run_dir, p)) for p in run["renders"]]
    results["runs"] = runs
    results["evaluate"] = runner.execute(stages.evaluate_stage(runs))
    results["exports"] = {s: runner.execute(stages.export_stage(r, out, s)) for s, r in runs.items()}
    results["render"] = runner.execute(render_stage(cfg, out, url, runs))
    sections = extra(runner, results) if extra is not None else []
    report = runner.execute(report_stage(cfg, out, runner, results, sections))
    total = time.perf_counter() - started
    print(
        f"report: {report['markdown']} and {report['html']} ({total:.1f} s; ran: "
        f"{', '.join(runner.ran) or 'nothing, all up to date'})",
        flush=True,
    )
    return Path(report["markdown"])


def own_path(folder: Path, recorded: Any) -> Path:
    """A path a stage recorded in ``OUT/pipeline.json``, checked to lie inside ``folder``
    (``fileio.safe_path``): the records of a received run folder cannot point raykit at other files.
    """
    where = str(folder)
    base = os.path.abspath(folder)
    rel = os.path.relpath(os.path.abspath(str(recorded)), base).replace(os.sep, "/")
    try:
        return safe_path(base, rel, where=where)
    except UntrustedFileError as exc:
        raise ConfigError(f"{exc} (a path recorded by a stage must lie in {folder})") from None


def capture_and_store(cfg: StageConfigs, out: Path, runner: StageRunner) -> dict[str, Any]:
    """poses (photos, video) and convert into ``out``; an existing store is used as it is.

    Returns ``{"kind": ..., "store": {"url", "output" (the store's fingerprint), "source_bytes"}}``
    and ``"poses"`` for photos or a video. ``raykit sweep`` converts each capture through it."""
    src = Path(cfg.run.src)
    kind = stages.source_kind(src, cfg.convert.source)
    results: dict[str, Any] = {"kind": kind}
    if kind == "store":
        from raykit.store import open_store

        store = open_store(src)
        results["store"] = {"url": store.url, "output": store.fingerprint, "source_bytes": None}
        return results
    if cfg.train.ray_sampling == "temporal":  # the weights are computed on an images-layout store
        raise ConfigError(
            f"{src}: --ray-sampling temporal trains on a store with ISG/IST weights: `raykit convert "
            f"{src} STORE --layout images`, `raykit add-component STORE temporal`, then give STORE as SRC"
        )
    capture, source_fp = src, tree_fingerprint(src)
    if kind in ("photos", "video"):
        results["poses"] = runner.execute(stages.poses_stage(cfg, out, kind))
        capture, source_fp = own_path(out, results["poses"]["capture"]), results["poses"]["output"]
        if cfg.poses.undistort:
            capture = capture / "undistorted"
    results["store"] = runner.execute(stages.convert_stage(cfg, out, capture, source_fp, kind != "capture"))
    own_path(out, results["store"]["url"])
    return results


def render_stage(cfg: StageConfigs, out: Path, url: str, runs: dict[str, Any]) -> Stage:
    """Test views beside the ground truth: the evaluation's renders (which ``export --verify``
    reproduced from the export) and the store's own pixels, as ``OUT/figures/renders.png``; for a
    capture with times, a test camera over time too (``raykit.pipeline.timeline``: ``OUT/figures/
    test_camera.mp4``)."""
    from raykit.pipeline.report import render_strip
    from raykit.pipeline.timeline import camera_video

    path = out / "figures" / "renders.png"
    videos = [out / "figures" / "test_camera.mp4", out / "figures" / "test_camera.gif"]

    def run(attempt: Attempt) -> dict[str, Any]:
        names = render_strip(url, runs, path, cfg.run.render_views)
        renders = {s: own_path(out, Path(r["run_dir"]) / "renders" / "test") for s, r in runs.items()}
        video = camera_video(url, runs, out / "figures", renders)
        made = tree_fingerprint(path)
        if video is not None:  # a capture with times
            made = fingerprint([made, tree_fingerprint(Path(video["path"]))])
        return {"path": str(path), "views": names, "video": video, "output": made}

    inputs = {"runs": {s: r["output"] for s, r in runs.items()}, "views": cfg.run.render_views}
    return Stage("render", inputs, run, ["raykit", "run", cfg.run.src, cfg.run.out], (path, *videos))


def report_stage(
    cfg: StageConfigs, out: Path, runner: StageRunner, results: dict[str, Any], sections: list[Section]
) -> Stage:
    """``report.md`` and a self-contained ``report.html`` from every stage's record."""
    from raykit.pipeline.report import write

    names = list(runner.seen)
    upstream = {name: runner.records.stages[name]["fingerprint"] for name in names}

    def run(attempt: Attempt) -> dict[str, Any]:
        records = {name: runner.records.stages[name] for name in names}
        md, html = write(out, cfg, results, records, sections)
        return {"markdown": str(md), "html": str(html), "output": tree_fingerprint(html)}

    inputs = {"upstream": fingerprint(upstream), "sections": fingerprint(sections)}
    return Stage("report", inputs, run, ["raykit", "run", cfg.run.src, cfg.run.out])
