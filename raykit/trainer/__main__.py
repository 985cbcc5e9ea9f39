"""``python -m raykit.trainer STORE --out RUN_DIR ...``: the ``raykit train`` flags, for torchrun.

Example: ``torchrun --nproc-per-node 2 -m raykit.trainer STORE --out RUN --device cpu`` trains with
DDP over gloo; each rank reads its share of every epoch (the loader's rank sharding). Add
``--max-restarts N`` (torchrun) and ``--resume`` (raykit) to restart after a failure and resume exactly
(see ``raykit.trainer.elastic``).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from raykit.errors import RaykitError
from raykit.trainer.cli import build_train_parser, train_in_folder
from raykit.trainer.config import from_args


def _terminate(signum: int, frame: FrameType | None) -> None:
    """torchrun's SIGTERM (another rank failed, or the job is stopped) unwinds like an error: the
    loader and the process group end in order (``train``'s ``finally``), with status 128 + signal."""
    raise SystemExit(128 + signum)


def main() -> int:
    args = build_train_parser("python -m raykit.trainer").parse_args()
    signal.signal(signal.SIGTERM, _terminate)
    try:
        train_in_folder(from_args(args))
    except RaykitError as exc:
        print(f"raykit: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
