"""Evaluation: render full held-out images, figures per image and per split, ``eval.json`` and PNGs.

``RUN_DIR/eval.json``::

    {"step": 1234, "checkpoint": "checkpoints/step-00001234",
     "protocol": {"name": "default", "ssim": {...}, "lpips": {...}, "background": [255, 255, 255],
                  "lpips_status": "computed (alex)", ...},
     "splits": {"test": {"psnr": 27.1, "ssim": 0.93, "lpips": 0.08, "n_images": 10, "seconds": 4.2,
                         "images": [{"name": "r_0.png", "psnr": 27.5, "ssim": 0.94, "lpips": 0.07}, ...]}}}

Figures from :class:`raykit.metrics.Scorer`, split values are means over images (docs/evaluation.md,
"raykit's own figures": the protocol, masks, older runs). Renders go to
``RUN_DIR/renders/SPLIT/NNN_NAME.png`` (``raykit.evaluation.render_stem``; a timed image's entry also
carries its ``camera``, ``time`` and ``file``), quantised as the protocol quantises, so ``raykit
evaluate RUN_DIR/renders/test STORE:test`` gives the same figures. Rendering is deterministic.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from raykit.errors import ConfigError, RaykitError, ResumeError
from raykit.evaluation import render_stem, view_time
from raykit.fileio import atomic_path, atomic_write_json, read_json
from raykit.loaders import reference_batch
from raykit.metrics import Scorer, quantize
from raykit.rays import RayBatch
from raykit.store import RayStore
from raykit.trainer.checkpoint import latest_checkpoint, load_checkpoint
from raykit.trainer.config import TrainConfig
from raykit.trainer.defaults import resolve_resolution, resolve_sampler
from raykit.trainer.field import RadianceField
from raykit.trainer.inference import render_colours
from raykit.trainer.occupancy import OccupancyGrid
from raykit.trainer.pipeline import proposal_counts
from raykit.trainer.proposal import ProposalNetworks
from raykit.trainer.runtime import parse_background, resolve_device
from raykit.trainer.spacetime import SpaceTimeField

__all__ = [
    "build_models",
    "evaluate_run",
    "image_rays_and_pixels",
    "models_from_state",
    "quick_psnr",
    "render",
    "render_view",
    "save_render",
]


def build_models(
    config: TrainConfig,
    aabb: torch.Tensor,
    device: torch.device,
    ndc_frame: torch.Tensor | None = None,
    time_range: Any = None,
) -> tuple[RadianceField, Any]:
    """The field (seeded by ``config.seed``) and the sampler's state module, on ``device``.

    The field is a :class:`SpaceTimeField` over ``time_range`` (default (0, 1)) when ``config.field``
    is ``kplanes``, else the static :class:`RadianceField`. The state module is the occupancy
    sampler's :class:`OccupancyGrid` (over the field coordinates when the field is contracted), the
    proposal sampler's :class:`ProposalNetworks`, else None. ``ndc_frame`` is the NDC reference camera
    of a field in scene space ``ndc``.
    """
    space = "box" if config.scene_space == "auto" else config.scene_space
    config = resolve_resolution(resolve_sampler(config)[0])[0]
    assert config.max_resolution is not None
    timed: dict[str, Any] = {}
    if config.field == "kplanes":
        timed = {"time_range": (0.0, 1.0) if time_range is None else time_range}
        if config.time_resolution is None:  # resolved from the store by the trainer (resolve_field)
            raise ConfigError("--field kplanes: --time-resolution unresolved (expected a number)")
        timed["time_resolution"] = config.time_resolution
    field = (SpaceTimeField if timed else RadianceField)(
        aabb,
        **timed,
        levels=config.levels,
        base_resolution=config.base_resolution,
        max_resolution=config.max_resolution,
        features=config.features,
        hidden=config.hidden,
        seed=config.seed,
        space=space,
        ndc_frame=ndc_frame,
    ).to(device)
    grid: Any = None
    if config.sampler == "occupancy":
        grid_box = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]) if space == "contract" else aabb
        grid = OccupancyGrid(
            grid_box, config.occ_resolution, threshold=config.occ_threshold, ball=space == "contract"
        ).to(device)
    elif config.sampler == "proposal":
        grid = ProposalNetworks(
            aabb,
            len(proposal_counts(config.prop_samples)),
            config.prop_resolution,
            space=space,
            seed=config.seed,
        ).to(device)
    return field, grid


def image_rays_and_pixels(store: RayStore, name: str, device: torch.device) -> tuple[RayBatch, np.ndarray]:
    """Image ``name``'s rays (as ``raykit.loaders.image_rays`` makes them) and its stored pixels (H, W, C)
    uint8 (as ``store.read_image(name)`` returns them), from one read of the image: an evaluation
    scores against both, and a second read would decode the image again."""
    raw = store.image_raw(name)
    height, width, channels = store.image_shape(name)
    pixels = np.ascontiguousarray(raw.rgba[:, :channels]).reshape(height, width, channels)
    return reference_batch(store, raw, device), pixels


@torch.no_grad()
def render_view(
    config: TrainConfig,
    store: RayStore,
    name: str,
    field: RadianceField,
    grid: Any,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Render image ``name``: ``(prediction (H, W, 3), target (H, W, 3))``, both over the background,
    and its stored pixels (H, W, C) uint8 (``store.read_image(name)``), the image read once
    (:func:`image_rays_and_pixels`)."""
    height, width, _ = store.image_shape(name)
    batch, pixels = image_rays_and_pixels(store, name, device)
    background = parse_background(config.background).to(device)
    pred = render_colours(config, field, grid, batch, background).view(height, width, 3).cpu()
    target = batch.composite(background).view(height, width, 3).cpu()
    return pred, target, pixels


