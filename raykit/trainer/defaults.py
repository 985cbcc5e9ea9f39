"""A training run's defaults: why each is what it is, and the automatic ones resolved with a reason.

:data:`DEFAULT_REASONS` explains every :class:`~raykit.trainer.config.TrainConfig` default
(``run.json`` records those a run kept, :func:`default_reasons`); ``resolve_sampler``,
``resolve_steps`` and ``resolve_resolution`` turn ``auto``/unset fields into values and say why.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from raykit.errors import ConfigError
from raykit.trainer.config import AUTO_SAMPLERS, TrainConfig

__all__ = [
    "DEFAULT_REASONS",
    "DEFAULT_STEPS",
    "FIELD_RESOLUTIONS",
    "UNLIMITED_STEPS",
    "default_reasons",
    "resolve_field",
    "resolve_resolution",
    "resolve_sampler",
    "resolve_steps",
    "step_limit",
]


DEFAULT_REASONS: dict[str, str] = {
    "store": "no default: the store is the positional argument",
    "out": "no default: --out is required",
    "sampler": "auto: the sampler that suits the scene space (run.json's sampler records which and why)",
    "ray_sampling": "uniform: until loss-driven sampling measures better on the captures (BENCHMARKS.md, "
    "issue 57's section)",
    "ist_step": "0, IST throughout: on the built-in multi-view video (12 cameras x 24 frames, lossless) ISG "
    "weighs 91 % of the pixels zero (a static pixel equals its temporal median), so ISG draws never train "
    "the static scene: 9.8 and 10.1 dB test PSNR after 90 s against uniform's 20.0 and 21.3, while IST (its "
    "floor alpha keeps every pixel drawn) stayed level with uniform (+0.76 and -0.51 dB; BENCHMARKS.md, "
    "issue 59's time-sampling section, a short budget); K-Planes' DyNeRF runs draw by ISG for 50,000 "
    "steps, on real video whose noise gives every pixel some ISG weight",
    "steps": "None: 5000 steps (DEFAULT_STEPS), or, with --max-seconds, no step limit (UNLIMITED_STEPS), "
    "so that a time budget is trained in full on a fast machine too (5000 steps capped a 300 s run on "
    "plant_capture at 287 s on 2 CPU threads, and would cap one on a GPU at about 50 s); resolved in "
    "config.json, why in run.json",
    "max_seconds": "None: train for --steps; raykit run sets its time budget here",
    "batch_size": "1024 rays: small batches and many steps suit a CPU, where a step's cost grows with its "
    "samples (nerfacc's examples aim at 256k samples per step on a GPU)",
    "lr": "1e-2: Adam's rate for feature planes and small MLPs (instant-ngp and nerfacc use 1e-2 for grids)",
    "lr_final": "1e-3: an exponential decay by 10x over the run, gentler than nerfacto's 100x (1e-2 to "
    "1e-4) for runs of minutes (plant_capture, 3000 steps: 100x cost 1.0 dB test PSNR, 3x gained 0.08, "
    "noise; BENCHMARKS.md issue 47)",
    "adam_eps": "1e-8: Adam's own (Kingma and Ba; torch's default), not instant-ngp's and nerfacto's 1e-15: "
    "with 1e-15 a feature value or weight whose gradients are tiny still moves by the full rate each step, "
    "and the built-in unbounded scene's training collapsed between steps 1150 and 1400 at --lr 1e-2 "
    "(15.89 dB test PSNR at 3000 steps); 1e-8 damps those steps and keeps the rate: 22.38 dB there, and "
    "plant_capture 19.69 against 19.48 at 160x128, 17.26 against 17.32 at 320x256 (3000 steps; --lr 5e-3 "
    "instead cost plant_capture 0.61 dB; "
    "BENCHMARKS.md issue 47)",
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
    "prop_update_every": "5: nerfacto's proposal_update_every; the proposal networks only have to bound the "
    "field's weights, and a step that does not train them skips their backward and the interlevel loss: "
    "at 3000 steps on one thread plant_capture (160x128) scored 19.67 dB against 19.69 training them on "
    "every step, in 0.90x the time, and the built-in unbounded scene 22.15 against 21.46 in 0.93x "
    "(BENCHMARKS.md issue 47, round 6)",
    "prop_update_warmup": "5000: nerfacto's proposal_warmup; the interval grows from 1 over these steps, "
    "so a short run trains the networks more often while they form",
    "prop_loss_weight": "1.0: mip-NeRF 360's interlevel loss weight",
    "distortion_weight": "0 (off): nerfacto's 0.002 cost 0.16 dB test PSNR on plant_capture at equal steps "
    "(19.32 against 19.48 dB, 3000 steps, BENCHMARKS.md issue 47); it suppresses floaters rather than "
    "raising PSNR at a few thousand steps; opt-in",
    "scene_space": "auto: detected from the cameras and bounds (run.json's scene_space says which and why)",
    "samples_per_step": "None: a fixed batch of rays; the sample budget is opt-in",
    "budget_granule": "128: rays per step change in steps of 128 under --samples-per-step",
    "levels": "3 plane resolutions, 64 to 256 (raykit.trainer.field: measured against voxel grids and hash "
    "tables on this CPU)",
    "base_resolution": "64: the coarsest plane (raykit.trainer.field)",
    "max_resolution": "None: per scene space (resolve_resolution): 256 in a box or NDC (2.1 M plane values, "
    "raykit.trainer.field), 512 when contracted, where the planes span [-2, 2] and the unit ball would get "
    "half of them per axis (plant_capture at equal steps: +0.34 dB test PSNR at 160x128, +0.29 dB at "
    "320x256, ahead at equal time too; BENCHMARKS.md issue 47)",
    "features": "8 per level (raykit.trainer.field)",
    "hidden": "32: small MLPs, as instant-ngp's 64 wide networks halved for a CPU",
    "field": "auto: kplanes when the store holds per-view times (a static field averages the motion "
    "away), else static (run.json's field says which and why)",
    "time_resolution": "None: half the store's distinct view times, at least 2 (resolve_field; K-Planes "
    "uses 150 cells for DyNeRF's 300 frames)",
    "plane_tv_weight": "1e-4: K-Planes' plane_tv_weight in its D-NeRF configs",
    "time_smoothness_weight": "1e-3: K-Planes' time_smoothness_weight in its D-NeRF configs",
    "time_lr_scale": "4: on the built-in dynamic scene (16 cameras, 3 moving groups) at 800 equal steps, "
    "test PSNR +1.6 and +1.9 dB over 1 on two seeds (x10: +1.8 dB; K-Planes uses one rate): a time-plane "
    "texel is shared by a whole plane of space whose gradients disagree, so Adam moves it less "
    "(BENCHMARKS.md issue 59, fourth round)",
    "occ_time_samples": "1: one random time per cell and refresh, the static field's cost (4 cost 4x a "
    "refresh); the grid's decaying maximum over refreshes covers time, so a cell that moving content "
    "passes through stays occupied (BENCHMARKS.md issue 59, second round)",
    "log_every": "50 steps: a record every second or so on a CPU, without slowing the step",
    "logger": "jsonl: no extra dependency; tensorboard is opt-in",
    "log_image_every_s": "180 s: a test view every 3 minutes of a 5-minute run",
    "ckpt_every": "500 steps: a crash loses at most a few seconds of training on a CPU",
    "keep_checkpoints": "2: the newest and one before it, in case the newest is damaged",
    "eval_chunk": "65536 rays: a 200x200 view in one pass, so each round of the front-to-back compositing "
    "and each marching level runs once per view, not once per 8192 rays (fewer, larger operations; the "
    "packed occupancy samples keep memory small; a 160x128 proposal view rendered in one pass took 0.15 GB "
    "more than at 8192)",
    "eval_max_images": "None: the final evaluation scores every image of each split",
    "progress_every_s": "None: no progress checks unless asked (raykit run asks for 4)",
    "progress_images": "4 images: a check costs a fraction of a full evaluation",
    "num_workers": "0: the trainer's loader reads in its own process; loader wait is under 1 % of a step",
    "device": "auto: CUDA when available, else the CPU",
    "mixed_precision": "on: bfloat16 autocast for the field on CUDA only (ignored on a CPU)",
    "compile_field": "off: torch.compile has not been measured faster for this field (a launch-bound GPU "
    "step is where it could help; benchmarks/gpu_check.sh measures it when a GPU is lent; on a CPU it "
    "costs a compiler and the compiling, and the compiled step was slower: plant_capture at 320x256, 2 "
    "threads, 60 s: 222 steps against 1,058, 86 ms a step against 56 once compiled; BENCHMARKS.md issue 47)",
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


DEFAULT_STEPS = 5000
"""Training steps when neither ``--steps`` nor ``--max-seconds`` is given."""
UNLIMITED_STEPS = 10**9
"""``--steps`` of a run with a time budget and no step limit (the budget ends it)."""


def step_limit(config: TrainConfig) -> int:
    """The run's step limit: ``steps``, or when unset :data:`DEFAULT_STEPS` (no time budget) or
    :data:`UNLIMITED_STEPS` (with ``max_seconds``)."""
    if config.steps is not None:
        return config.steps
    return DEFAULT_STEPS if config.max_seconds is None else UNLIMITED_STEPS


def resolve_steps(config: TrainConfig) -> tuple[TrainConfig, str]:
    """``config`` with ``steps`` resolved (:func:`step_limit`), and why."""
    if config.steps is not None:
        return config, "chosen with --steps"
    why = (
        f"--steps and --max-seconds unset: {DEFAULT_STEPS} steps"
        if config.max_seconds is None
        else f"--steps unset, --max-seconds {config.max_seconds:g}: no step limit, the time budget ends "
        "the run and paces the learning-rate decay"
    )
    return config.replace(steps=step_limit(config)), why


FIELD_RESOLUTIONS = {"box": 256, "ndc": 256, "contract": 512}
"""The finest plane resolution per scene space when ``--max-resolution`` is not given."""


def resolve_resolution(config: TrainConfig) -> tuple[TrainConfig, str]:
    """``config`` with ``max_resolution`` resolved (None -> :data:`FIELD_RESOLUTIONS` of its scene
    space), and why. The scene space should be resolved first (``auto`` counts as ``box``)."""
    if config.max_resolution is not None:
        return config, "chosen with --max-resolution"
    space = "box" if config.scene_space == "auto" else config.scene_space
    value = FIELD_RESOLUTIONS[space]
    why = (
        "a contracted field's planes span [-2, 2]: the unit ball gets a box field's resolution"
        if space == "contract"
        else "the finest plane of a bounded field"
    )
    return config.replace(
        max_resolution=value
    ), f"--max-resolution unset, scene space {space}: {value}, {why}"


def resolve_field(config: TrainConfig, distinct_times: int) -> tuple[TrainConfig, str]:
    """``config`` with ``field`` (``auto`` -> kplanes when the store holds time) and, for kplanes,
    ``time_resolution`` resolved, and why. ``distinct_times``: the store's distinct view times (0 for
    a store without time).
    """
    if config.field == "auto":
        kind = "kplanes" if distinct_times else "static"
        why = (
            f"--field auto: the store holds per-view times ({distinct_times} distinct): kplanes, a "
            "space-time field (a static field would average the motion away)"
            if distinct_times
            else "--field auto: the store holds no per-view time: static"
        )
        config = config.replace(field=kind)
    else:
        why = "chosen with --field"
    if config.field != "kplanes":
        return config, why
    if not distinct_times:
        raise ConfigError(f"{config.store}: --field kplanes needs per-view times; the store holds none")
    if config.time_resolution is not None:
        return config, f"{why}; --time-resolution {config.time_resolution}"
    cells = max(2, distinct_times // 2)
    return config.replace(time_resolution=cells), f"{why}; time resolution {cells}: half the distinct times"
