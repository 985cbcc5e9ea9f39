"""One decoded-image budget per machine: ``ImageLoader(cache="node")`` against per-rank caches under
``torchrun --nproc-per-node R`` (gloo, CPU).

A capture of ``--n`` 1080p JPEGs (``bench_decode.photo``, quality 90; larger than the budget) is
converted to an images-layout store under ``benchmarks/data/node-capture-N``. For each R in ``--ranks``
and each cache kind (``process``: every rank its own ``cache_bytes``; ``node``: one ``cache_bytes``
for the machine) the script runs ``torchrun --standalone --nproc-per-node R`` of itself: every rank
imports torch, joins a gloo group, waits at a barrier ("at rest"), then iterates ``--epochs`` epochs of
its share (batch 1, no workers, float32 on the CPU).

Measured from outside, every 0.1 s: the PSS of the whole process tree (``/proc/PID/smaps_rollup``,
so pages shared between ranks, including the node cache's mapped files, count once), at rest (all
ranks at the barrier, before any loader exists) and at its peak; ``added`` = peak - rest. Reported by
the ranks: images/s (all ranks' images over the slowest rank's time from loader start), decodes per
image (images decoded on the machine / images in the split) and the first batch's time.

    python benchmarks/bench_node.py                            # 268 frames, 1 GiB, R = 1, 2, 4
    python benchmarks/bench_node.py --n 96 --budget-mb 384     # a shorter run

Results: ``benchmarks/results/node.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))


def tree_pss(pid: int) -> int:
    """PSS bytes of ``pid`` and its descendants."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
            for task in Path(f"/proc/{current}/task").iterdir():
                children = (task / "children").read_text().split()
                stack.extend(int(c) for c in children)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


ROLLUP_FIELDS = ("Pss_Anon", "Pss_File", "Pss_Shmem")


def tree_breakdown(pid: int) -> dict[str, dict[str, int]]:
    """Per process of ``pid``'s tree: its command's last word and the PSS of its anonymous (private
    heap: batches, decoded images), file-backed and shared-memory (the node cache's mapped images)
    pages, in bytes (``/proc/PID/smaps_rollup``)."""
    out, stack = {}, [pid]
    while stack:
        current = stack.pop()
        try:
            fields = {}
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                name = line.split(":")[0]
                if name in ROLLUP_FIELDS or name == "Pss":
                    fields[name] = int(line.split()[1]) * 1024
            cmd = Path(f"/proc/{current}/cmdline").read_bytes().split(b"\0")
            fields["rank_worker"] = int(b"--rank-worker" in cmd and current != pid)  # not torchrun
            out[str(current)] = fields
            for task in Path(f"/proc/{current}/task").iterdir():
                stack.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return out


def make_store(n: int) -> Path:
    import numpy as np
    from bench_decode import encoded, photo

    from raykit.converters import convert

    folder = ROOT / "data" / f"node-capture-{n}"
    store = folder / "store.zarr"
    if (store / "manifest.json").exists() or (store / "zarr.json").exists():
        return store
    capture = folder / "capture"
    (capture / "images").mkdir(parents=True, exist_ok=True)
    frames = []
    for i in range(n):
        path = capture / "images" / f"{i:04d}.jpg"
        if not path.exists():
            path.write_bytes(encoded(photo(1080, 1920, seed=i), "JPEG", quality=90))
        pose = np.eye(4)
        pose[:3, 3] = [np.cos(i / 7), np.sin(i / 7), 0.1 * (i % 5)]
        frames.append({"file_path": f"images/{i:04d}.jpg", "transform_matrix": pose.tolist()})
    meta = {"fl_x": 1500.0, "fl_y": 1500.0, "cx": 960.0, "cy": 540.0, "w": 1920, "h": 1080, "frames": frames}
    (capture / "transforms.json").write_text(json.dumps(meta))
    convert(capture, store, layout="images", split="all", progress=False)
    return store


