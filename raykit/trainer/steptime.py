"""Where a training step's time goes, and what a log record says of a window of steps.

``TrainState`` holds the loop's counters (a checkpoint carries them; a logging window is one too);
``StepClock`` times a step off the hot path (the device synchronised only when a record is logged, or
at every phase inside a :mod:`raykit.recorder` recording); ``account`` adds a step to the tallies and
``log_record`` turns a window into one log.jsonl record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

import raykit.recorder
from raykit.metrics import mse_to_psnr
from raykit.trainer.runtime import peak_memory_mb

__all__ = ["PHASES", "StepClock", "TrainState", "account", "log_record"]

PHASES = ("data", "sampling", "network", "rendering", "backward", "optimizer")
"""The phases a step is timed in inside a recording (``data`` and ``compute`` otherwise)."""


@dataclass
class TrainState:
    """Loop counters that a checkpoint carries besides weights (also used for one logging window)."""

    step: int = 0
    elapsed: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)  # per phase (see StepClock)
    rays: int = 0
    samples: int | torch.Tensor = 0  # summed on the device between records
    loss_sum: float | torch.Tensor = 0.0  # summed on the device between records
    memory_mb: float = 0.0  # the window's largest memory in use just after a forward pass


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class StepClock:
    """Where one step's time goes, measured off the hot path.

    Always: the loader wait (``data``, host time) and the rest of the step (``compute``); the device is
    synchronised only at the end of a step whose record is logged, so a logging window's seconds are
    the device's. With a :mod:`raykit.recorder` active: every phase of :data:`PHASES` instead, the device
    synchronised at each lap (as a profile needs), the seconds also added to the recorder (``"train"``).
    """

    def __init__(self, device: torch.device, recorder: raykit.recorder.Recorder | None) -> None:
        self.device, self.recorder = device, recorder
        self.laps: dict[str, float] = {}
        self.last = time.perf_counter()
        self.tail = self.last  # end of the last step, as the host saw it

    def start(self) -> None:
        self.laps, self.last = {}, time.perf_counter()

    def lap(self, phase: str) -> None:
        """Charge the time since the previous lap to ``phase`` (only ``data`` unless recording)."""
        if self.recorder is None and phase != "data":
            return
        now = time.perf_counter() if phase == "data" else _sync(self.device)
        self.laps[phase] = now - self.last
        self.last = now

    def finish(self, synchronise: bool) -> dict[str, float]:
        """The step's seconds per phase; ``synchronise``: wait for the device first (a logged step)."""
        now = _sync(self.device) if synchronise else time.perf_counter()
        seconds = self.laps
        if self.recorder is None:
            seconds["compute"] = now - self.last
        else:
            seconds["optimizer"] = seconds.get("optimizer", 0.0) + now - self.last
            for phase, value in seconds.items():
                self.recorder.add("train", phase, value)
        self.tail = now
        return seconds

    def settle(self) -> dict[str, float]:
        """Wait for the device: the seconds it still worked after the last step's end, charged to it."""
        now = _sync(self.device)
        extra, self.tail = now - self.tail, now
        return {"compute" if self.recorder is None else "optimizer": extra}


def account(
    state: TrainState,
    window: TrainState,
    seconds: dict[str, float],
    n_rays: int,
    n_samples: int | torch.Tensor,
) -> None:
    """Add one step's seconds per phase, rays and samples (a device tensor: no read-back) to both tallies."""
    for tally in (state, window):
        for phase, value in seconds.items():
            tally.seconds[phase] = tally.seconds.get(phase, 0.0) + value
        tally.elapsed += sum(seconds.values())
        tally.rays += n_rays
        tally.samples = tally.samples + n_samples


def log_record(state: TrainState, window: TrainState, device: torch.device) -> dict[str, Any]:
    """One log.jsonl record: figures of the steps since the previous record (the window)."""
    loss = float(window.loss_sum) / max(window.step, 1)
    samples = float(window.samples)
    return {
        "step": state.step,
        "loss": loss,
        "psnr": mse_to_psnr(loss),
        "rays_per_s": window.rays / max(window.elapsed, 1e-9),
        "samples_per_ray": samples / max(window.rays, 1),
        "loader_wait_fraction": window.seconds.get("data", 0.0) / max(window.elapsed, 1e-9),
        "step_time_s": window.elapsed,
        "rays_per_step": window.rays / max(window.step, 1),
        "samples_per_step": samples / max(window.step, 1),
        "step_memory_mb": window.memory_mb,
        "seconds": dict(window.seconds),
        "elapsed_s": state.elapsed,
        "peak_memory_mb": peak_memory_mb(device),
    }
