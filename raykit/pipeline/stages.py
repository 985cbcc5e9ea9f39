"""The stages of ``raykit run``, each a :class:`~raykit.pipeline.runner.Stage` built from the configs.

poses (photos or a video only) -> convert (not for a store) -> validate -> profile -> train (one per
sampler, a ``python -m raykit.trainer`` process, or torchrun with ``--nproc-per-node``) -> evaluate
-> export (with verification, one per sampler) -> render -> report.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np

from raykit.converters import detect_source
from raykit.errors import ConfigError, SourceError, StoreCorruptError
from raykit.fileio import loads_json, read_bounded, read_json, sha256_file
from raykit.pipeline.config import StageConfigs, config_flags
from raykit.pipeline.records import tree_fingerprint
from raykit.pipeline.runner import Attempt, Stage, WarmStarter, run_process
from raykit.poses import POSE_SOURCES, VIDEO_EXTENSIONS
from raykit.trainer import OLD_PROTOCOL, TrainConfig, protocol_of

__all__ = [
    "export_stage",
    "read_jsonl",
    "source_kind",
    "train_config",
    "train_stage",
    "train_summary",
    "training_stage",
    "with_progress_checks",
]

MANIFEST = "manifest.json"
JSONL_LIMIT = 1 << 30  # bytes of a run's log.jsonl (a record per log_every steps: ~300 bytes each)


def source_kind(src: Path, source: str) -> str:
    """``store``, ``photos``, ``video`` or ``capture`` (a format ``raykit convert`` reads)."""
    if (src / MANIFEST).is_file():
        return "store"
    if source in POSE_SOURCES:
        return source
    if source != "auto":
        return "capture"
    if src.is_file() and src.suffix.lower() in VIDEO_EXTENSIONS:
        return "video"
    try:
        detect_source(src)
    except SourceError:
        if src.is_dir():
            return "photos"
        raise
    return "capture"


def _raykit(*args: str) -> list[str]:
    return ["raykit", *args]


def poses_stage(cfg: StageConfigs, out: Path, kind: str) -> Stage:
    """Camera poses of photos or a video (``raykit poses``) into ``OUT/poses``."""
    from raykit.poses import estimate_poses

    src, dst = Path(cfg.run.src), out / "poses"

    def run(attempt: Attempt) -> dict[str, Any]:
        summary = estimate_poses(src, dst, cfg.poses, source=kind, restart=True, progress=cfg.run.progress)
        print("\n".join("    " + line for line in summary.lines()), flush=True)
        return {"summary": summary.to_dict(), "output": tree_fingerprint(dst / "sparse"), "capture": str(dst)}

    inputs = {"source": tree_fingerprint(src), "kind": kind, "options": cfg.poses.to_dict()}
    command = _raykit("poses", str(src), str(dst), *config_flags(cfg.poses))
    return Stage("poses", inputs, run, command, (dst,))


def convert_stage(cfg: StageConfigs, out: Path, capture: Path, source_fp: str, posed: bool) -> Stage:
    """``raykit convert`` into ``OUT/store`` (the options of ``ConvertConfig``)."""
    from raykit.converters import convert

    config = dataclasses.replace(cfg.convert, src=str(capture), dst=str(out / "store"))
    if posed:  # as convert --from photos does: a COLMAP model of the stored pixels
        config = dataclasses.replace(config, source="colmap", exif="ignore")
    options = config.convert_options()

    def run(attempt: Attempt) -> dict[str, Any]:
        store = convert(config.src, config.dst, **options)
        return {"url": store.url, "output": store.fingerprint, "source_bytes": _bytes(capture)}

    # The store's bytes do not depend on where it was converted (workers, scheduler, threads).
    executor = ("progress", "workers", "scheduler", "threads")
    # Options added after run folders existed count only when set, so that those folders' stages stay done.
    later = {"mask_dtype": "bit", "depth_dtype": "float32"}
    kept = {k: v for k, v in options.items() if k not in executor and not (k in later and later[k] == v)}
    inputs = {"source": source_fp, "options": kept}
    command = _raykit("convert", config.src, config.dst, *config_flags(config, skip=("progress",)))
    return Stage("convert", inputs, run, command, (out / "store",))


def _bytes(path: Path) -> int:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files)


def validate_stage(url: str, store_fp: str) -> Stage:
    """``raykit validate``: every checksum and invariant of the store."""
    from raykit.store import validate_store

    def run(attempt: Attempt) -> dict[str, Any]:
        problems = validate_store(url)
        if problems:
            raise StoreCorruptError(f"{url}: failed validation: " + "; ".join(problems[:5]))
        return {"valid": True, "output": store_fp}

    return Stage("validate", {"store": store_fp}, run, _raykit("validate", url))


def profile_stage(cfg: StageConfigs, url: str, store_fp: str) -> Stage:
    """``raykit bench``: the loader's rays/s end to end and by stage, at training's batch size."""
    from raykit.profiling import run_bench
    from raykit.store import open_store

    settings = {
        "batch_size": cfg.train.batch_size,
        "workers": cfg.train.num_workers,
        "batches": cfg.run.bench_batches,
        "seed": cfg.run.seed,
    }

    def run(attempt: Attempt) -> dict[str, Any]:
        report = run_bench(open_store(url), "train", **settings)
        keep = ("warm", "cold", "stages", "shuffle_quality", "layout", "settings", "n_rays")
        return {**{k: report.get(k) for k in keep}, "output": store_fp}

    flags = [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]
    return Stage("profile", {"store": store_fp, **settings}, run, _raykit("bench", url, *flags))


def train_config(cfg: StageConfigs, url: str, out: Path, sampler: str) -> TrainConfig:
    """The trainer's config of one sampler: the passed-through options, its share of the budget."""
    samplers = cfg.run.sampler_list()
    budget = None if cfg.run.steps is not None else cfg.run.minutes * 60.0 / len(samplers)
    config = cfg.train.replace(
        store=url,
        out=str(out / "runs" / sampler),
        sampler=sampler,
        steps=cfg.run.steps,  # None with the time budget: no step limit (resolve_steps)
        max_seconds=budget,
        resume=True,
        progress=False,
    )
    return with_progress_checks(config)


