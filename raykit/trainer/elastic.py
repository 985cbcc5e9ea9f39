"""Restarts on failure with torchrun's elastic agent: every rank's generator state in each checkpoint.

Launch training under torchrun with ``--max-restarts N`` and pass ``--resume``::

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m raykit.trainer STORE --out RUN --resume

``--resume`` without a checkpoint starts a fresh run. When a rank dies (an exception, a signal, the
kernel's OOM killer), torchrun stops the other ranks and starts the whole group again with the same
arguments, at most N times; every rank then resumes from the newest complete checkpoint, so at most
``--ckpt-every`` steps are recomputed and the result equals an uninterrupted run's.

Exactness needs each rank's own random state: the sample jitter is seeded per rank, so rank 0 (which
writes the checkpoint) gathers every rank's generator states, stored as ``NAME@rankR`` beside rank 0's
``NAME`` in the checkpoint's ``rng_states``; each rank restores its own (a checkpoint of a run with
fewer ranks falls back to rank 0's state).

Tested on one node (``--standalone``, gloo, 2 ranks, a rank SIGKILLed mid-run). On several nodes the
group's keys follow ``TORCHELASTIC_RESTART_COUNT``, which each node's agent counts for itself; torch
restarts the healthy nodes' workers without counting, so there the counts (and keys) can differ
between nodes and the restarted group would not form: multi-node restarts are not supported yet.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

__all__ = ["Ranks", "gather_rank_states", "init_process_group", "rank_state"]


class Ranks(Protocol):
    """This process's place among the training processes (``raykit.trainer.runtime.Processes`` is one;
    a protocol, so this module imports nothing of the trainer's and runtime can import it)."""

    @property
    def distributed(self) -> bool: ...

    @property
    def world_size(self) -> int: ...


def init_process_group(backend: str, timeout: timedelta = default_pg_timeout) -> None:
    """Join the process group from torchrun's environment, with keys of their own on every restart.

    torchrun's agent shares its rendezvous store with the workers (``TORCHELASTIC_USE_AGENT_STORE``)
    and keeps it across restarts, so a restarted group that joined with ``env://`` would read the
    addresses its predecessors published there and connect to dead ports (gloo: "connection refused",
    or a hang). Here the group's keys live under ``raykit/attempt-N``, ``N`` being torchrun's
    ``TORCHELASTIC_RESTART_COUNT``. Outside torchrun's elastic agent this is ``init_process_group``.
    """
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None:
        dist.init_process_group(backend, timeout=timeout)
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=rank == 0 and not agent_store,
        timeout=timeout,
    )
    prefixed = dist.PrefixStore(f"raykit/attempt-{restart}", store)
    dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world_size, timeout=timeout)


def gather_rank_states(procs: Ranks, states: Mapping[str, str]) -> dict[str, str]:
    """Every other rank's ``states`` as ``{"NAME@rankR": text}`` (collective: call on every rank).

    Returns an empty dict in a single process.
    """
    if not procs.distributed:
        return {}
    gathered: list[dict[str, str] | None] = [None] * procs.world_size
    dist.all_gather_object(gathered, dict(states))
    return {
        f"{name}@rank{rank}": text
        for rank, entry in enumerate(gathered)
        if rank > 0 and entry is not None
        for name, text in entry.items()
    }


def rank_state(rng_states: Mapping[str, str], name: str, rank: int) -> str:
    """This rank's saved state of generator ``name`` (rank 0's when the checkpoint has none for it)."""
    return rng_states.get(f"{name}@rank{rank}", rng_states[name])
