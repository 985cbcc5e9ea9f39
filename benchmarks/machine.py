"""What every benchmark records about its run: the command, relative to the repository, and the machine
as measured (not as remembered).

    from machine import command_line, describe   # benchmarks/ is on sys.path when a script runs
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

__all__ = ["command_line", "describe", "describe_text", "peak_rss", "portable", "rss"]


def portable(word: str) -> str:
    """``word`` of a command line without the machine's paths: the interpreter becomes ``python``, a
    path inside the repository (or another checkout of it) becomes relative to it, any other absolute
    path keeps its last part."""
    key, eq, value = word.partition("=") if word.startswith("--") else ("", "", word)
    if value.startswith("/"):
        path = Path(value)
        if path.name.startswith("python"):
            value = "python"
        elif path.is_relative_to(REPO):
            value = str(path.relative_to(REPO)) or "."
        elif "benchmarks" in path.parts:  # inside another checkout of this repository
            value = "/".join(path.parts[path.parts.index("benchmarks") :])
        else:
            value = f"…/{path.name}"
    return f"{key}{eq}{value}"


def command_line(argv: Sequence[str] | None = None) -> str:
    """The running command as someone would type it in the repository: ``python benchmarks/x.py ...``."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    if script.is_relative_to(REPO):
        argv[0] = str(script.relative_to(REPO))
    return " ".join(["python", *(portable(word) for word in argv)])


def describe(torch_threads: int | None = None) -> dict[str, Any]:
    """The machine as measured now: usable CPUs, memory, GPU (or None), software, 1-minute load."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (AttributeError, ValueError, OSError):
        memory = None
    gpu = None
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": None if memory is None else round(memory, 1),
        "gpu": gpu,
        "torch_threads": torch_threads,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_1m": os.getloadavg()[0],
    }


def describe_text(machine: dict[str, Any]) -> str:
    """One line for BENCHMARKS.md from a recorded ``describe()`` (older results lack some fields)."""
    parts = [f"{machine.get('cpus') or machine.get('cpu_count')} CPUs"]
    if machine.get("memory_gib"):
        parts.append(f"{machine['memory_gib']:.0f} GiB")
    parts.append(f"GPU {machine['gpu']}" if machine.get("gpu") else "no GPU")
    return ", ".join(parts)


def write_report(path: str | Path, report: dict[str, Any]) -> None:
    """Write a benchmark's JSON report (folders created) and say where."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


def rss() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """This process's peak resident bytes (``VmHWM``: the high-water mark of its own address space).

    ``getrusage``'s ``ru_maxrss`` is not used: on Linux a process started by ``exec`` inherits the
    high-water mark of the process that started it, so a case run in a subprocess would report the
    driver's peak (e.g. the conversion that built the store) whenever that was larger.
    (``raykit.trainer.runtime.peak_memory_mb`` reads the same figure.)
    """
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
