"""Training configuration: one frozen dataclass whose fields generate the command-line flags.

Each field's ``metadata["help"]`` is its flag's help text; ``store`` is the positional argument and
``--out`` is required. ``add_arguments(parser)`` builds the flags, ``from_args(args)`` reads them
back, and ``to_dict``/``from_dict`` round-trip the JSON saved in every run directory and checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from raykit.errors import ConfigError
from raykit.options import add_arguments as add_config_arguments
from raykit.options import from_args as config_from_args

__all__ = [
    "AUTO_SAMPLERS",
    "LOGGERS",
    "SAMPLERS",
    "SAMPLER_CHOICES",
    "SCENE_SPACES",
    "TrainConfig",
    "add_arguments",
    "from_args",
    "resolve_sampler",
]

SAMPLERS = ("stratified", "hierarchical", "occupancy", "proposal")
"""The four sampling strategies (``--sampler auto`` picks one of them per scene space)."""
SAMPLER_CHOICES = ("auto", *SAMPLERS)
AUTO_SAMPLERS = {
    "box": ("occupancy", "bounded scene: the occupancy grid over the scene box skips empty space"),
    "contract": (
        "proposal",
        "contracted (unbounded) scene: proposal networks place 24 field samples per ray where the "
        "surfaces are (plant_capture: 6x the occupancy grid's rays/s, BENCHMARKS.md issue 30)",
    ),
    "ndc": ("proposal", "forward-facing scene in NDC: proposal networks, as for contracted scenes"),
}
"""Scene space -> (sampler, reason) for ``--sampler auto``."""
SCENE_SPACES = ("auto", "box", "contract", "ndc")
LOGGERS = ("jsonl", "tensorboard")
_POSITIONAL = ("store",)
_REQUIRED = ("out",)


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run (with the store's content and the raykit version)."""

    store: str = _opt("", "ray store path or URL")
    out: str = _opt("", "run directory (created; holds config, logs, checkpoints, eval.json, renders)")
    sampler: str = _opt(
        "auto",
        "sampling strategy along rays; auto picks per scene space (occupancy in a box, proposal when "
        "contracted or in NDC) and records the choice in config.json and why in run.json",
        choices=SAMPLER_CHOICES,
    )
    steps: int = _opt(5000, "optimisation steps (upper bound when --max-seconds is given)")
    max_seconds: float | None = _opt(None, "training time budget in seconds; training stops, then evaluates")
    batch_size: int = _opt(
        1024, "rays per step (per process under torchrun); small batches, many steps suit CPUs"
    )
    lr: float = _opt(1e-2, "Adam learning rate at step 0")
    lr_final: float = _opt(1e-3, "learning rate reached at the last step (exponential decay)")
    seed: int = _opt(0, "seed for initialisation, the loader order and sample jitter")
    background: str = _opt(
        "auto",
        "background colour: white, black or R,G,B in [0, 1]; auto: white for images with alpha, black for "
        "opaque photos (recorded in config.json, why in run.json)",
    )
    aabb: str = _opt("auto", "scene box XMIN,YMIN,ZMIN,XMAX,YMAX,ZMAX, or auto (from the store)")
    train_split: str = _opt("train", "split trained on")
    eval_splits: str = _opt("test", "comma-separated splits evaluated at the end")
    n_samples: int = _opt(64, "stratified: samples per ray")
    hier_coarse: int = _opt(32, "hierarchical: coarse samples per ray (density only, no gradient)")
    hier_fine: int = _opt(32, "hierarchical: fine samples per ray drawn by inverse CDF")
    hier_anneal_steps: int = _opt(300, "hierarchical, proposal: steps over which the uniform share decays")
    hier_uniform: float = _opt(
        0.1, "hierarchical, proposal: final uniform share of the resampling distribution"
    )
    occ_resolution: int = _opt(64, "occupancy: grid cells per axis")
    occ_update_every: int = _opt(16, "occupancy: steps between grid refreshes")
    occ_warmup_steps: int = _opt(256, "occupancy: steps during which every refresh visits every cell")
    occ_refresh_fraction: float = _opt(0.25, "occupancy: share of random cells re-evaluated after warm-up")
    occ_threshold: float = _opt(0.01, "occupancy: opacity per step below which a cell is empty")
    occ_alpha_threshold: float = _opt(
        0.01,
        "occupancy, contracted space: drop marched samples of opacity below this (capped by the grid's "
        "mean), and those behind transmittance 1e-4, found by a no-gradient density pass (0: off)",
    )
    march_steps: int = _opt(256, "occupancy: marching steps across the scene box diagonal")
    early_stop_eps: float = _opt(
        0.0, "occupancy: drop samples behind this transmittance, found by an extra density pass (0: off)"
    )
    prop_samples: str = _opt("64,32", "proposal: samples of each proposal level (one network per level)")
    prop_final: int = _opt(24, "proposal: field samples per ray drawn from the last proposal level")
    prop_resolution: int = _opt(64, "proposal: feature-plane resolution of each proposal network")
    prop_loss_weight: float = _opt(1.0, "proposal: weight of the interlevel loss that trains the networks")
    scene_space: str = _opt(
        "auto",
        "box (bounded), contract (unbounded 360), ndc (forward-facing); auto picks from the store's "
        "cameras and bounds and records the choice in config.json",
        choices=SCENE_SPACES,
    )
    samples_per_step: int | None = _opt(
        None, "adapt the rays per step so that about this many field samples are evaluated per step"
    )
    budget_granule: int = _opt(128, "with --samples-per-step: rays per step change in multiples of this")
    levels: int = _opt(3, "field: feature-plane levels")
    base_resolution: int = _opt(64, "field: coarsest plane resolution")
    max_resolution: int = _opt(256, "field: finest plane resolution")
    features: int = _opt(8, "field: features per level")
    hidden: int = _opt(32, "field: MLP width")
    log_every: int = _opt(50, "steps between log.jsonl records")
    logger: str = _opt(
        "jsonl", "monitoring besides log.jsonl: jsonl (nothing else) or tensorboard", choices=LOGGERS
    )
    log_image_every_s: float = _opt(180.0, "tensorboard: seconds between test-view images")
    ckpt_every: int = _opt(500, "steps between checkpoints (a crash loses at most this many)")
    keep_checkpoints: int = _opt(2, "checkpoints kept on disk")
    eval_chunk: int = _opt(8192, "rays per forward pass when rendering full images")
    eval_max_images: int | None = _opt(None, "evaluate at most this many images per split")
    progress_every_s: float | None = _opt(
        None, "seconds of training between quick test-PSNR checks (progress.jsonl; not counted as training)"
    )
    progress_images: int = _opt(4, "images of the first eval split used by the quick checks")
    num_workers: int = _opt(0, "loader worker processes")
    device: str = _opt("auto", "cpu, cuda, cuda:N or auto")
    mixed_precision: bool = _opt(True, "bfloat16 autocast for the field (CUDA only; ignored on CPU)")
    threads: int | None = _opt(None, "torch CPU threads (default: torch's choice)")
    progress: bool = _opt(False, "show a progress bar (over --max-seconds when given, else over steps)")
    resume: bool = _opt(False, "continue from the newest checkpoint in --out (start fresh if there is none)")
    force: bool = _opt(False, "resume even if the store fingerprint differs from the checkpoint's")

    def __post_init__(self) -> None:
        problems = []
        if self.sampler not in SAMPLER_CHOICES:
            problems.append(f"sampler: expected one of {', '.join(SAMPLER_CHOICES)}, got {self.sampler!r}")
        if self.scene_space not in SCENE_SPACES:
            problems.append(
                f"scene_space: expected one of {', '.join(SCENE_SPACES)}, got {self.scene_space!r}"
            )
        try:
            counts = [int(v) for v in self.prop_samples.split(",") if v.strip()]
        except ValueError:
            counts = []
        if not counts or min(counts) < 1:
            problems.append(f"prop_samples: expected comma-separated counts >= 1, got {self.prop_samples!r}")
        if self.samples_per_step is not None and self.samples_per_step < 1:
            problems.append(f"samples_per_step: expected >= 1, got {self.samples_per_step}")
        for name in ("prop_final", "prop_resolution", "budget_granule"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: expected >= 1, got {getattr(self, name)}")
        for name in ("steps", "batch_size", "n_samples", "hier_coarse", "hier_fine", "occ_resolution"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: expected >= 1, got {getattr(self, name)}")
        for name in ("log_every", "ckpt_every", "occ_update_every", "march_steps", "keep_checkpoints"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: expected >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.lr_final <= 0:
            problems.append(f"lr, lr_final: expected > 0, got {self.lr}, {self.lr_final}")
        if not 0.0 <= self.occ_alpha_threshold < 1.0:
            problems.append(f"occ_alpha_threshold: expected in [0, 1), got {self.occ_alpha_threshold}")
        if not 0.0 < self.occ_refresh_fraction <= 1.0:
            problems.append(f"occ_refresh_fraction: expected in (0, 1], got {self.occ_refresh_fraction}")
        if self.logger not in LOGGERS:
            problems.append(f"logger: expected one of {', '.join(LOGGERS)}, got {self.logger!r}")
        if self.log_image_every_s <= 0:
            problems.append(f"log_image_every_s: expected > 0, got {self.log_image_every_s}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            problems.append(f"max_seconds: expected > 0, got {self.max_seconds}")
        if problems:
            raise ConfigError("invalid training config: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise :class:`ConfigError`."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown training config keys: {', '.join(unknown)}")
        return cls(**data)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def resolve_sampler(config: TrainConfig) -> tuple[TrainConfig, str]:
    """``config`` with ``sampler`` resolved (``auto`` -> :data:`AUTO_SAMPLERS` of its scene space), and why.

    The scene space should be resolved first (``auto`` counts as ``box``, as the models do).
    """
    if config.sampler != "auto":
        return config, "chosen with --sampler"
    space = "box" if config.scene_space == "auto" else config.scene_space
    sampler, reason = AUTO_SAMPLERS[space]
    return config.replace(sampler=sampler), f"--sampler auto, scene space {space}: {reason}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per :class:`TrainConfig` field (``store`` positional, ``--out`` required)."""
    add_config_arguments(parser, TrainConfig, positional=_POSITIONAL, required=_REQUIRED)


def from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` described by parsed arguments (extra attributes are ignored)."""
    config: TrainConfig = config_from_args(TrainConfig, args)
    return config
