"""Subcommands ``raykit train``, ``render`` (a run, or an export with ``--model``), ``compare`` and ``export``
(train flags from TrainConfig)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError
from raykit.locks import store_lock
from raykit.options import add_command
from raykit.trainer.config import TrainConfig, add_arguments, from_args

__all__ = ["build_train_parser", "register", "train_in_folder"]


def register(subparsers: Any) -> None:
    """Add ``train``, ``render``, ``export`` and ``compare`` to the ``raykit`` parser."""
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
    render.add_argument("--model", default=None, help="render from this export instead of a run directory")
    render.add_argument(
        "--cameras", default=None, help="with --model: a ray store (its --split) or a transforms.json"
    )
    render.add_argument("--out", default=None, help="with --model: directory for the PNGs and render.json")
    export = add_command(
        subparsers,
        "export",
        "write a self-contained model of a run (safetensors, config, sampler state, eval figures)",
        _export,
        description=(
            "raykit export RUN OUT writes the run's evaluated checkpoint as a self-contained model; "
            "with --verify it then re-renders the test split from the export and fails unless the "
            "PSNR matches the run's eval within 0.05 dB. raykit export --verify OUT checks an "
            "existing export."
        ),
    )
    export.add_argument("run", nargs="?", metavar="RUN", help="run directory (omit with --verify OUT)")
    export.add_argument("out", metavar="OUT", help="export directory (created)")
    export.add_argument("--verify", action="store_true", help="re-render the test split and compare PSNR")
    export.add_argument("--split", default="test", help="split verified (default: test)")
    export.add_argument("--store", default=None, help="the run's store, if it moved since training")
    export.add_argument("--device", default=None, help="device for --verify (default: the run's)")
    export.add_argument("--force", action="store_true", help="replace an existing export directory")
    compare = add_command(subparsers, "compare", "metric differences between two runs", _compare)
    compare.add_argument("run_a", help="first run directory")
    compare.add_argument("run_b", help="second run directory")
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")


def build_train_parser(prog: str = "raykit train") -> argparse.ArgumentParser:
    """A standalone parser with the ``train`` flags (used by ``python -m raykit.trainer``)."""
    parser = argparse.ArgumentParser(prog=prog, description="train a radiance field on a ray store")
    add_arguments(parser)
    return parser


def train_in_folder(config: TrainConfig) -> Path:
    """``train(config)`` holding ``<out>.lock`` on rank 0: one trainer per run folder, so a second one
    (a rerun after its sweep or pipeline was killed, or a second ``raykit train``) is refused, naming
    the live one."""
    from raykit.trainer.loop import train

    first = os.environ.get("RANK", "0") == "0" and config.out
    with store_lock(config.out, what="training run") if first else contextlib.nullcontext():
        return train(config)


def _train(args: argparse.Namespace) -> int:
    run_dir = train_in_folder(from_args(args))
    print(f"run directory: {run_dir}")
    return 0


def _render(args: argparse.Namespace) -> int:
    from raykit.trainer.evaluate import render

    if args.model is not None:
        return _render_model(args)
    if args.run_dir is None:
        raise ConfigError("render: expected a run directory, or --model OUT --cameras ... --out DIR")
    result = render(args.run_dir, args.split, args.device)
    split = result["splits"][args.split]
    print(
        f"{args.split}: psnr {split['psnr']:.3f} dB, ssim {split['ssim']:.4f} over {split['n_images']} images"
    )
    return 0


def _compare(args: argparse.Namespace) -> int:
    from raykit.trainer.comparison import compare, eval_protocols, format_table

    rows = compare(args.run_a, args.run_b)
    protocol_a, protocol_b = eval_protocols(args.run_a, args.run_b)
    if args.json:
        print(json.dumps([row.to_dict() for row in rows], indent=2))
    else:
        print(format_table(rows, "A", "B"))
        print(f"protocol: A {protocol_a}, B {protocol_b}; psnr_float, ssim_float: float figures of old runs")
    return 0


def _render_model(args: argparse.Namespace) -> int:
    from raykit.trainer.deploy import render_export

    missing = [flag for flag in ("cameras", "out") if getattr(args, flag) is None]
    if missing or args.run_dir is not None:
        raise ConfigError(
            "render --model: expected --cameras STORE|transforms.json and --out DIR, and no run directory"
        )
    result = render_export(args.model, args.cameras, args.out, split=args.split, device=args.device)
    quality = (
        f", psnr {result['psnr']:.3f} dB, ssim {result['ssim']:.4f}" if result["psnr"] is not None else ""
    )
    print(f"rendered {result['n_images']} images into {args.out}{quality}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from raykit.trainer.deploy import verify_export
    from raykit.trainer.export import export_run

    if args.run is None and not args.verify:
        raise ConfigError("export: expected RUN OUT, or --verify OUT to check an existing export")
    out = args.out
    if args.run is not None:
        export_run(args.run, out, store=args.store, force=args.force)
        print(f"exported {args.run} to {out}")
    if args.verify:
        result = verify_export(out, split=args.split, store=args.store, device=args.device)
        print(
            f"verified {out}: {result['split']} psnr ({result['protocol']}) {result['psnr']:.3f} dB "
            "from the export, "
            f"{result['run_psnr']:.3f} dB in the run's eval (difference {result['difference_db']:.4f} dB, "
            f"{result['n_images']} images)"
        )
    return 0
