"""Score matched pairs under a protocol and write ``results.json`` (same inputs, same bytes).

Every figure comes from :class:`raykit.metrics.Scorer`, the scorer of the trainer's ``eval.json`` too;
ground truth from a store with masks is a *masked* evaluation (``raykit.metrics.MASKED_SCORING``). The
fields of ``results.json``, hashes and nulls: docs/evaluation.md, "raykit evaluate PRED GT".
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raykit.errors import ConfigError, SourceError
from raykit.evaluation.inputs import Pair, PairSet, find_pairs
from raykit.fileio import atomic_write_json
from raykit.metrics import MIN_SIDE, Scorer, parse_background, protocol_named
from raykit.options import option
from raykit.ordered import in_order
from raykit.version import __version__

__all__ = ["EvaluateConfig", "evaluate", "score", "set_sha256"]


@dataclass(frozen=True)
class EvaluateConfig:
    """``raykit evaluate``'s options (each default written once, here)."""

    pred: str = option(
        "",
        "folder of predictions (a folder of images, ns-render dataset output or gsplat renders/)",
        positional=True,
    )
    gt: str = option(
        "",
        "ground truth: a folder of images, a raykit store split STORE:SPLIT, or PRED itself for "
        "ns-render and gsplat outputs (which carry their ground truth)",
        positional=True,
    )
    output: str = option("results.json", "where to write the results", flag="--output")
    protocol: str = option(
        "default",
        "evaluation protocol: default (LPIPS AlexNet) or nerf (AlexNet and VGG)",
        choices=("default", "nerf"),
    )
    background: str = option("white", "colour RGBA images are composited on: white, black or R,G,B in [0, 1]")
    lpips: bool = option(
        True, "compute LPIPS (the published trunk weights are fetched once, checked by hash)"
    )
    offline: bool = option(
        False, "fetch nothing: LPIPS weights must be on this machine (as RAYKIT_OFFLINE=1)", flag="--offline"
    )
    lpips_alex_trunk: str | None = option(None, "torchvision AlexNet weights (default: torch hub's cache)")
    lpips_alex_heads: str | None = option(
        None, "LPIPS AlexNet heads (default: the lpips wheel's weights/v0.1/alex.pth)"
    )
    lpips_vgg_trunk: str | None = option(None, "torchvision VGG16 weights (default: torch hub's cache)")
    lpips_vgg_heads: str | None = option(
        None, "LPIPS VGG heads (default: the lpips wheel's weights/v0.1/vgg.pth)"
    )
    device: str = option("cpu", "device the metrics run on (cpu, cuda, cuda:1, ...)")
    threads: int = option(2, "threads reading and hashing images ahead of the metrics")
    masks: bool = option(
        True,
        "score only the pixels the ground truth's masks use (a raykit store with masks); named a masked "
        "evaluation in the results",
    )

    def check(self) -> None:
        protocol_named(self.protocol)
        parse_background(self.background)
        if self.threads < 1:
            raise ConfigError(f"threads: expected at least 1, got {self.threads}")


def set_sha256(hashes: list[tuple[str, str]]) -> str:
    """sha256 of ``NAME SHA256\\n`` lines in name order: one hash for a set of images."""
    text = "".join(f"{name} {digest}\n" for name, digest in sorted(hashes))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Loaded:
    pred: torch.Tensor  # (H, W, 3) uint8 protocol images, unused pixels set to the background
    gt: torch.Tensor
    pred_sha256: str
    gt_sha256: str
    used: torch.Tensor | None = None  # (H, W) bool: the pixels a masked evaluation scores
    figures: dict[str, float | None] | None = None


