"""nerfstudio's own datamanagers against raykit's inside nerfstudio (issue 28), side by side.

Capture: the built-in scene (``--size``; the issue's is ``realistic``, 100 views of 800x800) written as
a Blender capture under ``--work``, converted to a rays-layout and an images-layout store. Cases, each
in its own subprocess so that its peak RSS (``ru_maxrss``) is its own, CPU, seeded:

* ``vanilla`` / ``raykit-rays``: ``VanillaDataManager`` (Blender parser, its CacheDataloader with its
  default workers) and ``RaykitDataManager`` (raykit-data on the rays store, ``RayLoader``):
  ``next_train`` rays/s over ``--steps`` batches of ``--rays`` after the first, time from
  construction to the first batch, peak RSS and resident bytes per ray of the capture;
* ``full-image`` / ``raykit-images``: ``FullImageDatamanager`` (all images cached, float32) and
  ``RaykitImageDataManager`` (images store, ``ImageLoader``): images/s, first batch, peak RSS;
* ``raykit-images-quarter``: the raykit one with ``cache_bytes`` a quarter of the decoded capture.

    python benchmarks/bench_integrations.py --size small            # under the timing lock
    python benchmarks/bench_integrations.py --markdown benchmarks/results/integrations.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine

CASES = ("vanilla", "raykit-rays", "full-image", "raykit-images", "raykit-images-quarter")


def prepare(work: Path, size: str) -> dict[str, str]:
    """The Blender capture and its two stores (made once per size)."""
    from raykit.converters import convert
    from raykit.scene import render_scene, write_blender

    root = work / size
    capture, rays, images = root / "capture", root / "rays.zarr", root / "images.zarr"
    if not (capture / "transforms_train.json").exists():
        write_blender(render_scene(size), capture)
    if not rays.exists():
        convert(capture, rays)
    if not images.exists():
        convert(capture, images, layout="images")
    return {"capture": str(capture), "rays": str(rays), "images": str(images)}


def _manager(case: str, paths: dict[str, str], rays: int, capture_bytes: int) -> Any:
    from nerfstudio.data.datamanagers.base_datamanager import VanillaDataManagerConfig
    from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig
    from nerfstudio.data.dataparsers.blender_dataparser import BlenderDataParserConfig

    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
    from raykit.integrations.nerfstudio.image_datamanager import RaykitImageDataManagerConfig
    from raykit.integrations.nerfstudio.ray_datamanager import RaykitDataManagerConfig

    blender = BlenderDataParserConfig(data=Path(paths["capture"]))
    if case == "vanilla":
        return VanillaDataManagerConfig(dataparser=blender, train_num_rays_per_batch=rays).setup(device="cpu")
    if case == "raykit-rays":
        parser = RaykitDataParserConfig(data=Path(paths["rays"]))
        return RaykitDataManagerConfig(dataparser=parser, train_num_rays_per_batch=rays).setup(device="cpu")
    if case == "full-image":  # "gpu" caching on the cpu device: "cpu" pins memory, which needs CUDA
        return FullImageDatamanagerConfig(dataparser=blender, cache_images="gpu").setup(device="cpu")
    cache = capture_bytes // 4 if case == "raykit-images-quarter" else 2 * capture_bytes
    parser = RaykitDataParserConfig(data=Path(paths["images"]))
    return RaykitImageDataManagerConfig(dataparser=parser, cache_bytes=cache).setup(device="cpu")


def run_case(case: str, paths: dict[str, str], rays: int, steps: int) -> dict[str, Any]:
    """One case in this process: rate after the first batch, time to the first batch, peak RSS."""
    from raykit.store import open_store

    store = open_store(paths["rays"])
    n_rays = store.splits["train"].n_rays
    capture_bytes = n_rays * store.rgba_channels
    t0 = time.perf_counter()
    manager = _manager(case, paths, rays, capture_bytes)
    manager.next_train(0)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    for step in range(1, steps + 1):
        manager.next_train(step)
    seconds = time.perf_counter() - t1
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    out = {"case": case, "first_batch_s": first, "steps": steps, "seconds": seconds, "peak_rss": rss}
    out["peak_rss_children"] = children
    out["capture_decoded_bytes"] = capture_bytes
    if case in ("vanilla", "raykit-rays"):
        out["rays_per_s"] = steps * rays / seconds
        out["rss_bytes_per_capture_ray"] = rss / n_rays
    else:
        out["images_per_s"] = steps / seconds
    return out


def markdown(report: dict[str, Any]) -> str:
    rows = ["| case | rays/s or images/s | first batch (s) | peak RSS (MB) |", "|---|---|---|---|"]
    for r in report["cases"]:
        rate = f"{r['rays_per_s']:,.0f} rays/s" if "rays_per_s" in r else f"{r['images_per_s']:.1f} images/s"
        rows.append(f"| {r['case']} | {rate} | {r['first_batch_s']:.2f} | {r['peak_rss'] / 1e6:.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="small", choices=["tiny", "small", "realistic"])
    p.add_argument("--rays", type=int, default=4096)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--image-steps", type=int, default=60)
    p.add_argument("--work", default="benchmarks/data/integrations")
    p.add_argument("--out", default="benchmarks/results/integrations.json")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--markdown", metavar="JSON", help="print the BENCHMARKS.md table of a result file")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    paths = prepare(Path(args.work), args.size)
    if args.case:
        steps = args.steps if args.case in ("vanilla", "raykit-rays") else args.image_steps
        print(json.dumps(run_case(args.case, paths, args.rays, steps)))
        return 0
    cases = []
    for case in CASES:
        cmd = [sys.executable, __file__, "--case", case, *(argv if argv is not None else sys.argv[1:])]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy())
        cases.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(cases[-1]), flush=True)
    report = {
        "command": machine.command_line(),
        "machine": machine.describe(),
        "load_average": os.getloadavg(),
        "size": args.size,
        "rays": args.rays,
        "cases": cases,
    }
    machine.write_report(args.out, report)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
