"""nerfstudio's ray datamanager (``RaykitDataManager.next_train``) rays/s on ``tests/data/lego_tiny``:
run once per checkout with that checkout first on ``PYTHONPATH`` and compare (A/B, alternating order).

    PYTHONPATH=../base python benchmarks/ab_ns_datamanager.py --store benchmarks/data/ns_lego.zarr
    PYTHONPATH=. python benchmarks/ab_ns_datamanager.py --store benchmarks/data/ns_lego.zarr

Prints ``{"rays_per_s": ...}`` (2 torch threads, batch 2048, 1000 batches after 50 warm ones).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="where lego_tiny's store is (made once)")
    parser.add_argument("--batches", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(2)
    from raykit.converters import convert
    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
    from raykit.integrations.nerfstudio.ray_datamanager import RaykitDataManagerConfig

    store = Path(args.store)
    if not (store / "manifest.json").exists():
        convert(ROOT / "tests" / "data" / "lego_tiny", store)
    manager = RaykitDataManagerConfig(
        dataparser=RaykitDataParserConfig(data=store), train_num_rays_per_batch=2048,
        eval_num_rays_per_batch=500,
    ).setup(device="cpu")  # fmt: skip
    for step in range(50):
        manager.next_train(step)
    start = time.perf_counter()
    for step in range(args.batches):
        manager.next_train(step)
    print(json.dumps({"rays_per_s": args.batches * 2048 / (time.perf_counter() - start)}))


if __name__ == "__main__":
    main()
