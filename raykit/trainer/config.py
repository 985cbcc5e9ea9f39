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
    "DEFAULT_REASONS",
    "LOGGERS",
    "SAMPLERS",
    "SAMPLER_CHOICES",
    "SCENE_SPACES",
    "TrainConfig",
    "add_arguments",
    "default_reasons",
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
    compile_field: bool = _opt(
        False,
        "torch.compile the field for the training step (dynamic shapes; for GPUs: off until "
        "benchmarks/gpu_check.sh measures it faster)",
    )
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


DEFAULT_REASONS: dict[str, str] = {
    "store": "no default: the store is the positional argument",
    "out": "no default: --out is required",
    "sampler": "auto: the sampler that suits the scene space (run.json's sampler records which and why)",
    "steps": "5000: an upper bound; the pipeline and most runs stop on --max-seconds",
    "max_seconds": "None: train for --steps; raykit run sets its time budget here",
    "batch_size": "1024 rays: small batches and many steps suit a CPU, where a step's cost grows with its "
    "samples (nerfacc's examples aim at 256k samples per step on a GPU)",
    "lr": "1e-2: Adam's rate for feature planes and small MLPs (instant-ngp and nerfacc use 1e-2 for grids)",
    "lr_final": "1e-3: an exponential decay by 10x over the run, gentler than nerfacto's 100x (1e-2 to "
    "1e-4) for runs of minutes",
    "seed": "0: runs reproduce unless asked otherwise",
    "background": "auto: white under alpha, black for opaque photos (run.json's background: which, why)",
    "aabb": "auto: the store's scene bounds, padded by 5 %",
    "train_split": "train: the split every converter writes for training",
    "eval_splits": "test: the held-out split every converter writes",
    "n_samples": "64: stratified sampling's classic count (NeRF's coarse network)",
    "hier_coarse": "32: half of the 64 samples for the density-only coarse pass",
    "hier_fine": "32: the other half, where the coarse weights are",
    "hier_anneal_steps": "300: the uniform share decays over the first few hundred steps, while the field "
    "forms (nerfacto anneals its proposal weights over its first 1000)",
    "hier_uniform": "0.1: keeps a tenth of the samples uniform so empty space keeps being visited",
    "occ_resolution": "64: 64^3 cells, 4x coarser than the finest feature plane (instant-ngp uses 128 at "
    "GPU speeds); a refresh of every cell stays cheap on a CPU",
    "occ_update_every": "16: instant-ngp's and nerfacc's interval between grid refreshes",
    "occ_warmup_steps": "256: instant-ngp's warm-up, every cell visited at each refresh",
    "occ_refresh_fraction": "0.25: after warm-up a random quarter plus every occupied cell, as instant-ngp",
    "occ_threshold": "0.01: nerfacc's occupancy threshold (opacity of one step)",
    "occ_alpha_threshold": "0.01: nerfacc's alpha_thre for unbounded scenes",
    "march_steps": "256 steps across the box diagonal: about 2 per grid cell, so no cell is stepped over",
    "early_stop_eps": "0 (off) in a box: the early-stop pass evaluates every sample's density once more; "
    "evaluation stops rays at transmittance 1e-4 without it",
    "prop_samples": "64,32: a coarse and a finer proposal level; nerfacto's default is 256,96 for GPUs",
    "prop_final": "24 field samples per ray: nerfacto's 48 halved for a CPU's budget; plant_capture "
    "trained 6x the occupancy grid's rays/s this way (BENCHMARKS.md issue 30)",
    "prop_resolution": "64: the proposal networks only need coarse density",
    "prop_loss_weight": "1.0: mip-NeRF 360's interlevel loss weight",
    "scene_space": "auto: detected from the cameras and bounds (run.json's scene_space says which and why)",
    "samples_per_step": "None: a fixed batch of rays; the sample budget is opt-in",
    "budget_granule": "128: rays per step change in steps of 128 under --samples-per-step",
    "levels": "3 plane resolutions, 64 to 256 (raykit.trainer.field: measured against voxel grids and hash "
    "tables on this CPU)",
    "base_resolution": "64: the coarsest plane (raykit.trainer.field)",
    "max_resolution": "256: the finest plane; 2.1 M plane values in all (raykit.trainer.field)",
    "features": "8 per level (raykit.trainer.field)",
    "hidden": "32: small MLPs, as instant-ngp's 64 wide networks halved for a CPU",
    "log_every": "50 steps: a record every second or so on a CPU, without slowing the step",
    "logger": "jsonl: no extra dependency; tensorboard is opt-in",
    "log_image_every_s": "180 s: a test view every 3 minutes of a 5-minute run",
    "ckpt_every": "500 steps: a crash loses at most a few seconds of training on a CPU",
    "keep_checkpoints": "2: the newest and one before it, in case the newest is damaged",
    "eval_chunk": "8192 rays: no larger chunk rendered faster on 2 shared, busy CPU cores (1 thread: 0.95 s "
    "per 200x200 view at 8192, 1.17 s at 32768 and 65536; BENCHMARKS.md issue 47)",
    "eval_max_images": "None: the final evaluation scores every image of each split",
    "progress_every_s": "None: no progress checks unless asked (raykit run asks for 4)",
    "progress_images": "4 images: a check costs a fraction of a full evaluation",
    "num_workers": "0: the trainer's loader reads in its own process; loader wait is under 1 % of a step",
    "device": "auto: CUDA when available, else the CPU",
    "mixed_precision": "on: bfloat16 autocast for the field on CUDA only (ignored on a CPU)",
    "compile_field": "off: torch.compile has not been measured faster for this field (a launch-bound GPU "
    "step is where it could help; benchmarks/gpu_check.sh measures it when a GPU is lent; on a CPU it "
    "costs a compiler and minutes of compiling)",
    "threads": "None: torch's choice (all cores)",
    "progress": "off: a bar only when asked (logs stay clean)",
    "resume": "off: a run starts fresh unless asked to continue",
    "force": "off: a resume refuses a store that changed",
}
"""Why each :class:`TrainConfig` default is what it is (``run.json`` records those a run kept)."""


def default_reasons(config: TrainConfig) -> dict[str, dict[str, Any]]:
    """``{field: {"value": v, "why": reason}}`` for every field of ``config`` left at its default."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    return {
        name: {"value": value, "why": DEFAULT_REASONS[name]}
        for name, value in config.to_dict().items()
        if value == defaults[name]
    }


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