def models_from_state(
    config: TrainConfig,
    tensors: dict[str, Any],
    device: torch.device,
    where: str = "state",
    error: type[RaykitError] = ResumeError,
) -> tuple[RadianceField, Any]:
    """The models of a checkpoint's (or an export's) tensors, on ``device``, in evaluation mode.

    Shared by ``raykit render RUN`` and ``raykit render --model OUT``: ``tensors`` holds one state dict
    per model under the checkpoint's group names (``field``, ``grid``). Tensors that do not fit the
    models raise ``error`` (an export's loader passes ``ExportError``) naming ``where``.
    """
    try:
        state = tensors["field"]
        field, grid = build_models(
            config, state["aabb"], device, state.get("ndc_frame"), state.get("time_range")
        )
        field.load_state_dict(tensors["field"])
        if grid is not None:
            grid.load_state_dict(tensors["grid"])
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as exc:
        if isinstance(exc, RaykitError):
            raise
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise error(f"{where}: the state does not fit the models of its config: {text}") from None
    field.eval()
    return field, grid


def quick_psnr(
    config: TrainConfig,
    store: RayStore,
    field: RadianceField,
    grid: Any,
    device: torch.device,
) -> dict[str, Any]:
    """Mean PSNR over the first ``progress_images`` images of the first eval split (no files written)."""
    split = config.eval_splits.split(",")[0]
    names = store.images(split)[: config.progress_images]
    scorer = Scorer(parse_background(config.background), lpips=False, masked=has_masks(store))
    values = [_protocol_psnr(scorer, config, store, name, field, grid, device) for name in names]
    return {
        "split": split,
        "n_images": len(values),
        "psnr": float(np.mean(values)) if values else float("nan"),
    }


def _protocol_psnr(
    scorer: Scorer,
    config: TrainConfig,
    store: RayStore,
    name: str,
    field: RadianceField,
    grid: Any,
    device: torch.device,
) -> float:
    pred, _, pixels = render_view(config, store, name, field, grid, device)
    value = scorer.score(pred, pixels, image_mask(store, name))["psnr"]
    return float("inf") if value is None else float(value)


def has_masks(store: RayStore) -> bool:
    """Whether ``store``'s images have masks: its evaluation is then masked (``raykit.metrics.Scorer``)."""
    return "mask" in store.components


def image_mask(store: RayStore, name: str) -> np.ndarray | None:
    """Image ``name``'s (H, W) uint8 mask (0 = pixel not used), or None when the store has none."""
    return store.read_component("mask", name) if has_masks(store) else None


