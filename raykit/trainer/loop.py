"""``train(config)``: the training loop, readable top to bottom, and the run state it saves and restores.

A step: next batch from the loader -> (refresh the occupancy grid) -> sample intervals -> field ->
composite over the background -> MSE against the target composited the same way -> backward -> Adam.
Everything random comes from two explicit generators (sample jitter, seeded per rank; grid refresh,
identical on every rank), saved in each checkpoint with the loader position, so a resumed run
continues the very same stream of batches and samples.

The loop and the run state it saves and restores are read together (what a step changes is what a
checkpoint holds); the pieces around it live in their own modules: what is built before the first step
and the run's records in :mod:`raykit.trainer.setup`, the step's timing and log records in
:mod:`raykit.trainer.steptime`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import raykit
import raykit.recorder
from raykit.errors import ConfigError, ResumeError
from raykit.rays import RayBatch
from raykit.trainer.budget import current_memory_mb, take_rays
from raykit.trainer.checkpoint import (
    CheckpointMeta,
    check_resumable,
    decode_rng_state,
    encode_rng_state,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from raykit.trainer.config import TrainConfig
from raykit.trainer.defaults import step_limit
from raykit.trainer.elastic import gather_rank_states, rank_state
from raykit.trainer.evaluate import evaluate_run, quick_psnr
from raykit.trainer.field import RadianceField
from raykit.trainer.inference import planes_changed
from raykit.trainer.occupancy import OccupancyGrid
from raykit.trainer.pipeline import composite_samples, march_step_size, query_field, sample_rays
from raykit.trainer.proposal import (
    ProposalNetworks,
    ProposalTrace,
    average_gradients,
    distortion_loss,
    interlevel_loss,
)
from raykit.trainer.runtime import (
    Processes,
    end_processes,
    learning_rate,
    parse_background,
)
from raykit.trainer.samplers import Samples
from raykit.trainer.sampling_map import write_sampling_map
from raykit.trainer.setup import Run, record_run, setup_run, write_rank_digest
from raykit.trainer.spacetime import SpaceTimeField, max_over_time, regularisation
from raykit.trainer.steptime import StepClock, TrainState, account, log_record

__all__ = ["photometric_loss", "step_losses", "train"]


def train(config: TrainConfig) -> Path:
    """Train a radiance field on ``config.store``; evaluate; return the run directory.

    Whatever the outcome (done, an exception, a signal turned into one), the loader and its threads and
    workers end first, then the process group this run joined.
    """
    run = setup_run(config)
    try:
        run_dir = _train(run)
        if run.procs.is_main:  # the loss sampler's map beside the views it favours (none: uniform)
            write_sampling_map(run.loader, run.store, config.train_split, run.run_dir)
        return run_dir
    finally:
        run.loader.close()
        end_processes(run.procs)


def _train(run: Run) -> Path:
    config = run.config  # the scene space resolved
    field_, grid, device = run.field, run.grid, run.device
    background = parse_background(config.background).to(device)
    state = _restore(run) if config.resume and latest_checkpoint(run.run_dir) else _start(run)
    batches, window = run.loader.forever(), TrainState()
    bar = _progress_bar(config, state, run.procs)
    clock = StepClock(device, raykit.recorder.active())
    while state.step < step_limit(config):
        elapsed = _shared_elapsed(config, state, run.procs)
        if config.max_seconds is not None and elapsed >= config.max_seconds:
            break
        clock.start()
        batch = (
            next(batches)
            if run.budget is None
            else take_rays(batches, run.budget.rays, config.budget_granule)
        )
        clock.lap("data")
        rate = learning_rate(config, state.step, elapsed)
        for group in run.optimizer.param_groups:
            group["lr"] = rate * group.get("lr_scale", 1.0)  # older checkpoints: one group, no scale
        if isinstance(grid, OccupancyGrid) and state.step % config.occ_update_every == 0:
            _refresh_grid(run, state.step)
        observe = functools.partial(run.loader.observe, batch) if config.ray_sampling == "loss" else None
        loss, total, samples = step_losses(
            config, run.model, field_, grid, batch, background, state.step, run.jitter, clock.lap, observe
        )
        window.memory_mb = max(window.memory_mb, current_memory_mb(device))
        run.optimizer.zero_grad(set_to_none=True)
        total.backward()
        if run.procs.distributed and isinstance(grid, ProposalNetworks):
            average_gradients(grid)
        clock.lap("backward")
        run.optimizer.step()
        planes_changed(p for group in run.optimizer.param_groups for p in group["params"])  # fused Adam
        clock.lap("optimizer")
        logging = run.procs.is_main and (state.step + 1) % config.log_every == 0
        before = state.elapsed
        n_samples: int | torch.Tensor = samples.sample_count()  # on the device: read back when logged
        if run.budget is not None:  # the budget steers the next batch from this one's count
            n_samples = int(n_samples)
            run.budget.update(len(batch), n_samples)
        account(state, window, clock.finish(synchronise=logging), len(batch), n_samples)
        window.loss_sum = window.loss_sum + loss.detach()
        state.step += 1
        window.step += 1
        if logging:
            _write_log(run, log_record(state, window, device))
            window = TrainState()
        if _progress_due(config, before, state.elapsed):
            _write_progress(run, state)
        if state.step % config.ckpt_every == 0:
            _checkpoint(run, state)
        if bar is not None and config.max_seconds is not None:  # the last step may overrun the budget
            bar.update(max(0.0, min(state.elapsed, config.max_seconds) - bar.n))
        elif bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    account(state, window, clock.settle(), 0, 0)  # the device's work after the last step's end
    if run.procs.is_main and window.rays:  # the last, partial logging window
        _write_log(run, log_record(state, window, device))
    if run.tensorboard is not None:
        run.tensorboard.finish(state.step)
    _checkpoint(run, state)
    _write_progress(run, state)
    write_rank_digest(run.run_dir, run.procs, field_, grid, state.step)
    run.loader.close()
    if run.procs.is_main:
        evaluate_run(run.run_dir, config, run.store, field_, grid, device)
    if run.procs.distributed:
        dist.barrier()
    return run.run_dir


def step_losses(
    config: TrainConfig,
    model: Any,
    field: RadianceField,
    grid: Any,
    batch: RayBatch,
    background: torch.Tensor,
    step: int,
    generator: torch.Generator | None,
    lap: Callable[[str], None] = lambda phase: None,
    observe: Callable[[torch.Tensor], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Samples]:
    """The forward half of a training step: sample, query ``model`` (the field or its DDP wrapper),
    composite, and the losses: ``(photometric MSE, MSE + the proposal networks' interlevel loss + a
    kplanes field's regularisers, samples)``. On a store with masks the MSE is over the rays whose
    pixel the mask uses (:func:`photometric_loss`). ``lap(phase)`` is told when sampling, the network
    and the rendering end. Nothing is read back to the host (the occupancy sampler's packed samples have a
    data-dependent size: that one synchronisation is the sampler's), but for ``observe``, which gets
    each ray's squared error (detached, on the host: the loader's loss sampling stage)."""
    samples = sample_rays(config, field, grid, batch, step, generator)
    lap("sampling")
    sigmas, rgbs = query_field(model, samples, batch, config.mixed_precision)
    lap("network")
    rendered = composite_samples(samples, sigmas, rgbs, background)
    target = batch.composite(background)
    loss = photometric_loss(rendered["rgb"], target, batch.extra.get("mask"))
    if observe is not None:
        observe(((rendered["rgb"].detach() - target) ** 2).mean(dim=1).float().cpu())
    total = loss
    if isinstance(samples.trace, ProposalTrace):
        if samples.trace.trains_networks:
            total = loss + config.prop_loss_weight * interlevel_loss(samples.trace, rendered["weights"])
        if config.distortion_weight > 0:
            total = total + config.distortion_weight * distortion_loss(
                samples.trace.final_edges, rendered["weights"]
            )
    regulariser = regularisation(field, config.plane_tv_weight, config.time_smoothness_weight, step)
    if regulariser is not None:  # a kplanes field: K-Planes' plane TV and smoothness along time
        total = total + regulariser
    lap("rendering")
    return loss, total, samples


def photometric_loss(rgb: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean squared error of (N, 3) colours against their targets; with the rays' (N,) uint8 ``mask``
    (0 = pixel not used), over the used rays only (masked rays get no gradient; 0 when none is used)."""
    squared = (rgb - target) ** 2
    if mask is None:
        return torch.mean(squared)
    used = (mask > 0).to(squared.dtype)
    return (squared.sum(dim=1) * used).sum() / (used.sum() * squared.shape[1]).clamp(min=1)


def _progress_bar(config: TrainConfig, state: TrainState, procs: Processes) -> Any:
    """A bar over training seconds (with a time budget) or steps; None unless asked for (rank 0)."""
    if not (config.progress and procs.is_main):
        return None
    from raykit.progress import progress as progress_bar

    if config.max_seconds is not None:
        shape = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s"
        return progress_bar(
            total=config.max_seconds,
            initial=min(state.elapsed, config.max_seconds),
            desc=config.sampler,
            bar_format=shape,
            mininterval=1.0,
        )
    return progress_bar(
        total=step_limit(config), initial=state.step, unit="step", desc=config.sampler, mininterval=1.0
    )


def _shared_elapsed(config: TrainConfig, state: TrainState, procs: Processes) -> float:
    """Training seconds so far, rank 0's on every rank when a time budget applies.

    The budget and the time-based learning-rate schedule must agree across ranks, or the ranks would
    stop at different steps (deadlock) or apply different learning rates (diverging parameters).
    """
    if config.max_seconds is None or not procs.distributed:
        return state.elapsed
    clock = torch.tensor([state.elapsed], dtype=torch.float64)
    dist.broadcast(clock, src=0)
    return float(clock.item())


def _refresh_grid(run: Run, step: int) -> None:
    """Refresh the occupancy grid: every cell during warm-up, then a random share plus the occupied ones."""
    config = run.config
    if isinstance(run.grid, OccupancyGrid):
        fraction = 1.0 if step < config.occ_warmup_steps else config.occ_refresh_fraction
        step_size = march_step_size(run.field.box, config.march_steps)
        density_fn: Any = run.field.density
        if run.field.space == "contract":  # the grid covers field coordinates; one step of s inside the ball
            density_fn = run.field.density_at_coords
            box = run.field.box
            step_size = max(hi - lo for lo, hi in zip(box[:3], box[3:], strict=True)) / config.march_steps
        if isinstance(
            run.field, SpaceTimeField
        ):  # the densest of a few times per cell: moving content stays occupied
            density_fn = max_over_time(density_fn, run.field.time_range, config.occ_time_samples, run.refresh)
        run.grid.refresh(density_fn, step_size, run.refresh, fraction)


def _write_log(run: Run, record: dict[str, Any]) -> None:
    record = {**record, "lr": run.optimizer.param_groups[0]["lr"]}  # the rate of the window's last step
    run.log.write(record)
    if run.tensorboard is not None:
        run.tensorboard.write(record)


def _progress_due(config: TrainConfig, before: float, after: float) -> bool:
    """True when this step's training time crossed a multiple of ``progress_every_s``."""
    every = config.progress_every_s
    return every is not None and int(after // every) > int(before // every)


def _write_progress(run: Run, state: TrainState) -> None:
    """progress.jsonl: quick test PSNR against training time (rank 0; the time is not counted)."""
    if run.procs.is_main and run.config.progress_every_s is not None and run.progress_step != state.step:
        run.progress_step = state.step
        quick = quick_psnr(run.config, run.store, run.field, run.grid, run.device)
        run.progress.write({"step": state.step, "elapsed_s": state.elapsed, **quick})


def _rng_states(run: Run) -> dict[str, str]:
    return {
        "jitter": encode_rng_state(run.jitter),
        "refresh": encode_rng_state(run.refresh),
        "torch": encode_rng_state(torch.default_generator),
    }


def _checkpoint(run: Run, state: TrainState) -> None:
    """Rank 0 writes the checkpoint (every rank's model is identical under DDP; generators are not)."""
    own = {"jitter": encode_rng_state(run.jitter), "torch": encode_rng_state(torch.default_generator)}
    other_ranks = gather_rank_states(run.procs, own)
    if not run.procs.is_main:
        return
    meta = CheckpointMeta(
        step=state.step,
        config=run.config.to_dict(),
        loader_state=run.loader.state_dict(),
        rng_states={**_rng_states(run), **other_ranks},
        store_fingerprint=run.store.fingerprint,
        raykit_version=raykit.__version__,
        extra={
            "elapsed": state.elapsed,
            "seconds": state.seconds,
            "rays": state.rays,
            "samples": int(state.samples),
            **({"budget": run.budget.state_dict()} if run.budget is not None else {}),
        },
    )
    tensors = {
        "field": run.field.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "grid": run.grid.state_dict() if run.grid is not None else {},
    }
    save_checkpoint(run.run_dir, meta, tensors, keep=run.config.keep_checkpoints)


def _restore(run: Run) -> TrainState:
    """Load the newest checkpoint into the models, optimizer, loader and generators."""
    path = latest_checkpoint(run.run_dir)
    if path is None:
        raise ResumeError(f"{run.run_dir}: no checkpoint to resume from")
    meta, tensors = load_checkpoint(path)
    check_resumable(meta, run.store.fingerprint, run.config.to_dict(), run.config.force, str(path))
    try:  # shapes and keys the models do not have: one line naming the checkpoint
        run.field.load_state_dict(tensors["field"])
        run.optimizer.load_state_dict(tensors["optimizer"])
        if run.grid is not None and tensors.get("grid"):
            run.grid.load_state_dict(tensors["grid"])
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise ResumeError(
            f"{path}: the checkpoint does not fit the run's models: {_first_line(exc)}"
        ) from None
    if run.budget is not None and "budget" in meta.extra:
        run.budget.load_state_dict(meta.extra["budget"])
    if meta.store_fingerprint == run.store.fingerprint:
        run.loader.load_state_dict(meta.loader_state)
    rank = run.procs.rank
    run.jitter.set_state(decode_rng_state(rank_state(meta.rng_states, "jitter", rank)))
    run.refresh.set_state(decode_rng_state(meta.rng_states["refresh"]))
    torch.default_generator.set_state(decode_rng_state(rank_state(meta.rng_states, "torch", rank)))
    if run.procs.is_main:
        run.log.truncate_after(meta.step)
        run.progress.truncate_after(meta.step)
    if run.tensorboard is not None:
        run.tensorboard.truncate_after(meta.step)
    extra = meta.extra
    return TrainState(meta.step, extra["elapsed"], dict(extra["seconds"]), extra["rays"], extra["samples"])


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def _start(run: Run) -> TrainState:
    """A fresh run: refuse a directory that holds another run's checkpoints; rank 0 records the run."""
    if latest_checkpoint(run.run_dir) is not None:
        raise ConfigError(
            f"{run.run_dir}: already holds checkpoints of a run; pass --resume to continue it, "
            "or choose another --out"
        )
    if run.procs.is_main:
        record_run(run.config, run.run_dir, run.store, run.field.aabb, run.device, run.procs, run.space,
                    run.choices)  # fmt: skip
    return TrainState()