def with_progress_checks(config: TrainConfig) -> TrainConfig:
    """``config`` with PSNR-against-time checks for the report: with a time budget and no checks asked
    for, four quick checks of one image (full images cost minutes on a CPU early in training)."""
    if config.progress_every_s is not None or config.max_seconds is None:
        return config
    images = 1 if config.progress_images == TrainConfig.progress_images else config.progress_images
    return config.replace(progress_every_s=config.max_seconds / 4, progress_images=images)


def train_argv(config: TrainConfig, nproc_per_node: int | None = None, max_restarts: int = 3) -> list[str]:
    """``python -m raykit.trainer STORE --out RUN ...``, through torchrun with ``nproc_per_node``."""
    flags = [
        config.store,
        f"--out={config.out}",
        f"--sampler={config.sampler}",
        *config_flags(config, skip=("store", "out", "sampler")),
    ]
    if nproc_per_node is None:
        return [sys.executable, "-m", "raykit.trainer", *flags]
    launcher = [
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc_per_node}",
        f"--max-restarts={max_restarts}",
    ]
    return [sys.executable, *launcher, "-m", "raykit.trainer", *flags]


def train_stage(cfg: StageConfigs, url: str, store_fp: str, out: Path, sampler: str) -> Stage:
    """Train one sampler of ``raykit run`` (see :func:`training_stage`)."""
    config = train_config(cfg, url, out, sampler)
    return training_stage(
        config, store_fp, f"train-{sampler}", nproc_per_node=cfg.run.nproc_per_node,
        max_restarts=cfg.run.max_restarts,
    )  # fmt: skip


def training_stage(
    config: TrainConfig,
    store_fp: str,
    name: str,
    *,
    nproc_per_node: int | None = None,
    max_restarts: int = 3,
    starter: WarmStarter | None = None,
) -> Stage:
    """Train ``config`` in a child process (killed or not, ``--resume`` continues it exactly); the
    result is :func:`train_summary`'s. ``raykit run`` and ``raykit sweep`` train through it.
    ``starter``: fork the child from a warm server (without torchrun) instead of a fresh interpreter."""
    argv = train_argv(config, nproc_per_node, max_restarts)
    run_dir = Path(config.out)

    def run(attempt: Attempt) -> dict[str, Any]:
        if starter is not None and nproc_per_node is None:
            starter.run("raykit.trainer", argv[3:], attempt)
        else:
            run_process(argv, attempt)
        summary = train_summary(run_dir)
        device = (_record(run_dir / "run.json").get("environment") or {}).get("device", "")
        if str(device).startswith("cuda"):  # the trainer's peak is CUDA's allocation there
            attempt.meter.child["peak_gpu_mb"] = summary["memory_mb"]
        return summary

    inputs = {"store": store_fp, "config": config.to_dict(), "nproc_per_node": nproc_per_node}
    return Stage(name, inputs, run, argv, (run_dir,))


