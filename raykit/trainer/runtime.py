"""Small pieces of a run around the loop: device, processes, scene box, schedule, logs, run record."""

from __future__ import annotations

import json
import os
import platform
import resource
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import raykit
from raykit.errors import ConfigError
from raykit.fileio import loads_json
from raykit.metrics import parse_colour
from raykit.store import RayStore
from raykit.trainer.config import TrainConfig, parse_aabb
from raykit.trainer.defaults import step_limit

__all__ = [
    "JsonlLog",
    "Processes",
    "check_splits",
    "end_processes",
    "environment",
    "learning_rate",
    "parse_background",
    "peak_memory_mb",
    "resolve_background",
    "resolve_device",
    "scene_aabb",
    "start_processes",
]


@dataclass(frozen=True)
class Processes:
    """This process's place among the training processes (torchrun sets the environment)."""

    rank: int
    world_size: int
    local_rank: int
    owns_group: bool = False  # this run joined the process group, so it leaves it (end_processes)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def start_processes(device: torch.device) -> Processes:
    """Join the process group when launched by torchrun (gloo on CPU, nccl on CUDA); else a single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Processes(0, 1, 0)
    if not dist.is_initialized():
        from raykit.trainer.elastic import init_process_group

        init_process_group("nccl" if device.type == "cuda" else "gloo")
        owns = True
    else:
        owns = False
    return Processes(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), owns)


def end_processes(procs: Processes) -> None:
    """Leave the process group this run joined (a group the caller made is the caller's to end).

    Without it gloo's threads outlive the interpreter's teardown and a rank may abort at exit
    (``terminate called without an active exception``, SIGABRT), whatever the run's outcome.
    """
    if procs.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda (this process's LOCAL_RANK device) when available, else cpu."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device: expected cpu (CUDA is not available), got {name!r}")
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    return device


def resolve_background(config: TrainConfig, store: RayStore) -> tuple[TrainConfig, str]:
    """``config`` with ``background`` resolved (``auto`` -> white or black, from the store), and why.

    Images with alpha (an object on a transparent background) composite over white, as before.
    Opaque photos (no alpha anywhere) never show the background, but its colour still decides what
    empty space costs: over white every ray must turn opaque, and a dark capture fills with fog and
    floaters that fail from new views (plant_capture: 6.4 dB test PSNR over white, 16.9 over black
    at equal steps, BENCHMARKS.md issue 30); over black, dark space may stay empty.
    """
    if config.background != "auto":
        return config, "chosen with --background"
    if bool(np.asarray(store.table.has_alpha).any()):
        return config.replace(background="white"), "--background auto: images with alpha composite over white"
    return config.replace(background="black"), "--background auto: opaque photos (no alpha): black"


def parse_background(text: str) -> torch.Tensor:
    """``white``, ``black`` or ``R,G,B`` in [0, 1] -> (3,) float32 (``auto`` unresolved: white)."""
    return torch.tensor(parse_colour("white" if text == "auto" else text), dtype=torch.float32)


def check_splits(config: TrainConfig, store: RayStore) -> None:
    """Raise ConfigError naming every split of ``--train-split`` and ``--eval-splits`` the store lacks."""
    wanted = {"--train-split": [config.train_split], "--eval-splits": config.eval_splits.split(",")}
    problems = [
        f"{flag}: {store.url} has no split {split!r} (it has {', '.join(store.splits)})"
        for flag, splits in wanted.items()
        for split in splits
        if split.strip() and split.strip() not in store.splits
    ]
    if problems:
        raise ConfigError("; ".join(problems))


def scene_aabb(config: TrainConfig, store: RayStore) -> torch.Tensor:
    """(6,) scene box: ``--aabb``, else the store's scene bounds, else the box around the cameras."""
    if config.aabb != "auto":
        return torch.tensor(parse_aabb(config.aabb), dtype=torch.float32)
    bounds = store.scene.bounds
    if bounds is not None:
        return torch.tensor([*bounds[0], *bounds[1]], dtype=torch.float32)
    centres = np.asarray(store.table.c2w)[:, :3, 3]
    lo, hi = centres.min(axis=0), centres.max(axis=0)
    pad = 0.05 * float(np.max(hi - lo)) + 1e-3
    return torch.tensor([*(lo - pad), *(hi + pad)], dtype=torch.float32)


def learning_rate(config: TrainConfig, step: int, elapsed: float) -> float:
    """Exponential decay from ``lr`` to ``lr_final``.

    Progress is ``step / steps``, or, with a time budget, the larger of that and
    ``elapsed / max_seconds`` (so a budgeted run still anneals; then the schedule depends on speed).
    """
    progress = step / step_limit(config)
    if config.max_seconds is not None:
        progress = max(progress, elapsed / config.max_seconds)
    progress = min(progress, 1.0)
    return config.lr * (config.lr_final / config.lr) ** progress


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: CUDA allocator peak on CUDA, else this process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # VmHWM is this address space's own high-water mark; ru_maxrss can carry the peak of the
    # process that exec'd this one (Linux), e.g. a benchmark driver.
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def environment(device: torch.device, processes: Processes) -> dict[str, Any]:
    """What a reader needs to reproduce the run's software and hardware."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "raykit": raykit.__version__,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "world_size": processes.world_size,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


class JsonlLog:
    """Append-only JSON-lines log that can be cut back to a step when a run resumes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step`` (written by a run that crashed after its checkpoint)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(errors="replace").splitlines():
            record = _record(line)
            step_of = record.get("step", 0) if record is not None else None
            if isinstance(step_of, int) and step_of <= step:  # a torn or foreign line is dropped
                kept.append(line)
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        records = (_record(line) for line in self.path.read_text(errors="replace").splitlines())
        return [record for record in records if record is not None]


def _record(line: str) -> dict[str, Any] | None:
    """A log line's record, or None for a line that is not one (torn by a kill mid-write, edited)."""
    try:
        record = loads_json(line, "log line")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
