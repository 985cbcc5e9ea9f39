"""Subcommand ``raykit export`` and the ``--model`` form of ``raykit render`` (registered by trainer.cli)."""

from __future__ import annotations

import argparse
from typing import Any

from raykit.errors import ConfigError
from raykit.options import add_command

__all__ = ["add_render_model_arguments", "register_export", "render_model"]


def register_export(subparsers: Any) -> None:
    """Add ``raykit export RUN OUT [--verify]`` and ``raykit export --verify OUT``."""
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


def add_render_model_arguments(render: argparse.ArgumentParser) -> None:
    """``raykit render --model OUT --cameras STORE|transforms.json --out DIR``."""
    render.add_argument("--model", default=None, help="render from this export instead of a run directory")
    render.add_argument(
        "--cameras", default=None, help="with --model: a ray store (its --split) or a transforms.json"
    )
    render.add_argument("--out", default=None, help="with --model: directory for the PNGs and render.json")


def render_model(args: argparse.Namespace) -> int:
    """Handler of ``raykit render --model``."""
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
