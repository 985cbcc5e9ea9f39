"""nerfstudio's own datamanagers against raykit's inside nerfstudio (issue 28), side by side.

Capture: the built-in scene (``--size``; the issue's is ``realistic``, 100 views of 800x800) written as
a Blender capture under ``--work``, converted to a rays-layout and an images-layout store. Cases, each
in its own subprocess so that its peak RSS (``VmHWM``) is its own, CPU, seeded, nerfstudio's
datamanagers with their defaults (caching every image) and the same batch size:

* ``vanilla`` / ``raykit-rays``: ``VanillaDataManager`` (Blender parser, its ``CacheDataloader``
  caching all images) and ``RaykitDataManager`` (raykit-data on the rays store, ``RayLoader`` with a
  cache that holds the capture): ``next_train`` rays/s over ``--steps`` batches of ``--rays`` after
  the first, time from construction to the first batch, peak RSS, and the resident bytes the
  datamanager added per ray of the capture (peak RSS less the RSS before it was constructed);
* ``raykit-rays-quarter``: the raykit one with ``cache_bytes`` a quarter of the capture's;
* ``full-image-uint8`` / ``raykit-images-uint8`` (splatfacto's setting) and ``full-image-float32`` /
  ``raykit-images-float32``: ``FullImageDatamanager`` (all images cached) and
  ``RaykitImageDataManager`` (images store, ``ImageLoader``, a cache that holds the capture as
  served): ``next_train`` images/s over ``--image-steps`` images, first batch, peak RSS;
* ``raykit-images-quarter``: uint8, ``cache_bytes`` a quarter of the capture as served (the capture is
  four times the cache): peak RSS against ``cache_bytes`` + 0.5 GB.

``--repeats`` runs every pair that many times, interleaved (A, B, A, B...); the tables give medians.

    python benchmarks/bench_integrations.py --size realistic --repeats 2   # under the timing lock
    python benchmarks/bench_integrations.py --markdown benchmarks/results/integrations.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import machine

PAIRS = (
    ("vanilla", "raykit-rays"),
    ("full-image-uint8", "raykit-images-uint8"),
    ("full-image-float32", "raykit-images-float32"),
    ("raykit-rays-quarter", "raykit-images-quarter"),
)
RAY_CASES = ("vanilla", "raykit-rays", "raykit-rays-quarter")


def prepare(work: Path, size: str) -> dict[str, str]:
    """The Blender capture and its two stores (made once per size)."""
    from raykit.converters import convert
    from raykit.testing import render_scene, write_blender

    root = work / size
    capture, rays, images = root / "capture", root / "rays.zarr", root / "images.zarr"
    if not (capture / "transforms_train.json").exists():
        write_blender(render_scene(size), capture)
    if not rays.exists():
        convert(capture, rays)
    if not images.exists():
        convert(capture, images, layout="images")
    return {"capture": str(capture), "rays": str(rays), "images": str(images)}


def served_bytes(case: str, n_pixels: int) -> int:
    """Bytes of the capture as the image datamanager serves it: RGB uint8 or float32."""
    return n_pixels * 3 * (4 if case.endswith("float32") else 1)


def _manager(case: str, paths: dict[str, str], rays: int, n_pixels: int) -> tuple[Any, int | None]:
    """The case's datamanager on the CPU, and its cache budget (None for nerfstudio's)."""
    from nerfstudio.data.datamanagers.base_datamanager import VanillaDataManagerConfig
    from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig
    from nerfstudio.data.dataparsers.blender_dataparser import BlenderDataParserConfig

    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
    from raykit.integrations.nerfstudio.image_datamanager import RaykitImageDataManagerConfig
    from raykit.integrations.nerfstudio.ray_datamanager import RaykitDataManagerConfig

    blender = BlenderDataParserConfig(data=Path(paths["capture"]))
    if case == "vanilla":
        config = VanillaDataManagerConfig(dataparser=blender, train_num_rays_per_batch=rays)
        return config.setup(device="cpu"), None
    if case.startswith("raykit-rays"):
        cache = n_pixels * 4  # the rays store's RGBA colours: 4 bytes per cached ray
        cache = cache // 4 if case.endswith("quarter") else cache + (64 << 20)
        parser = RaykitDataParserConfig(data=Path(paths["rays"]))
        config = RaykitDataManagerConfig(dataparser=parser, train_num_rays_per_batch=rays, cache_bytes=cache)
        return config.setup(device="cpu"), cache
    if case.startswith("full-image"):  # "gpu" caching on the cpu device: "cpu" pins memory, which needs CUDA
        kind = case.rsplit("-", 1)[1]
        config = FullImageDatamanagerConfig(dataparser=blender, cache_images="gpu", cache_images_type=kind)
        return config.setup(device="cpu"), None
    kind = "uint8" if case.endswith("quarter") else case.rsplit("-", 1)[1]
    served = served_bytes(kind, n_pixels)
    cache = served // 4 if case.endswith("quarter") else served + (64 << 20)
    parser = RaykitDataParserConfig(data=Path(paths["images"]))
    config = RaykitImageDataManagerConfig(dataparser=parser, cache_bytes=cache, cache_images_type=kind)
    return config.setup(device="cpu"), cache


def run_case(case: str, paths: dict[str, str], rays: int, steps: int) -> dict[str, Any]:
    """One case in this process: rate after the first batch, time to the first batch, memory."""
    import nerfstudio.data.datamanagers.full_images_datamanager  # noqa: F401  (imports before the baseline)

    import raykit.integrations.nerfstudio.image_datamanager
    import raykit.integrations.nerfstudio.ray_datamanager  # noqa: F401
    from raykit.store import open_store

    store = open_store(paths["rays"])
    n_pixels = store.splits["train"].n_rays
    base = machine.rss()
    t0 = time.perf_counter()
    manager, cache = _manager(case, paths, rays, n_pixels)
    manager.next_train(0)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    for step in range(1, steps + 1):
        manager.next_train(step)
    seconds = time.perf_counter() - t1
    peak = machine.peak_rss()
    out: dict[str, Any] = {"case": case, "first_batch_s": first, "steps": steps, "seconds": seconds}
    out |= {"peak_rss": peak, "rss_before": base, "rss_end": machine.rss(), "cache_bytes": cache}
    out["peak_rss_children"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    out["capture_pixels"] = n_pixels
    out["loadavg_1m"] = os.getloadavg()[0]
    if case in RAY_CASES:
        out["rays_per_s"] = steps * rays / seconds
        out["added_rss_bytes_per_capture_ray"] = (peak - base) / n_pixels
        out["rss_bytes_per_capture_ray"] = peak / n_pixels
    else:
        out["images_per_s"] = steps / seconds
    return out


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


def markdown(report: dict[str, Any]) -> str:
    """The BENCHMARKS.md table: medians over the repeats of each case."""
    rows = [
        "| case | next_train | first batch s | peak RSS MB | added RSS per capture ray B | cache MB |",
        "|---|---|---|---|---|---|",
    ]
    by_case: dict[str, list[dict[str, Any]]] = {}
    for r in report["cases"]:
        by_case.setdefault(r["case"], []).append(r)
    for case, runs in by_case.items():
        if "rays_per_s" in runs[0]:
            rate = f"{_median(runs, 'rays_per_s'):,.0f} rays/s"
        else:
            rate = f"{_median(runs, 'images_per_s'):,.0f} images/s"
        added = (_median(runs, "peak_rss") - _median(runs, "rss_before")) / runs[0]["capture_pixels"]
        cache = "" if runs[0]["cache_bytes"] is None else f"{runs[0]['cache_bytes'] / 1e6:,.0f}"
        first, peak = _median(runs, "first_batch_s"), _median(runs, "peak_rss") / 1e6
        rows.append(f"| {case} | {rate} | {first:.2f} | {peak:,.0f} | {added:.2f} | {cache} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="small", choices=["tiny", "small", "realistic"])
    p.add_argument("--rays", type=int, default=4096)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--image-steps", type=int, default=60)
    p.add_argument("--work", default="benchmarks/data/integrations")
    p.add_argument("--out", default="benchmarks/results/integrations.json")
    p.add_argument("--repeats", type=int, default=1, help="interleaved runs of every pair")
    p.add_argument("--only", nargs="*", help="run only these cases")
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--markdown", metavar="JSON", help="print the BENCHMARKS.md table of a result file")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    paths = prepare(Path(args.work), args.size)
    if args.case:
        steps = args.steps if args.case in RAY_CASES else args.image_steps
        print(json.dumps(run_case(args.case, paths, args.rays, steps)))
        return 0
    cases = []
    for _ in range(args.repeats):
        for pair in PAIRS:
            for case in pair:
                if args.only and case not in args.only:
                    continue
                cmd = [
                    sys.executable,
                    __file__,
                    "--case",
                    case,
                    *(argv if argv is not None else sys.argv[1:]),
                ]
                done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
                if done.returncode != 0:
                    raise SystemExit(f"bench_integrations: case {case} failed:\n{done.stderr[-4000:]}")
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
