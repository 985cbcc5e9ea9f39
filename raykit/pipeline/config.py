"""The options of ``raykit run``: its own (:class:`RunConfig`) and those passed through to the stages.

The stages' options are not written again: ``add_arguments`` adds the flags of
:class:`~raykit.converters.config.ConvertConfig`, :class:`~raykit.poses.estimate.PoseOptions` and
:class:`~raykit.trainer.TrainConfig`, less those the pipeline sets itself (``STAGE_SKIPS``), and
``from_args`` reads them back into those objects. ``--seed`` and ``--threads`` serve conversion,
pose estimation and training alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from raykit.converters import ConvertConfig
from raykit.errors import ConfigError
from raykit.options import add_arguments as add_config_arguments
from raykit.options import config_problems, option
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


def _subset(config: type[Any], skip: Collection[str]) -> type[Any]:
    """A dataclass with ``config``'s fields but those in ``skip`` (same defaults, types and help)."""
    hints = typing.get_type_hints(config)
    fields = [
        (f.name, hints[f.name], dataclasses.field(default=f.default, metadata=f.metadata))
        for f in dataclasses.fields(config)
        if f.name not in skip
    ]
    return dataclasses.make_dataclass(config.__name__, fields, frozen=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``raykit run``'s flags: its own, then conversion's, pose estimation's and training's."""
    add_config_arguments(parser, RunConfig)
    for config, title in (
        (ConvertConfig, "conversion"),
        (PoseOptions, "pose estimation (photos, video)"),
        (TrainConfig, "training"),
    ):
        add_config_arguments(parser.add_argument_group(title), _subset(config, STAGE_SKIPS[config]))  # type: ignore[arg-type]


def from_args(args: argparse.Namespace) -> StageConfigs:
    """The configs described by parsed arguments."""
    values = vars(args)

    def read(config: type[Any], **fixed: Any) -> Any:
        names = [f.name for f in dataclasses.fields(config) if f.name not in STAGE_SKIPS.get(config, ())]
        return config(**{name: values[name] for name in names if name in values}, **fixed)

    run: RunConfig = read(RunConfig)
    common = {"seed": run.seed, "threads": run.threads}
    return StageConfigs(
        run=run,
        convert=read(ConvertConfig, src=run.src, dst="", progress=run.progress, **common),
        poses=read(PoseOptions, **common),
        train=read(TrainConfig, store="", out="", **common),
    )


def config_flags(config: Any, skip: Collection[str] = ()) -> list[str]:
    """The flags that set every field of ``config`` differing from its default (``--x``/``--no-x`` for
    booleans; positional fields and those in ``skip`` left out)."""
    flags: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in skip or f.metadata.get("positional") or value == f.default:
            continue
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif value is not None:
            flags.append(f"{flag}={value}")
    return flags
