"""``raykit evaluate PRED GT``: any trainer's renders scored under the community protocol."""

from __future__ import annotations

import argparse
from typing import Any

from raykit.errors import ConfigError
from raykit.evaluation.inputs import find_pairs
from raykit.evaluation.score import EvaluateConfig, evaluate
from raykit.fileio import output_problem
from raykit.options import add_arguments, from_args
from raykit.ranges import device_problem

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``evaluate`` to the ``raykit`` parser."""
    parser = subparsers.add_parser(
        "evaluate",
        help="score renders against ground truth (PSNR, SSIM, LPIPS under the community protocol)",
        description=(
            "Score PRED against GT as nerfbaselines does: 8-bit sRGB after compositing on --background, "
            "PSNR and SSIM per image, LPIPS AlexNet (--protocol default) or AlexNet and VGG (nerf). "
            "Writes --output (results.json) with per-image metrics, means, every image's sha256 and the "
            "protocol; LPIPS's trunk weights are fetched once, checked by hash, unless --offline "
            "(see docs/evaluation.md)."
        ),
    )
    add_arguments(parser, EvaluateConfig)
    parser.set_defaults(func=_evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    config = from_args(EvaluateConfig, args)
    if (problem := device_problem(config.device)) is not None:
        raise ConfigError(f"--{problem}")
    # before any image is scored: --output is a regular file (or new) and none of the inputs
    if (
        problem := output_problem(config.output, inputs=find_pairs(config.pred, config.gt).inputs())
    ) is not None:
        raise ConfigError(f"--output {problem}")
    results = evaluate(config)
    means = ", ".join(f"{k} {'-' if v is None else f'{v:.4f}'}" for k, v in results["means"].items())
    print(f"{config.output}: {results['n_images']} images, {means} (protocol {config.protocol})")
    return 0
