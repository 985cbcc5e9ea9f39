"""``raykit evaluate``: score any trainer's renders under the community protocol (:mod:`raykit.metrics`).

:func:`find_pairs` matches predictions to ground truth (folders, ns-render and gsplat outputs, store
splits); :func:`evaluate` scores them and writes ``results.json`` (see :mod:`raykit.evaluation.score`).
"""

from __future__ import annotations

from raykit.evaluation.inputs import (
    IMAGE_SUFFIXES,
    ImageRef,
    Pair,
    PairSet,
    find_pairs,
    render_stem,
    view_time,
)
from raykit.evaluation.score import EvaluateConfig, evaluate, score, set_sha256

__all__ = [
    "IMAGE_SUFFIXES",
    "EvaluateConfig",
    "ImageRef",
    "Pair",
    "PairSet",
    "evaluate",
    "find_pairs",
    "render_stem",
    "score",
    "set_sha256",
    "view_time",
]
