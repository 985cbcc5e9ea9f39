"""What :func:`~raykit.trainer.loop.train` builds before its first step (:class:`Run`, :func:`setup_run`)
and the records a run leaves beside its checkpoints (config.json, run.json, ranks/rank-R.json)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

import raykit
from raykit.errors import ConfigError
from raykit.fileio import atomic_write_json
from raykit.loaders import RayLoader, SamplingConfig
from raykit.store import IMAGES_LAYOUT, RayStore, open_store
from raykit.trainer.budget import SampleBudget
from raykit.trainer.config import TrainConfig
from raykit.trainer.defaults import (
    default_reasons,
    resolve_field,
    resolve_resolution,
    resolve_sampler,
    resolve_steps,
)
from raykit.trainer.evaluate import build_models
from raykit.trainer.field import RadianceField
from raykit.trainer.logging_tb import TensorBoardLog, first_test_view, open_tensorboard
from raykit.trainer.proposal import ProposalNetworks
from raykit.trainer.runtime import (
    JsonlLog,
    Processes,
    check_splits,
    end_processes,
    environment,
    resolve_background,
    resolve_device,
    start_processes,
)
from raykit.trainer.space import resolve_space, scene_space

__all__ = ["Run", "parameter_digest", "record_run", "setup_run", "write_rank_digest"]


@dataclass
class Run:
    """What one training process holds (built by :func:`setup_run`)."""

    config: TrainConfig
    run_dir: Path
    store: RayStore
    device: torch.device
    procs: Processes
    field: RadianceField
    grid: Any  # the sampler's state: OccupancyGrid, ProposalNetworks or None
    model: Any
    optimizer: torch.optim.Optimizer
    loader: RayLoader
    jitter: torch.Generator
    refresh: torch.Generator
    log: JsonlLog
    progress: JsonlLog
    tensorboard: TensorBoardLog | None
    progress_step: int = -1
    space: dict[str, Any] = field(default_factory=dict)
    choices: dict[str, Any] = field(default_factory=dict)  # run.json's "sampler" and "background": why
    budget: SampleBudget | None = None


def setup_run(config: TrainConfig) -> Run:
    """Device, processes, store, models, optimizer, loader and generators for ``config``."""
    if Path(config.out).exists() and not Path(config.out).is_dir():
        raise ConfigError(f"{config.out}: --out is a file; expected a run folder (new or existing)")
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    procs = start_processes(device)
    try:
        return _build(config, device, procs)
    except BaseException:
        end_processes(procs)
        raise


def _build(config: TrainConfig, device: torch.device, procs: Processes) -> Run:
    """:func:`setup_run` once the process group is joined: the store, models, optimizer, loader, logs."""
    store = open_store(config.store)
    check_splits(config, store)
    config, reason = resolve_space(config, store)
    space = scene_space(config, store, reason)
    config, sampler_reason = resolve_sampler(config)
    config, resolution_reason = resolve_resolution(config)
    config, steps_reason = resolve_steps(config)
    config, background_reason = resolve_background(config, store)
    times = store.table.time
    distinct = 0 if times is None else len(np.unique(times))
    config, field_reason = resolve_field(config, distinct)
    time_range = None if times is None else (float(times.min()), float(times.max()))
    field_, grid = build_models(config, space.aabb, device, space.ndc_frame, time_range)
    budget = None
    if config.samples_per_step is not None:
        budget = SampleBudget.start(
            config.samples_per_step, config.budget_granule, _max_samples_per_ray(config)
        )
    loader = RayLoader(
        store, config.train_split, config.batch_size if budget is None else config.budget_granule,
        config.seed, device=device,
        num_workers=config.num_workers, rank=procs.rank, world_size=procs.world_size,
        components=tuple(name for name in ("mask",) if name in store.components),  # the loss's masks
        sampling=_loader_sampling(config, store),
    )  # fmt: skip
    run_dir = Path(config.out)
    return Run(
        config=config,
        run_dir=run_dir,
        store=store,
        device=device,
        procs=procs,
        field=field_,
        grid=grid,
        model=_training_model(config, field_, procs),
        optimizer=torch.optim.Adam(_param_groups(config, field_, grid), eps=config.adam_eps, fused=True),
        loader=loader,
        jitter=torch.Generator(device).manual_seed(config.seed * 1_000_003 + procs.rank),
        refresh=torch.Generator(device).manual_seed(config.seed * 1_000_003 + 999_983),
        log=JsonlLog(run_dir / "log.jsonl"),
        progress=JsonlLog(run_dir / "progress.jsonl"),
        tensorboard=open_tensorboard(
            config.logger,
            run_dir,
            procs.is_main,
            lambda: first_test_view(config, store, field_, grid, device),
            config.log_image_every_s,
        ),
        space=space.describe(),
        choices={
            "sampler": {"name": config.sampler, "reason": sampler_reason},
            "background": {"colour": config.background, "reason": background_reason},
            "field": {
                "max_resolution": config.max_resolution,
                "reason": resolution_reason,
                "kind": config.field,
                "kind_reason": field_reason,
                **_time_choices(config, time_range),
            },
            "steps": {"steps": config.steps, "reason": steps_reason},
            "ray_sampling": _sampling_choices(config, store),
        },
        budget=budget,
    )


def _param_groups(config: TrainConfig, field_: RadianceField, grid: Any) -> list[dict[str, Any]]:
    """Adam's parameter groups, each with its ``lr_scale`` of the schedule's rate (the loop sets
    ``lr``): a kplanes field's time planes at ``--time-lr-scale``, everything else at 1."""
    time_planes: list[torch.nn.Parameter] = list(getattr(field_, "time_planes", ()))
    timed = set(map(id, time_planes))
    params = [*field_.parameters(), *(grid.parameters() if grid is not None else ())]
    groups = [{"params": [p for p in params if id(p) not in timed], "lr": config.lr, "lr_scale": 1.0}]
    if time_planes:
        scale = config.time_lr_scale
        groups.append({"params": time_planes, "lr": config.lr * scale, "lr_scale": scale})
    return groups