def rank_main(args: argparse.Namespace) -> None:
    """One rank under torchrun: at rest at a barrier, then ``--epochs`` epochs of its share."""
    import torch.distributed as dist

    from raykit.loaders import ImageLoader

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    (args.meet / f"rest-{rank}").touch()
    time.sleep(args.rest_s)  # the monitor samples the tree at rest here
    dist.barrier()
    t0 = time.perf_counter()
    loader = ImageLoader(
        args.store, "train", cache=args.cache, cache_bytes=args.budget_mb << 20, prefetch=args.prefetch
    )
    first, count = None, 0
    for _ in range(args.epochs):
        for batch in loader:
            count += len(batch)
            if first is None:
                first = time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    shared = loader.cache.shared
    decoded = shared.decoded if args.cache == "node" else shared.stats().misses
    result = {"rank": rank, "images": count, "seconds": seconds, "first_batch_s": first, "decoded": decoded,
              "n_images": loader.source.n_images}  # fmt: skip
    dist.barrier()
    (args.meet / f"result-{rank}.json").write_text(json.dumps(result))
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


def run_case(args: argparse.Namespace, store: Path, ranks: int, cache: str) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        meet = Path(tmp)
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
            str(Path(__file__).resolve()), "--rank-worker", "--store", str(store), "--cache", cache,
            "--budget-mb", str(args.budget_mb), "--epochs", str(args.epochs), "--meet", str(meet),
            "--rest-s", str(args.rest_s), "--prefetch", str(args.prefetch),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT.parent)}
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
        rest, peak, at_rest, at_peak = None, 0, {}, {}
        while process.poll() is None:
            pss = tree_pss(process.pid)
            if rest is None and len(list(meet.glob("rest-*"))) == ranks:
                time.sleep(args.rest_s / 3)
                rest = tree_pss(process.pid)
                at_rest = tree_breakdown(process.pid)
            if pss > peak:
                peak = pss
                if rest is not None:
                    at_peak = tree_breakdown(process.pid)
            time.sleep(0.1)
        if process.returncode != 0:
            raise SystemExit(f"torchrun failed ({process.returncode}): {' '.join(command)}")
        results = [json.loads(p.read_text()) for p in sorted(meet.glob("result-*.json"))]
    images = sum(r["images"] for r in results)
    return {
        "ranks": ranks,
        "cache": cache,
        "pss_rest_mb": (rest or 0) / 2**20,
        "pss_peak_mb": peak / 2**20,
        "added_mb": (peak - (rest or 0)) / 2**20,
        "images_per_s": images / max(r["seconds"] for r in results),
        "decodes_per_image": sum(r["decoded"] for r in results) / results[0]["n_images"],
        "first_batch_s": max(r["first_batch_s"] for r in results),
        "per_rank": results,
        "ranks_at_rest_mb": _ranks_mb(at_rest),
        "ranks_at_peak_mb": _ranks_mb(at_peak),
    }


def _ranks_mb(breakdown: dict[str, dict[str, int]]) -> dict[str, float]:
    """The ranks' PSS summed, split into anonymous / file / shared-memory pages, in MB."""
    ranks = [fields for fields in breakdown.values() if fields.get("rank_worker")]
    return {name: sum(f.get(name, 0) for f in ranks) / 2**20 for name in ("Pss", *ROLLUP_FIELDS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=268)
    parser.add_argument("--budget-mb", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--caches", nargs="+", default=["process", "node"])
    parser.add_argument("--rest-s", type=float, default=1.5)
    parser.add_argument("--prefetch", type=int, default=2, help="ImageLoader's prefetch (its default: 2)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "node.json")
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--meet", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_worker:
        rank_main(args)
        return
    from machine import command_line, describe

    store = make_store(args.n)
    rows = []
    for cache in args.caches:
        for ranks in args.ranks:
            row = run_case(args, store, ranks, cache)
            rows.append(row)
            print({k: v for k, v in row.items() if k != "per_rank"}, flush=True)
    one = {row["cache"]: row["added_mb"] for row in rows if row["ranks"] == 1}
    for row in rows:
        row["added_vs_one_rank"] = row["added_mb"] / one[row["cache"]] if one.get(row["cache"]) else None
    result = {"command": command_line(), "machine": describe(), "n": args.n, "budget_mb": args.budget_mb,
              "epochs": args.epochs, "prefetch": args.prefetch, "rows": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
