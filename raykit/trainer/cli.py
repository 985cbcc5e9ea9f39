"""Subcommands ``raykit train``, ``render``, ``compare`` and ``export`` (train flags from TrainConfig)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from raykit.errors import ConfigError
from raykit.options import add_command
from raykit.trainer.config import add_arguments, from_args
from raykit.trainer.export_cli import add_render_model_arguments, register_export, render_model

__all__ = ["build_train_parser", "register"]


def register(subparsers: Any) -> None:
    """Add ``train``, ``render`` and ``compare`` to the ``raykit`` parser."""
    train = add_command(
        subparsers,
        "train",
        "train a radiance field on a ray store",
        _train,
        description=(
            "Train a radiance field on a ray store. Under torchrun (python -m raykit.trainer), "
            "--max-restarts N with --resume restarts the group after a rank fails and resumes exactly "
            "from the newest checkpoint."
        ),
    )
    add_arguments(train)
    render = add_command(
        subparsers,
        "render",
        "render and evaluate a run's newest checkpoint, or an exported model (--model)",
        _render,
        description=(
            "raykit render RUN evaluates the run's newest checkpoint on --split (eval.json, PNGs). "
            "raykit render --model OUT --cameras STORE|transforms.json --out DIR renders from an "
            "export alone: no run directory, and no store when the cameras come from a transforms.json."
        ),
    )
    render.add_argument("run_dir", nargs="?", help="run directory written by raykit train")
    render.add_argument("--split", default="test", help="split to render (default: test)")
    render.add_argument("--device", default=None, help="device (default: the run's)")
    add_render_model_arguments(render)
    register_export(subparsers)
    compare = add_command(subparsers, "compare", "metric differences between two runs", _compare)
    compare.add_argument("run_a", help="first run directory")
    compare.add_argument("run_b", help="second run directory")
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_train_parser(prog: str = "raykit train") -> argparse.ArgumentParser:
    """A standalone parser with the ``train`` flags (used by ``python -m raykit.trainer``)."""
    parser = argparse.ArgumentParser(prog=prog, description="train a radiance field on a ray store")
    add_arguments(parser)
    return parser


def _train(args: argparse.Namespace) -> int:
    from raykit.trainer.loop import train

    run_dir = train(from_args(args))
    print(f"run directory: {run_dir}")
    return 0


def _render(args: argparse.Namespace) -> int:
    from raykit.trainer.evaluate import render

    if args.model is not None:
        return render_model(args)
    if args.run_dir is None:
        raise ConfigError("render: expected a run directory, or --model OUT --cameras ... --out DIR")
    result = render(args.run_dir, args.split, args.device)
    split = result["splits"][args.split]
    print(
        f"{args.split}: psnr {split['psnr']:.3f} dB, ssim {split['ssim']:.4f} over {split['n_images']} images"
    )
    return 0


def _compare(args: argparse.Namespace) -> int:
    from raykit.trainer.compare import compare, eval_protocols, format_table

    rows = compare(args.run_a, args.run_b)
    protocol_a, protocol_b = eval_protocols(args.run_a, args.run_b)
    if args.json:
        print(json.dumps([row.to_dict() for row in rows], indent=2))
    else:
        print(format_table(rows, "A", "B"))
        print(f"protocol: A {protocol_a}, B {protocol_b}; psnr_float and ssim_float are the float figures")
    return 0