def _load_pair(pair: Pair, scorer: Scorer, on_cpu: bool, masks: bool) -> _Loaded:
    """Read, check, hash and prepare one pair; ``on_cpu`` (metrics on the CPU), score PSNR and SSIM too,
    here on the reader thread, so that pairs are scored in parallel (OpenCV and numpy release the GIL).
    With ``masks`` and a ground-truth mask, the pair is scored on the mask's used pixels."""
    pred, gt = pair.pred.load(), pair.gt.load()
    if pred.shape[:2] != gt.shape[:2]:
        raise SourceError(
            f"{pair.pred.label}: size {pred.shape[1]}x{pred.shape[0]} differs from the ground truth's "
            f"{gt.shape[1]}x{gt.shape[0]} ({pair.gt.label})"
        )
    mask = np.asarray(pair.gt.mask()) if masks and pair.gt.mask is not None else None
    if mask is not None and mask.shape != gt.shape[:2]:
        raise SourceError(f"{pair.gt.label}: its mask is {mask.shape[1]}x{mask.shape[0]}, the image not")
    a, b, used = scorer.prepare(pred, gt, mask)
    loaded = _Loaded(a, b, pair.pred.sha256(pred), pair.gt.sha256(gt), used)
    if on_cpu:
        loaded.figures = scorer.figures(loaded.pred, loaded.gt, loaded.used)
    return loaded


def _scored(pairs: list[Pair], scorer: Scorer, config: EvaluateConfig) -> Iterator[tuple[Pair, _Loaded]]:
    on_cpu = scorer.device.type == "cpu"
    with ThreadPoolExecutor(config.threads) as pool:
        yield from in_order(
            pool, lambda pair: _load_pair(pair, scorer, on_cpu, config.masks), pairs, ahead=2 * config.threads
        )


def _check_lpips_size(pair: Pair, shape: tuple[int, ...], scorer: Scorer) -> None:
    for net in scorer.models:
        if min(shape[0], shape[1]) < MIN_SIDE[net]:
            raise SourceError(
                f"{pair.pred.label}: {shape[1]}x{shape[0]} is smaller than LPIPS {net} takes "
                f"({MIN_SIDE[net]} pixels a side); pass --no-lpips to score PSNR and SSIM only"
            )


def score(found: PairSet, config: EvaluateConfig) -> dict[str, Any]:
    """The results document of ``found`` (module docstring), without writing it."""
    scorer = Scorer(
        parse_background(config.background),
        protocol=config.protocol,
        device=config.device,
        lpips=config.lpips,
        weights={
            "alex": (config.lpips_alex_trunk, config.lpips_alex_heads),
            "vgg": (config.lpips_vgg_trunk, config.lpips_vgg_heads),
        },
        offline=True if config.offline else None,  # else RAYKIT_OFFLINE decides
        strict=True,
    )
    images = []
    for pair, loaded in _scored(found.pairs, scorer, config):
        pred, gt = loaded.pred.to(scorer.device), loaded.gt.to(scorer.device)
        _check_lpips_size(pair, loaded.pred.shape, scorer)
        record: dict[str, Any] = {
            "name": pair.name,
            "prediction": pair.pred.label,
            "ground_truth": pair.gt.label,
            "prediction_sha256": loaded.pred_sha256,
            "ground_truth_sha256": loaded.gt_sha256,
            **(loaded.figures or scorer.figures(pred, gt, loaded.used)),
            **scorer.lpips(pred, gt),
        }
        images.append(record)
    return {
        "raykit_version": __version__,
        "protocol": scorer.protocol_block(),
        "lpips_computed": bool(scorer.models),
        "background": list(parse_background(config.background)),
        "predictions": {
            "path": config.pred,
            "layout": found.pred_layout,
            "gsplat_step": found.gsplat_step,
            "sha256": set_sha256([(im["name"], im["prediction_sha256"]) for im in images]),
        },
        "ground_truth": {
            "path": config.gt,
            "kind": found.gt_kind,
            "split": found.gt_split,
            "sha256": set_sha256([(im["name"], im["ground_truth_sha256"]) for im in images]),
        },
        "n_images": len(images),
        "means": scorer.means(images),
        "images": images,
    }


def evaluate(config: EvaluateConfig) -> dict[str, Any]:
    """``raykit evaluate``: find the pairs, score them, write ``config.output`` atomically, return it.

    Nothing is written when any input is bad (a :class:`SourceError` line naming the file).
    """
    config.check()
    found = find_pairs(config.pred, config.gt)
    if not found.pairs:
        raise SourceError(f"{config.gt}: no ground-truth images")
    output = Path(config.output)
    if not output.parent.is_dir():
        raise SourceError(f"{output}: its folder does not exist")
    results = score(found, config)
    atomic_write_json(os.fspath(output), results)
    return results
