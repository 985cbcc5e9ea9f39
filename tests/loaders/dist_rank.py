"""One rank of the gloo test (run as a script: ``python dist_rank.py RANK WORLD URL OUT``)."""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist

from raykit.loaders import RayLoader
from raykit.store import open_store


def main(rank: int, world: int, url: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        for drop_last in (False, True):
            one_epoch(rank, world, url, out, drop_last)
    finally:
        dist.destroy_process_group()


def one_epoch(rank: int, world: int, url: str, out: str, drop_last: bool) -> None:
    loader = RayLoader(
        open_store(url), "train", batch_size=96, seed=11, drop_last=drop_last, make_batch=lambda raw: raw
    )
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([len(loader)]))
    pids, sizes = [], []
    for batch in loader:  # one epoch, every rank in lockstep
        dist.barrier()
        pids.append(batch.pid)
        sizes.append(len(batch))
    np.savez(
        f"{out}/rank{rank}_{int(drop_last)}.npz",
        pids=np.concatenate(pids),
        sizes=np.array(sizes),
        counts=torch.cat(gathered).numpy(),
        world=np.array([loader.plan.world_size]),
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
