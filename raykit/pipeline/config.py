"""The options of ``raykit run``: its own (:class:`RunConfig`) and those passed through to the stages.

The stages' options are not written again: ``add_arguments`` adds the flags of
:class:`~raykit.converters.config.ConvertConfig`, :class:`~raykit.poses.estimate.PoseOptions` and
:class:`~raykit.trainer.TrainConfig`, less those the pipeline sets itself (``STAGE_SKIPS``), and
``from_args`` reads them back into those objects. ``--seed`` and ``--threads`` serve conversion,
pose estimation and training alike.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from raykit.converters import ConvertConfig
from raykit.errors import ConfigError
from raykit.options import add_arguments as add_config_arguments
from raykit.options import config_flags, config_problems, option
from raykit.options import from_args as config_from_args
from raykit.poses import PoseOptions
from raykit.ranges import SEED, Range
from raykit.trainer import SAMPLERS, TrainConfig

__all__ = ["DEFAULT_SAMPLER", "RunConfig", "StageConfigs", "add_arguments", "config_flags", "from_args"]

# The trainer's default, ``auto``: it picks the sampler for the scene space and records why (run.json).
DEFAULT_SAMPLER = TrainConfig.sampler
SAMPLER_NAMES = ("auto", *SAMPLERS)
STAGE_SKIPS: dict[type[Any], tuple[str, ...]] = {
    ConvertConfig: ("src", "dst", "profile", "progress", "overwrite", "seed", "threads"),
    PoseOptions: ("threads", "seed"),
    TrainConfig: (
        "store",
        "out",
        "sampler",
        "steps",
        "max_seconds",
        "resume",
        "force",
        "seed",
        "threads",
        "progress",
    ),
}


_AT_LEAST_0, _AT_LEAST_1 = Range(0, integer=True), Range(1, integer=True)
_OPTIONAL_COUNT = Range(1, integer=True, optional=True)


@dataclass(frozen=True)
class RunConfig:
    """The pipeline's own options."""

    src: str = option(
        "",
        "capture (photos, video, COLMAP, Blender, transforms.json, LLFF) or a ray store",
        positional=True,
        metavar="SRC",
    )
    out: str = option(
        "", "output folder (pipeline.json, store, runs, exports, report)", positional=True, metavar="OUT"
    )
    samplers: str = option(
        DEFAULT_SAMPLER, f"comma-separated samplers trained in turn ({', '.join(SAMPLER_NAMES)})"
    )
    minutes: float = option(
        5.0, "training budget in minutes, split evenly between the samplers", valid=Range(0, low_open=True)
    )
    steps: int | None = option(
        None, "train each sampler this many steps instead of --minutes (deterministic)", valid=_OPTIONAL_COUNT
    )
    retries: int = option(
        0, "rerun a stage that failed for a machine reason (killed, out of memory, I/O)", valid=_AT_LEAST_0
    )
    nproc_per_node: int | None = option(
        None, "train through torchrun with N processes (elastic restarts)", metavar="N", valid=_OPTIONAL_COUNT
    )
    max_restarts: int = option(
        3, "with --nproc-per-node: torchrun's restarts of the group after a failure", valid=_AT_LEAST_0
    )
    bench_batches: int = option(100, "batches the loader profile reads per measurement", valid=_AT_LEAST_1)
    render_views: int = option(3, "test views shown beside the ground truth in the report", valid=_AT_LEAST_1)
    seed: int = option(0, "seed of conversion, pose estimation and training", valid=SEED)
    threads: int | None = option(
        None, "CPU threads of every stage (default: each stage's choice)", valid=_OPTIONAL_COUNT
    )
    progress: bool = option(True, "progress bars")

    def __post_init__(self) -> None:
        problems = config_problems(self)  # every numeric option in its range
        unknown = [s for s in self.sampler_list() if s not in SAMPLER_NAMES]
        if unknown:
            problems.append(
                f"samplers: expected some of {', '.join(SAMPLER_NAMES)}, got {', '.join(unknown)}"
            )
        if problems:
            raise ConfigError("invalid run options: " + "; ".join(problems))

    def sampler_list(self) -> list[str]:
        """The samplers in order, without repeats (``auto`` is resolved by the trainer, per scene)."""
        names = [s.strip() for s in self.samplers.split(",") if s.strip()]
        return list(dict.fromkeys(names))


@dataclass(frozen=True)
class StageConfigs:
    """Everything ``raykit run`` was told: its own options and the stages' config objects."""

    run: RunConfig
    convert: ConvertConfig
    poses: PoseOptions
    train: TrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``raykit run``'s flags: its own, then conversion's, pose estimation's and training's."""
    add_config_arguments(parser, RunConfig)
    for config, title in (
        (ConvertConfig, "conversion"),
        (PoseOptions, "pose estimation (photos, video)"),
        (TrainConfig, "training"),
    ):
        add_config_arguments(parser.add_argument_group(title), config, skip=STAGE_SKIPS[config])  # type: ignore[arg-type]


def from_args(args: argparse.Namespace) -> StageConfigs:
    """The configs described by parsed arguments."""
    run: RunConfig = config_from_args(RunConfig, args)
    common = {"seed": run.seed, "threads": run.threads}
    skips = STAGE_SKIPS
    return StageConfigs(
        run=run,
        convert=config_from_args(
            ConvertConfig, args, skips[ConvertConfig], src=run.src, dst="", progress=run.progress, **common
        ),
        poses=config_from_args(PoseOptions, args, skips[PoseOptions], **common),
        train=config_from_args(TrainConfig, args, skips[TrainConfig], store="", out="", **common),
    )
