"""Score matched pairs under a protocol and write ``results.json`` (same inputs, same bytes).

``results.json``::

    {"raykit_version": "0.1.0", "protocol": {...every parameter...}, "background": [255, 255, 255],
     "predictions": {"path": "PRED", "layout": "folder", "sha256": "<set hash>"},
     "ground_truth": {"path": "GT", "kind": "store", "split": "test", "sha256": "<set hash>"},
     "n_images": 2, "means": {"psnr": 27.1, "ssim": 0.93, "lpips": 0.08},
     "images": [{"name": "r_0", "prediction": "PRED/r_0.png", "ground_truth": "GT/r_0.png",
                 "prediction_sha256": "...", "ground_truth_sha256": "...",
                 "psnr": 27.5, "ssim": 0.94, "lpips": 0.07}, ...]}

A PSNR of identical images (infinite) is written as null, and so is a mean over it. Ground truth from a
store with masks is a *masked* evaluation (``--masks``, the default): each image is scored on the pixels
its mask uses (``raykit.metrics.MASKED_SCORING``), and the protocol block says ``"masked": true`` and
``"mask"`` (the rule), so the results are never mistaken for an unmasked evaluation's. ``lpips`` is
AlexNet's figure, ``lpips_vgg`` VGG's (protocol ``nerf``). An image's sha256 is its file's bytes (or, for an
image inside another file or a store, its pixels); a set's is the sha256 of its ``NAME SHA256`` lines in
name order. Paths are written as given, so moving the inputs keeps the bytes.
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
from raykit.metrics import (
    LPIPS,
    MASKED_SCORING,
    MIN_SIDE,
    Protocol,
    background_tensor,
    load_lpips,
    lpips_weight_paths,
    masked_pair,
    masked_psnr,
    parse_background,
    protocol_named,
    psnr,
    ssim,
    to_protocol_image,
)
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
        True, "compute LPIPS (needs the published weights on this machine; nothing is downloaded)"
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
    pred: torch.Tensor
    gt: torch.Tensor
    pred_sha256: str
    gt_sha256: str
    figures: dict[str, float | None] | None = None
    used: torch.Tensor | None = None  # (H, W) bool: the pixels a masked evaluation scores


def _figures(
    pred: torch.Tensor, gt: torch.Tensor, protocol: Protocol, used: torch.Tensor | None = None
) -> dict[str, float | None]:
    """PSNR and SSIM of one ``(1, H, W, 3)`` uint8 pair under ``protocol`` (with ``used``, the pair
    already masked: PSNR over the used pixels)."""
    value = psnr(pred, gt) if used is None else masked_psnr(pred, gt, used[None].to(pred.device))
    return {
        "psnr": _finite(float(value[0])),
        "ssim": float(ssim(pred, gt, kernel_size=protocol.ssim_kernel, sigma=protocol.ssim_sigma,
                            k1=protocol.ssim_k1, k2=protocol.ssim_k2)[0]),
    }  # fmt: skip


def _load_pair(
    pair: Pair, background: torch.Tensor, protocol: Protocol | None, masks: bool = True
) -> _Loaded:
    """Read, check, hash and convert one pair; with ``protocol`` (metrics on the CPU) score it too, here
    on the reader thread, so that pairs are scored in parallel (OpenCV and numpy release the GIL). With
    ``masks`` and a ground-truth mask, the pair's unused pixels are set to the background (SSIM and LPIPS
    compare that pair; PSNR is over the used pixels)."""
    pred, gt = pair.pred.load(), pair.gt.load()
    if pred.shape[:2] != gt.shape[:2]:
        raise SourceError(
            f"{pair.pred.label}: size {pred.shape[1]}x{pred.shape[0]} differs from the ground truth's "
            f"{gt.shape[1]}x{gt.shape[0]} ({pair.gt.label})"
        )
    loaded = _Loaded(
        to_protocol_image(torch.from_numpy(pred), background),
        to_protocol_image(torch.from_numpy(gt), background),
        pair.pred.sha256(pred),
        pair.gt.sha256(gt),
    )
    if masks and pair.gt.mask is not None:
        mask = np.asarray(pair.gt.mask())
        if mask.shape != gt.shape[:2]:
            raise SourceError(f"{pair.gt.label}: its mask is {mask.shape[1]}x{mask.shape[0]}, the image not")
        loaded.used = torch.from_numpy(mask > 0)
        fill = (background * 255.0).round().to(torch.uint8)
        loaded.pred, loaded.gt = masked_pair(loaded.pred, loaded.gt, loaded.used, fill)
    if protocol is not None:
        loaded.figures = _figures(loaded.pred[None], loaded.gt[None], protocol, loaded.used)
    return loaded


def _lpips_models(config: EvaluateConfig) -> dict[str, LPIPS]:
    if not config.lpips:
        return {}
    paths = {
        "alex": (config.lpips_alex_trunk, config.lpips_alex_heads),
        "vgg": (config.lpips_vgg_trunk, config.lpips_vgg_heads),
    }
    nets = protocol_named(config.protocol).lpips_nets
    return {net: load_lpips(lpips_weight_paths(net, *paths[net]), config.device) for net in nets}


def _scored(pairs: list[Pair], config: EvaluateConfig) -> Iterator[tuple[Pair, _Loaded]]:
    background = background_tensor(parse_background(config.background))
    on_cpu = protocol_named(config.protocol) if torch.device(config.device).type == "cpu" else None
    with ThreadPoolExecutor(config.threads) as pool:
        yield from in_order(
            pool,
            lambda pair: _load_pair(pair, background, on_cpu, config.masks),
            pairs,
            ahead=2 * config.threads,
        )


def _check_lpips_size(pair: Pair, shape: tuple[int, ...], models: dict[str, LPIPS]) -> None:
    for net in models:
        if min(shape[0], shape[1]) < MIN_SIDE[net]:
            raise SourceError(
                f"{pair.pred.label}: {shape[1]}x{shape[0]} is smaller than LPIPS {net} takes "
                f"({MIN_SIDE[net]} pixels a side); pass --no-lpips to score PSNR and SSIM only"
            )


def score(found: PairSet, config: EvaluateConfig) -> dict[str, Any]:
    """The results document of ``found`` (module docstring), without writing it."""
    protocol = protocol_named(config.protocol)
    models = _lpips_models(config)
    device = torch.device(config.device)
    images = []
    masked = False
    for pair, loaded in _scored(found.pairs, config):
        pred, gt = loaded.pred[None].to(device), loaded.gt[None].to(device)
        record: dict[str, Any] = {
            "name": pair.name,
            "prediction": pair.pred.label,
            "ground_truth": pair.gt.label,
            "prediction_sha256": loaded.pred_sha256,
            "ground_truth_sha256": loaded.gt_sha256,
            **(loaded.figures or _figures(pred, gt, protocol, loaded.used)),
        }
        masked = masked or loaded.used is not None
        _check_lpips_size(pair, loaded.pred.shape, models)
        with torch.no_grad():
            for net, model in models.items():
                record["lpips" if net == "alex" else f"lpips_{net}"] = float(model(pred, gt)[0])
        images.append(record)
    metrics = [k for k in ("psnr", "ssim", "lpips", "lpips_vgg") if images and k in images[0]]
    block = protocol.to_dict()
    if masked:
        block.update(masked=True, mask=MASKED_SCORING)
    return {
        "raykit_version": __version__,
        "protocol": block,
        "lpips_computed": bool(models),
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
        "means": {k: _mean([im[k] for im in images]) for k in metrics},
        "images": images,
    }


def _finite(value: float) -> float | None:
    """JSON has no infinity: identical images (infinite PSNR) are written as null."""
    return value if np.isfinite(value) else None


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None]
    return None if len(finite) < len(values) else float(np.mean(finite))


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
