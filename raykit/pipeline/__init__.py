"""raykit.pipeline: ``raykit run SRC OUT``, from a capture to a verified model and a report.

Stages (``raykit.pipeline.stages``): poses (photos or a video) -> convert -> validate -> profile the
loader -> train each sampler -> evaluate -> export with verification -> render test views -> report
(``report.md`` and a self-contained ``report.html``). Each stage's fingerprint, status, costs and
command are recorded in ``OUT/pipeline.json`` (``raykit.pipeline.records``); a rerun skips what is up
to date and resumes what was interrupted (``raykit.pipeline.runner``).
"""

from __future__ import annotations

from raykit.pipeline.config import DEFAULT_SAMPLER, RunConfig, StageConfigs
from raykit.pipeline.records import PIPELINE_FILE, fingerprint, tree_fingerprint
from raykit.pipeline.run import capture_and_store, check_run_folder, run_pipeline
from raykit.pipeline.runner import (
    Attempt,
    Stage,
    StageError,
    StageRunner,
    WarmStarter,
    kill_children,
    machine_fault,
)
from raykit.pipeline.stages import (
    export_stage,
    read_jsonl,
    train_summary,
    training_stage,
    with_progress_checks,
)
from raykit.pipeline.timeline import camera_video, plot_psnr_over_time

__all__ = [
    "DEFAULT_SAMPLER",
    "PIPELINE_FILE",
    "Attempt",
    "RunConfig",
    "Stage",
    "StageConfigs",
    "StageError",
    "StageRunner",
    "WarmStarter",
    "camera_video",
    "capture_and_store",
    "check_run_folder",
    "export_stage",
    "fingerprint",
    "kill_children",
    "machine_fault",
    "plot_psnr_over_time",
    "read_jsonl",
    "run_pipeline",
    "train_summary",
    "training_stage",
    "tree_fingerprint",
    "with_progress_checks",
]
