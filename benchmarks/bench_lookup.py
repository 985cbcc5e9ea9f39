"""The field's plane lookup, forward and backward, with each plane's channels cut into parts or not.

``grid_sample``'s CPU kernel gives one image of its batch to each thread; a level's three planes are
three images. ``raykit.trainer.field.lookup_parts`` cuts each plane's channels so that the threads get
equal shares. This measures one level's lookup (forward + backward of a sum) at 1 part and at
``lookup_parts``'s choice, interleaved, for the default field's three levels and a proposal network's
planes:

    python benchmarks/bench_lookup.py --threads 2 --rounds 5

Results go to ``benchmarks/results/lookup_parts.json`` (``--out``): the median milliseconds of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from raykit.trainer.field import lookup_parts, plane_features, plane_grid

CASES = (  # (name, resolution, features, points): the default contracted field, 1,024 rays x 24 samples
    ("field 512^2 x 8", 512, 8, 24576),
    ("field 181^2 x 8", 181, 8, 24576),
    ("field 64^2 x 8", 64, 8, 24576),
    ("proposal 64^2 x 4", 64, 4, 65536),  # the first proposal level: 1,024 rays x 64 samples
)


def _time(planes: torch.Tensor, coords: torch.Tensor, parts: int, repeats: int) -> float:
    grid = plane_grid(coords, parts)
    start = time.perf_counter()
    for _ in range(repeats):
        planes.grad = None
        plane_features(planes, coords, grid, parts).sum().backward()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results/lookup_parts.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for name, resolution, features, points in CASES:
        planes = (torch.rand(3, features, resolution, resolution, generator=generator) + 0.5).requires_grad_()
        coords = torch.rand(points, 3, generator=generator) * 2 - 1
        parts = lookup_parts(features, torch.device("cpu"))
        times: dict[int, list[float]] = {1: [], parts: []}
        _time(planes, coords, 1, 2), _time(planes, coords, parts, 2)  # warm-up
        for _ in range(args.rounds):  # interleaved
            for p in times:
                times[p].append(_time(planes, coords, p, args.repeats))
        row = {
            "case": name,
            "parts": parts,
            "ms_one_part": statistics.median(times[1]),
            "ms_parts": statistics.median(times[parts]),
        }
        rows.append(row)
        print(f"{name}: 1 part {row['ms_one_part']:.2f} ms, {parts} parts {row['ms_parts']:.2f} ms")
    result = {"benchmark": "lookup_parts", "threads": args.threads, "rounds": args.rounds, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
