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
from raykit.options import config_problems
from raykit.options import from_args as config_from_args
from raykit.ranges import SEED, Range, worker_range

__all__ = [
    "AUTO_SAMPLERS",
    "FIELDS",
    "LOGGERS",
    "RAY_SAMPLINGS",
    "SAMPLERS",
    "SAMPLER_CHOICES",
    "SCENE_SPACES",
    "TrainConfig",
    "add_arguments",
    "from_args",
    "parse_aabb",
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
FIELDS = ("auto", "static", "kplanes")
"""``--field``: the static field, K-Planes' space-time field, or auto (kplanes when the store holds time)."""
RAY_SAMPLINGS = ("uniform", "loss", "temporal")
"""``--ray-sampling``: the loader's sampling stage (``raykit.loaders``' ``sampling``)."""
LOGGERS = ("jsonl", "tensorboard")
_POSITIONAL = ("store",)
_REQUIRED = ("out",)


_COUNT = Range(1, integer=True)  # steps, samples, sizes: at least one
_STEPS = Range(0, integer=True)  # a number of steps that may be zero
_POSITIVE = Range(0, low_open=True)  # rates, durations
_FRACTION = Range(0, 1, high_open=True)  # thresholds, shares: [0, 1)


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
    steps: int | None = _opt(
        None,
        "optimisation steps; default 5000, or, with --max-seconds, no limit (the time budget ends the "
        "run); with both, whichever comes first",
        valid=Range(1, integer=True, optional=True),
    )
    max_seconds: float | None = _opt(
        None,
        "training time budget in seconds; training stops, then evaluates",
        valid=Range(0, low_open=True, optional=True),
    )
    batch_size: int = _opt(
        1024,
        "rays per step (per process under torchrun); small batches, many steps suit CPUs",
        valid=_COUNT,
    )
    lr: float = _opt(1e-2, "Adam learning rate at step 0", valid=_POSITIVE)
    lr_final: float = _opt(
        1e-3, "learning rate reached at the last step (exponential decay)", valid=_POSITIVE
    )
    adam_eps: float = _opt(
        1e-8,
        "Adam's epsilon (added to the root of the second moment; larger damps small gradients)",
        valid=_POSITIVE,
    )
    seed: int = _opt(0, "seed for initialisation, the loader order and sample jitter", valid=SEED)
    background: str = _opt(
        "auto",
        "background colour: white, black or R,G,B in [0, 1]; auto: white for images with alpha, black for "
        "opaque photos (recorded in config.json, why in run.json)",
    )
    aabb: str = _opt("auto", "scene box XMIN,YMIN,ZMIN,XMAX,YMAX,ZMAX, or auto (from the store)")
    train_split: str = _opt("train", "split trained on")
    eval_splits: str = _opt("test", "comma-separated splits evaluated at the end")
    n_samples: int = _opt(64, "stratified: samples per ray", valid=_COUNT)
    hier_coarse: int = _opt(
        32, "hierarchical: coarse samples per ray (density only, no gradient)", valid=_COUNT
    )
    hier_fine: int = _opt(32, "hierarchical: fine samples per ray drawn by inverse CDF", valid=_COUNT)
    hier_anneal_steps: int = _opt(
        300, "hierarchical, proposal: steps over which the uniform share decays", valid=_STEPS
    )
    hier_uniform: float = _opt(
        0.1,
        "hierarchical, proposal: final uniform share of the resampling distribution",
        valid=Range(0, 1),
    )
    occ_resolution: int = _opt(64, "occupancy: grid cells per axis", valid=_COUNT)
    occ_update_every: int = _opt(16, "occupancy: steps between grid refreshes", valid=_COUNT)
    occ_warmup_steps: int = _opt(
        256, "occupancy: steps during which every refresh visits every cell", valid=_STEPS
    )
    occ_refresh_fraction: float = _opt(
        0.25, "occupancy: share of random cells re-evaluated after warm-up", valid=Range(0, 1, low_open=True)
    )
    occ_threshold: float = _opt(
        0.01, "occupancy: opacity per step below which a cell is empty", valid=_FRACTION
    )
    occ_alpha_threshold: float = _opt(
        0.01,
        "occupancy, contracted space: drop marched samples of opacity below this (capped by the grid's "
        "mean), and those behind transmittance 1e-4, found by a no-gradient density pass (0: off)",
        valid=_FRACTION,
    )
    march_steps: int = _opt(256, "occupancy: marching steps across the scene box diagonal", valid=_COUNT)
    early_stop_eps: float = _opt(
        0.0,
        "occupancy: drop samples behind this transmittance, found by an extra density pass (0: off)",
        valid=_FRACTION,
    )
    prop_samples: str = _opt("64,32", "proposal: samples of each proposal level (one network per level)")
    prop_final: int = _opt(
        24, "proposal: field samples per ray drawn from the last proposal level", valid=_COUNT
    )
    prop_resolution: int = _opt(
        64, "proposal: feature-plane resolution of each proposal network", valid=_COUNT
    )
    prop_update_every: int = _opt(
        5,
        "proposal: after the warm-up, train the proposal networks on one step in this many (the others "
        "query them without gradients), as nerfacto does",
        valid=_COUNT,
    )
    prop_update_warmup: int = _opt(
        5000,
        "proposal: steps over which the interval between proposal updates grows from 1 to "
        "--prop-update-every",
        valid=Range(0, integer=True),
    )
    prop_loss_weight: float = _opt(
        1.0, "proposal: weight of the interlevel loss that trains the networks", valid=Range(0)
    )
    distortion_weight: float = _opt(
        0.0,
        "proposal: weight of mip-NeRF 360's distortion loss on the field's weights (0: off)",
        valid=Range(0),
    )
    scene_space: str = _opt(
        "auto",
        "box (bounded), contract (unbounded 360), ndc (forward-facing); auto picks from the store's "
        "cameras and bounds and records the choice in config.json",
        choices=SCENE_SPACES,
    )
    samples_per_step: int | None = _opt(
        None,
        "adapt the rays per step so that about this many field samples are evaluated per step",
        valid=Range(1, integer=True, optional=True),
    )
    budget_granule: int = _opt(
        128, "with --samples-per-step: rays per step change in multiples of this", valid=_COUNT
    )
    levels: int = _opt(3, "field: feature-plane levels", valid=_COUNT)
    base_resolution: int = _opt(64, "field: coarsest plane resolution", valid=_COUNT)
    max_resolution: int | None = _opt(
        None,
        "field: finest plane resolution; default 256 in a box or NDC, 512 when contracted (recorded in "
        "config.json, why in run.json)",
        valid=Range(1, integer=True, optional=True),
    )
    features: int = _opt(8, "field: features per level", valid=_COUNT)
    hidden: int = _opt(32, "field: MLP width", valid=_COUNT)
    field: str = _opt(
        "auto",
        "static (one field for all views) or kplanes (K-Planes' space-time planes: xy, xz, yz, xt, yt, "
        "zt per level); auto: kplanes when the store holds per-view times, else static (recorded in "
        "config.json, why in run.json)",
        choices=FIELDS,
    )
    time_resolution: int | None = _opt(
        None,
        "kplanes: cells along time of each time plane; default half the store's distinct view times, "
        "at least 2 (recorded in config.json, why in run.json)",
        valid=Range(1, integer=True, optional=True),
    )
    plane_tv_weight: float = _opt(
        1e-4, "kplanes: weight of the total variation of the space planes (0: off)", valid=Range(0)
    )
    time_smoothness_weight: float = _opt(
        1e-3,
        "kplanes: weight of the smoothness along time (mean squared second difference) of the time "
        "planes (0: off)",
        valid=Range(0),
    )
    time_lr_scale: float = _opt(
        4.0,
        "kplanes: the time planes' learning rate as a multiple of the schedule's (--lr decaying to "
        "--lr-final)",
        valid=_POSITIVE,
    )
    occ_time_samples: int = _opt(
        1,
        "occupancy with kplanes: random times per cell at each grid refresh, the densest kept (with the "
        "grid's decaying maximum over refreshes, moving content stays occupied)",
        valid=_COUNT,
    )
    log_every: int = _opt(50, "steps between log.jsonl records", valid=_COUNT)
    logger: str = _opt(
        "jsonl", "monitoring besides log.jsonl: jsonl (nothing else) or tensorboard", choices=LOGGERS
    )
    log_image_every_s: float = _opt(180.0, "tensorboard: seconds between test-view images", valid=_POSITIVE)
    ckpt_every: int = _opt(500, "steps between checkpoints (a crash loses at most this many)", valid=_COUNT)
    keep_checkpoints: int = _opt(2, "checkpoints kept on disk", valid=_COUNT)
    eval_chunk: int = _opt(65536, "rays per forward pass when rendering full images", valid=_COUNT)
    eval_max_images: int | None = _opt(
        None, "evaluate at most this many images per split", valid=Range(1, integer=True, optional=True)
    )
    progress_every_s: float | None = _opt(
        None,
        "seconds of training between quick test-PSNR checks (progress.jsonl; not counted as training)",
        valid=Range(0, low_open=True, optional=True),
    )
    progress_images: int = _opt(4, "images of the first eval split used by the quick checks", valid=_COUNT)
    num_workers: int = _opt(0, "loader worker processes", valid=worker_range())
    ray_sampling: str = _opt(
        "uniform",
        "which rays a batch holds: uniform (the loader's shuffle) or loss (the loader's error-map "
        "importance sampling, fed each step's per-ray losses; losses not reweighted; run.json records it) "
        "or temporal (DyNeRF's importance sampling over (frame, pixel) of a multi-view video: by the "
        "store's ISG weights before --ist-step, IST from it; needs an images-layout store with `raykit "
        "add-component STORE temporal`)",
        choices=RAY_SAMPLINGS,
    )
    ist_step: int = _opt(
        0,
        "--ray-sampling temporal: steps drawn by the ISG weights before the IST weights take over (0: "
        "IST throughout; K-Planes' DyNeRF runs switch at 50000; with --samples-per-step, the rays of this "
        "many --batch-size steps)",
        valid=_STEPS,
    )
    device: str = _opt("auto", "cpu, cuda, cuda:N or auto")
    mixed_precision: bool = _opt(True, "bfloat16 autocast for the field (CUDA only; ignored on CPU)")
    compile_field: bool = _opt(
        False,
        "torch.compile the field for the training step (dynamic shapes; for GPUs: off until "
        "benchmarks/gpu_check.sh measures it faster)",
    )
    threads: int | None = _opt(
        None, "torch CPU threads (default: torch's choice)", valid=Range(1, integer=True, optional=True)
    )
    progress: bool = _opt(False, "show a progress bar (over --max-seconds when given, else over steps)")
    resume: bool = _opt(False, "continue from the newest checkpoint in --out (start fresh if there is none)")
    force: bool = _opt(False, "resume even if the store fingerprint differs from the checkpoint's")

    def __post_init__(self) -> None:
        problems = config_problems(self)  # every numeric field in its range, every choice known
        try:
            counts = [int(v) for v in self.prop_samples.split(",") if v.strip()]
        except ValueError:
            counts = []
        if not counts or min(counts) < 1:
            problems.append(
                f"--prop-samples: expected comma-separated counts >= 1, got {self.prop_samples!r}"
            )
        if self.aabb != "auto":
            try:
                parse_aabb(self.aabb)
            except ConfigError as exc:
                problems.append(str(exc))
        if not [s for s in self.eval_splits.split(",") if s.strip()]:
            problems.append(f"--eval-splits: expected comma-separated split names, got {self.eval_splits!r}")
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


_COORDINATE = Range()  # any finite number


def parse_aabb(text: str) -> tuple[float, ...]:
    """``XMIN,YMIN,ZMIN,XMAX,YMAX,ZMAX`` -> six finite numbers with each min < max."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    ok = len(values) == 6 and all(_COORDINATE.contains(v) for v in values)
    if not ok or any(values[i] >= values[i + 3] for i in range(3)):
        raise ConfigError(
            f"--aabb: expected XMIN,YMIN,ZMIN,XMAX,YMAX,ZMAX (finite numbers) with min < max, got {text!r}"
        )
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per :class:`TrainConfig` field (``store`` positional, ``--out`` required)."""
    add_config_arguments(parser, TrainConfig, positional=_POSITIONAL, required=_REQUIRED)


def from_args(args: argparse.Namespace) -> TrainConfig:
    """The :class:`TrainConfig` described by parsed arguments (extra attributes are ignored)."""
    config: TrainConfig = config_from_args(TrainConfig, args)
    return config
