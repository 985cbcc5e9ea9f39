"""Checks of :class:`~raykit.loaders.RayLoader` arguments and of saved loader states.

Each error names the argument (or state key), the value and what is expected, before anything is
started or any position is changed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from raykit.errors import ConfigError, ResumeError
from raykit.ranges import Range, device_problem, range_problems

if TYPE_CHECKING:
    from raykit.loaders.source import ChunkSource
    from raykit.store import RayStore

__all__ = ["check_loader_args", "check_state", "open_if_location", "resume_position"]


def check_loader_args(device: Any = None, **values: Any) -> None:
    """Each keyword ``name=(value, Range)`` in its range (:mod:`raykit.ranges`); ``device`` (when
    given) one this machine has.

    Raises:
        ConfigError: listing every bad argument, ``loader: name: expected ..., got ...``.
    """
    problems = range_problems(values)
    if device is not None and (problem := device_problem(device)):
        problems.append(problem)
    if problems:
        raise ConfigError("loader: " + "; ".join(problems))


def open_if_location(store: RayStore | ChunkSource | str | os.PathLike[str]) -> RayStore | ChunkSource:
    """``store`` itself, or the store opened from a path or URL (``str`` or path-like).

    Raises:
        ConfigError: ``store`` is none of these.
    """
    if isinstance(store, str | os.PathLike):
        from raykit.store import open_store

        return open_store(os.fspath(store))
    if not hasattr(store, "n_rays") and not hasattr(store, "splits"):
        raise ConfigError(
            f"loader: store: expected a RayStore, a chunk source, or a store path or URL, got "
            f"{type(store).__name__}"
        )
    return store


_STATE_LOWS = (("epoch", 0), ("batch", 0), ("n_batches", 1), ("world_size", 1), ("batch_size", 1))
_STATE_INTS = {name: Range(low, integer=True) for name, low in _STATE_LOWS}


def check_state(state: Any) -> Mapping[str, Any]:
    """A loader state dict whose position and partition keys have the right types and ranges.

    Raises:
        ResumeError: not a mapping, or ``epoch``/``batch`` missing or negative, or ``n_batches``,
            ``world_size``, ``batch_size`` present but not positive integers, or ``drop_last`` not
            a bool; every bad key named.
    """
    if not isinstance(state, Mapping):
        raise ResumeError(f"loader state: expected a dict from state_dict(), got {type(state).__name__}")
    problems = [f"{key}: missing" for key in ("epoch", "batch") if key not in state]
    problems += range_problems(
        {key: (state[key], expected) for key, expected in _STATE_INTS.items() if key in state}
    )
    if "drop_last" in state and not isinstance(state["drop_last"], bool):
        problems.append(f"drop_last: expected true or false, got {state['drop_last']!r}")
    if problems:
        raise ResumeError("loader state: " + "; ".join(problems))
    return state


def resume_position(
    state: Mapping[str, Any],
    mine: Mapping[str, Any],
    exact_keys: tuple[str, ...],
    partition_keys: tuple[str, ...],
    what: str = "loader state",
) -> tuple[int, int]:
    """The ``(epoch, batch)`` a loader whose own state is ``mine`` resumes at from ``state``.

    Every key of ``exact_keys`` must be equal (else ``ResumeError`` naming it); a state saved after an
    epoch's last batch resumes at the next epoch; a mid-epoch state of which a key of ``partition_keys``
    changed skips the rest of that epoch, with a warning (``docs/loading.md``, "Resuming").
    """
    import warnings

    for key in exact_keys:
        if state.get(key) != mine[key]:
            raise ResumeError(f"{what}: expected {key} {mine[key]!r} (this loader), got {state.get(key)!r}")
    epoch, batch = int(state["epoch"]), int(state["batch"])
    if batch >= int(state.get("n_batches", batch + 1)):  # saved after an epoch's last batch
        epoch, batch = epoch + 1, 0
    changed = [key for key in partition_keys if state.get(key) != mine[key]]
    if changed and batch > 0:
        warnings.warn(
            f"{what} saved mid-epoch {epoch} with different {', '.join(changed)}; "
            f"skipping the rest of that epoch and starting epoch {epoch + 1}",
            stacklevel=3,
        )
        epoch, batch = epoch + 1, 0
    return epoch, batch
