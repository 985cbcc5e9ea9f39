"""One rank of the gloo test of the loss sampling stage (``python dist_loss_rank.py RANK WORLD URL OUT``)."""

from __future__ import annotations

import sys

import numpy as np
import torch.distributed as dist

from raykit.loaders import RayLoader
from raykit.store import open_store


def main(rank: int, world: int, url: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        loader = RayLoader(open_store(url), "train", 32, seed=5, num_workers=0, group_rays=32,
                           sampling={"kind": "loss", "interval": 4}, make_batch=lambda raw: raw)  # fmt: skip
        pids = []
        for i, batch in enumerate(loader.forever()):
            # each rank's loss differs: only a map averaged across ranks is the same on both
            loader.observe(batch, (batch.pid % 7).astype(np.float32) + rank)
            pids.append(batch.pid)
            if i == 40:
                break
        assert loader.sampler is not None
        errors = loader.sampler.errors
        latest = errors.snapshots[max(errors.snapshots)]
        np.savez(f"{out}/loss{rank}.npz", pids=np.concatenate(pids), est=latest.est,
                 rebuilds=np.array([errors.rebuilds]))  # fmt: skip
        loader.close()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