def _time_choices(config: TrainConfig, time_range: tuple[float, float] | None) -> dict[str, Any]:
    """run.json's record of a kplanes field: its time range and resolution, and what each sampler
    does with time (:mod:`raykit.trainer.spacetime`)."""
    if config.field != "kplanes":
        return {}
    over_time = {
        "occupancy": f"the grid evaluates each refreshed cell at {config.occ_time_samples} random "
        "time(s) (--occ-time-samples) and keeps the densest, decaying over refreshes, so moving content "
        "stays occupied; the optional "
        "no-gradient early-stop and opacity passes are skipped",
        "proposal": "the proposal networks are static: they bound the field's weights over all times",
    }.get(config.sampler, "samples are placed per ray at the ray's time")
    return {
        "time_range": time_range,
        "time_resolution": config.time_resolution,
        "time_lr_scale": config.time_lr_scale,
        "sampler_over_time": over_time,
    }


def _loader_sampling(config: TrainConfig, store: RayStore) -> SamplingConfig:
    """The loader's sampling stage for ``--ray-sampling`` (``temporal``: ``--ist-step`` in the loader's
    batches, which are the steps' unless ``--samples-per-step`` draws steps from granules).
    """
    if config.ray_sampling != "temporal":
        return SamplingConfig(kind=config.ray_sampling)
    if store.layout(config.train_split) != IMAGES_LAYOUT:
        raise ConfigError(
            f"{config.store}: --ray-sampling temporal draws from an images-layout store (split "
            f"{config.train_split!r} is pre-shuffled rays): convert with --layout images, or `raykit copy "
            f"{config.store} DST --format zarr --layout images`"
        )
    if not {"isg", "ist"} <= set(store.components):
        raise ConfigError(
            f"{config.store}: --ray-sampling temporal draws by the store's ISG/IST weights, which it "
            f"lacks: run `raykit add-component {config.store} temporal`"
        )
    ist_step = config.ist_step
    if config.samples_per_step is not None:  # the loader's batches are granules
        ist_step = -(-config.ist_step * config.batch_size // config.budget_granule)
    return SamplingConfig(kind="temporal", ist_step=ist_step)


def _sampling_choices(config: TrainConfig, store: RayStore) -> dict[str, Any]:
    """run.json's record of ``--ray-sampling``: losses are never reweighted by the draw's probability;
    ``temporal`` adds its schedule and the weights' level and options."""
    record: dict[str, Any] = {"name": config.ray_sampling, "reweight": False}
    if config.ray_sampling == "temporal":
        isg = store.components["isg"]
        record.update(
            ist_step=config.ist_step,
            schedule=f"ISG weights for steps 0 to {config.ist_step - 1}, IST from step {config.ist_step}"
            if config.ist_step
            else "IST weights throughout",
            weights_factor=isg.factor,  # a weight stands for a factor x factor block of its frame
            weights_source=dict(isg.source),
        )
    return record


def _training_model(config: TrainConfig, field_: RadianceField, procs: Processes) -> Any:
    """What the step queries: the field, wrapped by DDP across processes, compiled with
    ``--compile-field`` (the checkpoints and the evaluation keep using the plain field)."""
    model: Any = DistributedDataParallel(field_) if procs.distributed else field_
    return torch.compile(model, dynamic=True) if config.compile_field else model


def _max_samples_per_ray(config: TrainConfig) -> int:
    """The most field samples a ray can get from the configured sampler (the budget's first guess)."""
    return {
        "stratified": config.n_samples,
        "hierarchical": config.hier_fine,
        "proposal": config.prop_final,
    }.get(config.sampler, config.march_steps)


def parameter_digest(module: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer's bytes, in state-dict order (equal models, equal digests)."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def record_run(
    config: TrainConfig,
    run_dir: Path,
    store: RayStore,
    aabb: torch.Tensor,
    device: torch.device,
    procs: Processes,
    space: dict[str, Any] | None = None,
    choices: dict[str, Any] | None = None,
) -> None:
    """config.json and run.json: everything needed to reproduce the run, and why: the automatic choices
    (scene space, sampler, background) and every default the run kept (``defaults``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "log.jsonl").unlink(missing_ok=True)
    (run_dir / "progress.jsonl").unlink(missing_ok=True)
    atomic_write_json(run_dir / "config.json", config.to_dict())
    atomic_write_json(
        run_dir / "run.json",
        {
            "store": config.store,
            "store_fingerprint": store.fingerprint,
            "raykit_version": raykit.__version__,
            "seed": config.seed,
            "aabb": aabb.tolist(),
            "environment": environment(device, procs),
            "scene_space": space or {},
            **(choices or {"sampler": {"name": config.sampler, "reason": ""}}),
            "defaults": default_reasons(config),
        },
    )


def write_rank_digest(run_dir: Path, procs: Processes, field_: Any, grid: Any, step: int) -> None:
    """ranks/rank-R.json: this rank's final parameter digests (equal on every rank under DDP): the
    field's, and the proposal networks' (trained outside DDP, gradients averaged by hand)."""
    record: dict[str, Any] = {"rank": procs.rank, "step": step, "parameters_sha256": parameter_digest(field_)}
    if isinstance(grid, ProposalNetworks):
        record["proposal_sha256"] = parameter_digest(grid)
    atomic_write_json(run_dir / "ranks" / f"rank-{procs.rank}.json", record)