def save_render(path: Path, image: torch.Tensor) -> None:
    """``image`` (H, W, 3) in [0, 1] as a PNG, quantised as the protocol quantises, written atomically."""
    pixels = quantize(image).numpy()  # as the protocol quantises: raykit evaluate reproduces eval.json
    with atomic_path(path) as tmp:
        Image.fromarray(pixels).save(tmp, format="PNG")


def evaluate_split(
    run_dir: Path,
    config: TrainConfig,
    store: RayStore,
    split: str,
    field: RadianceField,
    grid: Any,
    device: torch.device,
    scorer: Scorer | None = None,
) -> dict[str, Any]:
    """Metrics of one split (see the module docstring), writing its renders."""
    start = time.perf_counter()
    scorer = scorer or _scorer(config, store, device)
    names = store.images(split)[: config.eval_max_images]
    images = []
    for i, name in enumerate(names):
        pred, _, pixels = render_view(config, store, name, field, grid, device)
        file = f"{i:03d}_{render_stem(store, name)}.png"
        save_render(run_dir / "renders" / split / file, pred)
        mask = image_mask(store, name) if scorer.masked else None
        when = view_time(store, name)
        timed = {} if when is None else {"camera": when[0], "time": when[1], "file": file}
        images.append({"name": name, **timed, **scorer.score(pred, pixels, mask)})
    return {
        **scorer.means(images),
        "n_images": len(images),
        "seconds": time.perf_counter() - start,
        "images": images,
    }


def evaluate_run(
    run_dir: Path,
    config: TrainConfig,
    store: RayStore,
    field: RadianceField,
    grid: Any,
    device: torch.device,
    splits: list[str] | None = None,
    step: int | None = None,
) -> dict[str, Any]:
    """Evaluate ``splits`` (default: ``config.eval_splits``), merge into ``RUN_DIR/eval.json``, return it."""
    field.eval()
    splits = splits or [s for s in config.eval_splits.split(",") if s]
    path = run_dir / "eval.json"
    result: dict[str, Any] = {"splits": {}}
    if path.exists():  # merged into: a record of this run folder, bounded; one line when it is not one
        try:
            result = read_json(path)
        except ValueError as exc:
            raise ResumeError(f"{exc}; remove it to evaluate afresh") from None
        if not isinstance(result, dict) or not isinstance(result.get("splits"), dict):
            raise ResumeError(f"{path}: expected an object with 'splits'; remove it to evaluate afresh")
    checkpoint = latest_checkpoint(run_dir)
    result["checkpoint"] = None if checkpoint is None else str(checkpoint.relative_to(run_dir))
    result["step"] = step if step is not None else _step_of(checkpoint)
    scorer = _scorer(config, store, device)
    if "protocol" not in result and result["splits"]:  # kept apart: never mixed with the protocol's figures
        result["splits_before_protocol"], result["splits"] = result["splits"], {}
    result["protocol"] = scorer.protocol_block()
    for split in splits:
        if split in store.splits:
            result["splits"][split] = evaluate_split(
                run_dir, config, store, split, field, grid, device, scorer
            )
    atomic_write_json(path, result)
    return result


def _scorer(config: TrainConfig, store: RayStore, device: torch.device) -> Scorer:
    """The run's scorer: LPIPS when the published weights are on this machine (training never fetches)."""
    return Scorer(parse_background(config.background), device=device, offline=True, masked=has_masks(store))


def _step_of(checkpoint: Path | None) -> int | None:
    return None if checkpoint is None else int(checkpoint.name.split("-")[-1])


def render(run_dir: str | Path, split: str = "test", device: str | None = None) -> dict[str, Any]:
    """``raykit render RUN_DIR --split test``: evaluate the run's newest checkpoint on ``split``."""
    from raykit.store import open_store

    run_dir = Path(run_dir)
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise ResumeError(f"{run_dir}: no checkpoint to render from (expected {run_dir}/checkpoints/step-*)")
    meta, tensors = load_checkpoint(checkpoint)
    config = TrainConfig.from_dict(meta.config)
    torch_device = resolve_device(device or config.device)
    store = open_store(config.store)
    field, grid = models_from_state(config, tensors, torch_device, str(checkpoint))
    return evaluate_run(run_dir, config, store, field, grid, torch_device, [split], meta.step)
