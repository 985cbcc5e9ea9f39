"""``--logger tensorboard``: the training log as TensorBoard event files, with a test view every few minutes.

``RUN_DIR/tensorboard/events.out.tfevents.*`` (rank 0 only), for ``tensorboard --logdir RUN_DIR``:

- scalars ``train/loss``, ``train/psnr``, ``train/lr``, ``train/rays_per_s``, ``train/samples_per_ray``,
  ``train/loader_wait_fraction``, ``train/peak_memory_mb`` and every other number of each log.jsonl
  record (``train/<key>``; the seconds per phase as ``time/<phase>``: ``data`` and ``compute``, or
  every phase of the step inside a ``raykit.recorder.recording()`` block), at the record's step;
- an image ``test/<name>``: the first test view, rendered (left) beside its target (right), at the
  first record, then at the first record after each ``log_image_every_s`` seconds of wall time, and at
  the end of training.

``log.jsonl`` stays the record of truth; these files mirror it. A resumed run opens its writer with
``purge_step`` = the checkpoint's step + 1, so TensorBoard drops the events that the interrupted run
wrote after its last checkpoint (as ``log.jsonl`` is cut back); a fresh run opens it with
``purge_step`` 0, hiding whatever an earlier attempt left there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from raykit.errors import ConfigError
from raykit.store import RayStore
from raykit.trainer.config import TrainConfig

__all__ = ["INSTALL_HINT", "TensorBoardLog", "first_test_view", "open_tensorboard", "require_tensorboard"]

INSTALL_HINT = "pip install tensorboard (or: pip install 'raykit[tensorboard]')"

TestView = Callable[[], tuple[str, torch.Tensor, torch.Tensor] | None]
"""() -> (image name, prediction (H, W, 3), target (H, W, 3)) in [0, 1], or None without test views."""


def require_tensorboard() -> Any:
    """torch's ``SummaryWriter`` class."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ConfigError(
            f"logger tensorboard: the tensorboard package is not installed; {INSTALL_HINT}"
        ) from exc
    return SummaryWriter


class TensorBoardLog:
    """Writes log records and test views to ``log_dir`` (see the module docstring)."""

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        test_view: TestView | None = None,
        image_every_s: float = 180.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._writer_class = require_tensorboard()
        self.log_dir = Path(log_dir)
        self.test_view = test_view
        self.image_every_s = image_every_s
        self._clock = clock
        self._writer: Any = None
        self._purge_step = 0  # a fresh run hides any events an earlier attempt left in log_dir
        self._last_image: float | None = None
        self._image_step: int | None = None

    def truncate_after(self, step: int) -> None:
        """Hide events after ``step`` (a resumed run continues from that checkpoint)."""
        self.close()
        self._purge_step = step + 1

    def _open(self) -> Any:
        if self._writer is None:
            self._writer = self._writer_class(str(self.log_dir), purge_step=self._purge_step)
        return self._writer

    def write(self, record: dict[str, Any]) -> None:
        """One log.jsonl record as scalars at ``record["step"]``; a test view when one is due."""
        writer, step = self._open(), int(record["step"])
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                writer.add_scalar(f"train/{key}", value, step)
        for phase, seconds in (record.get("seconds") or {}).items():
            writer.add_scalar(f"time/{phase}", seconds, step)
        now = self._clock()
        if self._last_image is None or now - self._last_image >= self.image_every_s:
            self.add_test_view(step)
        writer.flush()

    def add_test_view(self, step: int) -> None:
        """Render the test view now and add it at ``step`` (no-op without a test view)."""
        view = self.test_view() if self.test_view is not None else None
        self._last_image, self._image_step = self._clock(), step
        if view is None:
            return
        name, pred, target = view
        image = torch.cat([pred, target], dim=1).clamp(0, 1)
        self._open().add_image(f"test/{name}", image.cpu().numpy(), step, dataformats="HWC")

    def finish(self, step: int) -> None:
        """The end of training: a test view at ``step`` (unless there is one already), then close."""
        if self._image_step != step:
            self.add_test_view(step)
        self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def first_test_view(
    config: TrainConfig, store: RayStore, field: Any, grid: Any, device: torch.device
) -> tuple[str, torch.Tensor, torch.Tensor] | None:
    """The first image of the first eval split: ``(name, prediction, target)``, or None if there is none."""
    from raykit.trainer.evaluate import render_view

    split = config.eval_splits.split(",")[0]
    names = store.images(split) if split in store.splits else []
    if not names:
        return None
    pred, target, _ = render_view(config, store, names[0], field, grid, device)
    return names[0], pred, target


def open_tensorboard(
    logger: str, run_dir: str | os.PathLike[str], is_main: bool, test_view: TestView, image_every_s: float
) -> TensorBoardLog | None:
    """The TensorBoard log of a run when ``logger == "tensorboard"`` (rank 0), else None.

    Every rank checks that TensorBoard is installed, so a missing package fails all ranks alike.
    """
    if logger != "tensorboard":
        return None
    require_tensorboard()
    return TensorBoardLog(Path(run_dir) / "tensorboard", test_view, image_every_s) if is_main else None
