"""``OUT/pipeline.json``: one record per stage, fingerprints of inputs, and what each attempt cost.

A stage's record: ``status`` (``running``, ``done``, ``failed``, ``interrupted``), ``fingerprint``
(sha256 of its ``inputs``: options and upstream outputs' fingerprints), ``inputs``, ``command`` (the
exact command that reproduces it), ``result`` (what downstream stages and the report read), the
totals of its last attempt (``wall_s``, ``cpu_s``, ``peak_rss_mb``, ``peak_gpu_mb``), and
``attempts`` (each one's start time, exit status, error and log file), with ``raykit_version`` and
``environment``.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import raykit
from raykit.errors import ConfigError
from raykit.fileio import atomic_write_bytes, json_bytes, read_json, sha256_bytes

__all__ = ["PIPELINE_FILE", "Meter", "Records", "environment", "fingerprint", "tree_fingerprint"]

PIPELINE_FILE = "pipeline.json"
FORMAT = "raykit-pipeline"
VERSION = 1


def fingerprint(obj: Any) -> str:
    """sha256 of ``obj``'s canonical JSON (sorted keys)."""
    return sha256_bytes(json_bytes(obj))


def tree_fingerprint(path: Path) -> str:
    """sha256 of every file's relative path, size and modification time under ``path`` (or of the file).

    Cheap (no file is read): 120 photos take milliseconds. A file rewritten with the same size within
    the file system's timestamp resolution goes unnoticed, as with make.
    """
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    listing = []
    for p in files:
        stat = p.stat()
        listing.append(
            [p.relative_to(path).as_posix() if p != path else p.name, stat.st_size, stat.st_mtime_ns]
        )
    return fingerprint(listing)


def environment() -> dict[str, Any]:
    """Where the stage ran."""
    import torch

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "cpus": os.cpu_count(),
        "executable": sys.executable,
    }


class Records:
    """The stages' records in ``OUT/pipeline.json``, rewritten atomically after every change."""

    def __init__(self, out: Path) -> None:
        self.path = out / PIPELINE_FILE
        self.data: dict[str, Any] = {"format": FORMAT, "version": VERSION, "stages": {}}
        if self.path.is_file():
            try:
                data = read_json(self.path)
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    f"{self.path}: unreadable pipeline record ({exc}); remove it to start over"
                ) from None
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                got = data.get("format") if isinstance(data, dict) else type(data).__name__
                raise ConfigError(f"{self.path}: expected format {FORMAT!r}, got {got!r}")
            if not isinstance(data.get("stages"), dict) or not all(
                isinstance(r, dict) for r in data["stages"].values()
            ):
                raise ConfigError(f"{self.path}: expected 'stages' to be an object of stage records")
            self.data = data

    @property
    def stages(self) -> dict[str, dict[str, Any]]:
        stages: dict[str, dict[str, Any]] = self.data["stages"]
        return stages

    def get(self, name: str) -> dict[str, Any] | None:
        return self.stages.get(name)

    def put(self, name: str, record: Mapping[str, Any]) -> None:
        self.stages[name] = dict(record)
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # In run order, keys as written (not sorted): a record read back equals the one kept in memory.
        text = json.dumps(self.data, indent=2, allow_nan=False) + "\n"
        atomic_write_bytes(self.path, text.encode(), sync=False)


def _rss_mb(pid: int | str = "self") -> float:
    """Resident set size of a process in MB (0 where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class Meter:
    """Wall time, CPU time (this process and its children) and peak RSS of one attempt.

    Peak RSS is sampled every 50 ms (this process; a child's comes from ``wait4``, see ``child``);
    peak GPU memory is torch's peak allocation when CUDA is in use.
    """

    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0
    peak_gpu_mb: float | None = None
    child: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def measure(self) -> Iterator[Meter]:
        stop = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(stop,), daemon=True)
        gpu = _reset_gpu_peak()
        start_wall, start_cpu = time.perf_counter(), _cpu_seconds()
        sampler.start()
        try:
            yield self
        finally:
            stop.set()
            sampler.join()
            self.wall_s = time.perf_counter() - start_wall
            self.cpu_s = _cpu_seconds() - start_cpu
            self.peak_rss_mb = max(self.peak_rss_mb, self.child.get("peak_rss_mb", 0.0))
            if gpu:
                self.peak_gpu_mb = _gpu_peak_mb()
            if self.child.get("peak_gpu_mb") is not None:
                self.peak_gpu_mb = max(self.peak_gpu_mb or 0.0, self.child["peak_gpu_mb"])

    def _sample(self, stop: threading.Event) -> None:
        while True:
            self.peak_rss_mb = max(self.peak_rss_mb, _rss_mb())
            if stop.wait(0.05):
                return

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "peak_rss_mb": self.peak_rss_mb,
            "peak_gpu_mb": self.peak_gpu_mb,
        }


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _reset_gpu_peak() -> bool:
    if "torch" not in sys.modules:
        return False
    import torch

    if not torch.cuda.is_available():
        return False
    torch.cuda.reset_peak_memory_stats()
    return True


def _gpu_peak_mb() -> float:
    import torch

    return float(torch.cuda.max_memory_allocated()) / 1e6


def stage_record(name: str, fp: str, inputs: Mapping[str, Any], command: list[str]) -> dict[str, Any]:
    """A fresh record of stage ``name`` (no attempt yet)."""
    return {
        "stage": name,
        "status": "pending",
        "fingerprint": fp,
        "inputs": dict(inputs),
        "command": command,
        "result": None,
        "attempts": [],
        "raykit_version": raykit.__version__,
        "environment": environment(),
    }