def _record(path: Path) -> dict[str, Any]:
    """A JSON record of a run folder, bounded (``fileio.read_json``); one line naming it otherwise."""
    try:
        record = read_json(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return record


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a run's JSON-lines log, read bounded (``fileio``: a regular file of at most
    ``JSONL_LIMIT`` bytes); a line that is not one (torn by a kill) is skipped."""
    if not path.exists():
        return []
    records = []
    for line in read_bounded(path, limit=JSONL_LIMIT).decode(errors="replace").splitlines():
        try:
            record = loads_json(line, str(path))
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def train_summary(run_dir: Path) -> dict[str, Any]:
    """What the report needs of a finished run (its eval.json, log.jsonl and progress.jsonl)."""
    evaluation = _record(run_dir / "eval.json")
    log, progress = read_jsonl(run_dir / "log.jsonl"), read_jsonl(run_dir / "progress.jsonl")
    test = evaluation["splits"].get("test") or next(iter(evaluation["splits"].values()))

    def mean(key: str) -> float | None:
        values = [r[key] for r in log if r.get(key) is not None]
        return float(np.mean(values)) if values else None

    return {
        "run_dir": str(run_dir),
        "step": evaluation.get("step"),
        "protocol": protocol_of(evaluation),
        "psnr": test["psnr"],
        "ssim": test["ssim"],
        "lpips": test.get("lpips"),
        # the float figures: an extra column; a run from before the protocol has only those
        "psnr_float": test.get(
            "psnr_float", test["psnr"] if protocol_of(evaluation) == OLD_PROTOCOL else None
        ),
        "ssim_float": test.get(
            "ssim_float", test["ssim"] if protocol_of(evaluation) == OLD_PROTOCOL else None
        ),
        "samples_per_ray": mean("samples_per_ray"),
        "rays_per_s": mean("rays_per_s"),
        "loader_wait_fraction": mean("loader_wait_fraction"),
        "memory_mb": max((r.get("peak_memory_mb") or 0.0 for r in log), default=None),
        "elapsed_s": log[-1].get("elapsed_s") if log else None,
        "n_images": test.get("n_images"),
        "progress": [{k: p.get(k) for k in ("step", "elapsed_s", "psnr", "n_images")} for p in progress],
        "renders": sorted(str(p) for p in (run_dir / "renders" / "test").glob("*.png")),
        **_timed(run_dir, test["images"]),
        "output": sha256_file(run_dir / "eval.json"),
    }


def _timed(run_dir: Path, images: list[dict[str, Any]]) -> dict[str, Any]:
    """A run on a store with times: its test frames (name, camera, time, PSNR, render file; the report's
    PSNR against scene time and its video), field and ray sampling (``run.json``). Else nothing."""
    frames = [
        {k: image.get(k) for k in ("name", "camera", "time", "psnr", "file")}
        for image in images
        if image.get("time") is not None
    ]
    if not frames:
        return {}
    record = _record(run_dir / "run.json")
    field = (record.get("field") or {}).get("kind")
    return {"frames": frames, "field": field, "ray_sampling": record.get("ray_sampling") or {}}


def evaluate_stage(runs: dict[str, dict[str, Any]]) -> Stage:
    """The test split's figures of every sampler (the trainer evaluates at the end of its run)."""

    def run(attempt: Attempt) -> dict[str, Any]:
        table = {}
        for sampler, r in runs.items():
            evaluation = _record(Path(r["run_dir"]) / "eval.json")
            table[sampler] = {
                split: {k: v for k, v in f.items() if k != "images"}
                for split, f in evaluation["splits"].items()
            }
        best = max(runs, key=lambda s: runs[s]["psnr"])
        return {"splits": table, "best": best, "output": best}

    inputs = {s: r["output"] for s, r in runs.items()}
    first = next(iter(runs.values()))["run_dir"]
    return Stage("evaluate", inputs, run, _raykit("render", first, "--split=test"))


def export_stage(run: dict[str, Any], out: Path, sampler: str) -> Stage:
    """``raykit export RUN OUT --verify``: the model alone, re-rendered against the run's evaluation."""
    from raykit.trainer import export_run, verify_export

    dst = out / "export" / sampler

    def run_export(attempt: Attempt) -> dict[str, Any]:
        export_run(run["run_dir"], dst, force=True)
        verified = verify_export(dst, split="test")
        size = _bytes(dst)
        return {
            "path": str(dst),
            "bytes": size,
            "verify": verified,
            "output": sha256_file(dst / "export.json"),
        }

    command = _raykit("export", run["run_dir"], str(dst), "--verify", "--force")
    return Stage(f"export-{sampler}", {"run": run["output"]}, run_export, command, (dst,))
