"""One rank of the gsplat adapter's torchrun test (``torchrun --nproc-per-node 2 gsplat_rank.py STORE OUT``):
gsplat's ``world_size`` / ``world_rank`` from the process group, two epochs of the ``Dataset`` and of its
``loader()``, written to ``OUT/rank<R>.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from raykit.integrations.gsplat import Dataset, Parser


def main(store: str, out: str) -> None:
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        parser = Parser(store, factor=2)
        dataset = Dataset(parser, "train", seed=5, world_size=world, rank=rank)
        ids, rows = [], []
        for epoch in range(2):
            dataset.set_epoch(epoch)
            ids.append([int(dataset[i]["image_id"]) for i in range(len(dataset))])
        with dataset.loader() as loader:
            for _ in range(2):
                rows.append([int(r) for batch in loader for r in batch.image])
        result = {"rank": rank, "world": world, "ids": ids, "rows": rows,
                  "split_rows": [int(r) for r in parser.split_indices("train")]}  # fmt: skip
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
