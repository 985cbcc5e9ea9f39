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
from raykit.pipeline.run import check_run_folder, run_pipeline
from raykit.pipeline.runner import Attempt, Stage, StageError, StageRunner

__all__ = [
    "DEFAULT_SAMPLER",
    "PIPELINE_FILE",
    "Attempt",
    "RunConfig",
    "Stage",
    "StageConfigs",
    "StageError",
    "StageRunner",
    "check_run_folder",
    "fingerprint",
    "run_pipeline",
    "tree_fingerprint",
]
