"""Images layout against ray layout (issue 15): store bytes, conversion rate, loader rays/s, memory, mixing.

Two captures of the built-in scene (``--size``, default ``realistic``: 800x800, 100/10/10 views):

* ``png``: its Blender form (RGBA PNGs, as ``bench_convert.py`` writes it);
* ``jpeg``: the same views composited over white with seeded sensor noise (sigma 2 levels), as RGB
  JPEGs of quality 90 in an instant-ngp ``transforms.json`` capture (photo-like bytes).

For each capture: the images-layout store's payload bytes against the source images' bytes (target
<= 1.02x plus metadata; every image passes through), and the conversion rate of one worker of one and
of two threads (``--threads``; issue 14 defines "per worker" as 1 worker x 2 threads) against the
single-core decode rate of the same files (target >= 0.8x), with the phase times of each conversion.
Then, on the JPEG capture, the ray loader of each layout (batch 4096, 2 torch threads, CPU,
``--batches`` batches after the first; the images loader with a window of ``--window`` images,
``cache_bytes`` sized to hold it plus the images decoded ahead), each in a fresh process: steady
rays/s, time to first batch, peak RSS above the process's RSS with the store open (target: within
``cache_bytes`` + 0.4 GB), ``raykit bench``'s MB/s read and decode share, and the shuffle quality of
the first 50 batches.
Target: images >= 0.6x the ray layout's rays/s with a window of at least 16 images, first batch < 1 s.

    python benchmarks/bench_layouts.py                          # the full benchmark
    python benchmarks/bench_layouts.py --size small --batches 50 --out out/layouts.json   # a quick look
    python benchmarks/bench_layouts.py --convert-only --layouts images   # the conversions only

Results go to ``benchmarks/results/layouts.json``; ``--markdown FILE`` prints the BENCHMARKS.md section
of a results file instead of measuring.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from machine import command_line, describe, write_report
from PIL import Image

ROOT = Path(__file__).resolve().parent
MB = 1 << 20
LAYOUTS = ("rays", "images")


def png_capture(size: str) -> Path:
    from raykit.testing import render_scene, write_blender

    path = ROOT / "data" / f"images-{size}-png"
    if not (path / "transforms_test.json").exists():
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write_blender(render_scene(size, seed=0), tmp)
        tmp.rename(path)
    return path


def jpeg_capture(png: Path) -> Path:
    """The PNG capture's views over white, with seeded noise, as quality-90 JPEGs (ngp form)."""
    path = png.with_name(png.name.replace("-png", "-jpeg"))
    if (path / "transforms.json").exists():
        return path
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng(7)
    frames = []
    meta: dict[str, Any] = {}
    for split in ("train", "val", "test"):
        doc = json.loads((png / f"transforms_{split}.json").read_text())
        for frame in doc["frames"]:
            src = png / f"{frame['file_path']}.png"
            rgba = np.asarray(Image.open(src)).astype(np.float64)
            rgb = rgba[..., :3] * rgba[..., 3:] / 255 + 255 * (1 - rgba[..., 3:] / 255)
            rgb = np.clip(np.rint(rgb + rng.normal(0, 2, rgb.shape)), 0, 255).astype(np.uint8)
            rel = f"images/{split}_{Path(frame['file_path']).name}.jpg"
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rgb).save(tmp / rel, quality=90)
            h, w = rgb.shape[:2]
            focal = 0.5 * w / np.tan(0.5 * doc["camera_angle_x"])
            meta = {"fl_x": focal, "fl_y": focal, "cx": w / 2, "cy": h / 2, "w": w, "h": h}
            frames.append({"file_path": rel, "transform_matrix": frame["transform_matrix"]})
    # the Blender poses are OpenGL camera-to-world already, as instant-ngp's transforms.json expects
    (tmp / "transforms.json").write_text(json.dumps({**meta, "frames": frames}))
    tmp.rename(path)
    return path


def decode_rate(files: list[Path], repeats: int = 2, to_array: Any = np.asarray) -> dict[str, float]:
    """Single-core Pillow decode of every file into one array (``to_array``: ``np.asarray``, or the
    converter's own faster ``pixel_array`` for the stricter reference), best of ``repeats``."""
    best, pixels = float("inf"), 0
    for _ in range(repeats):
        start, pixels = time.perf_counter(), 0
        for path in files:
            with Image.open(path) as img:
                img.load()
                array = to_array(img)
                pixels += int(array.shape[0] * array.shape[1])
        best = min(best, time.perf_counter() - start)
    return {"seconds": best, "megapixels": pixels / 1e6, "mp_per_s": pixels / 1e6 / best}


def measure_store(
    src: Path, work: Path, name: str, threads: tuple[int, ...] = (1, 2), layouts: tuple[str, ...] = LAYOUTS
) -> dict[str, Any]:
    """Decode rate, then each layout's conversion with 1 worker of each of ``threads`` threads.

    Each layout's top-level figures are the 1-thread run's (as before); ``by_threads`` holds every run
    (seconds, ratio per worker against the single-core decode rate, CPU seconds of the process, phase
    times, fingerprint) and ``identical_across_threads`` whether their fingerprints agree.
    """
    from raykit.converters import convert
    from raykit.converters.images import pixel_array
    from raykit.recorder import recording

    files = sorted(p for p in src.rglob("*") if p.suffix in (".png", ".jpg"))
    decode = decode_rate(files)
    strict = decode_rate(files, to_array=pixel_array)  # decode + the cheapest array: the stricter reference
    out: dict[str, Any] = {"n_images": len(files), "source_bytes": sum(p.stat().st_size for p in files),
                           "decode_single_core": decode, "decode_single_core_strict": strict}  # fmt: skip
    split = {"split": "source"} if (src / "transforms_train.json").exists() else {"split": "every:8"}
    for layout in layouts:
        dst = work / f"{name}-{layout}"
        runs: dict[str, Any] = {}
        for n in threads:
            shutil.rmtree(dst, ignore_errors=True)
            load = os.getloadavg()[0]
            with recording() as recorder:
                start, cpu = time.perf_counter(), time.process_time()
                store = convert(src, dst, layout=layout, threads=n, near=0.5, far=8.0, **split)
                seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            runs[str(n)] = {
                "threads": n,
                "seconds": seconds,
                "cpu_seconds": cpu,
                "per_worker_vs_decode": decode["seconds"] / seconds,
                "per_worker_vs_strict_decode": strict["seconds"] / seconds,
                "cpu_vs_decode": cpu / decode["seconds"],
                "loadavg_1m_before": load,
                "fingerprint": store.fingerprint,
                "phases": recorder.seconds,
            }
        seconds = runs[str(threads[0])]["seconds"]
        payload = sum(v["size"] for k, v in store.files.items() if k.startswith(("zarr/", "wds/")))
        total = sum(v["size"] for v in store.files.values())
        out[layout] = {
            "seconds": seconds,
            "mp_per_s_per_worker": decode["megapixels"] / seconds,
            "per_worker_vs_decode": decode["megapixels"] / seconds / decode["mp_per_s"],
            "payload_bytes": payload,
            "bytes_on_disk": total,
            "payload_vs_source": payload / out["source_bytes"],
            "disk_vs_source": total / out["source_bytes"],
            "by_threads": runs,
            "identical_across_threads": len({r["fingerprint"] for r in runs.values()}) == 1,
        }
        if layout == "images":
            entries = [store.index[k] for k in store.splits]
            out[layout]["passthrough"] = sum(sum(e["passthrough"]) for e in entries)
    return out


def ensure_stores(src: Path, work: Path) -> None:
    """The capture's rays- and images-layout stores in ``work`` (``--loader-only``): converted once, as
    ``measure_store`` converts them, when missing."""
    from raykit.converters import convert

    for layout in LAYOUTS:
        dst = work / f"jpeg-{layout}"
        if not (dst / "manifest.json").exists():
            split = {"split": "source"} if (src / "transforms_train.json").exists() else {"split": "every:8"}
            convert(src, dst, layout=layout, threads=2, near=0.5, far=8.0, overwrite=True, **split)


def _rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _loader_child(url: str, options: dict[str, Any], batches: int, queue: Any) -> None:
    import torch

    from raykit.loaders import RayLoader
    from raykit.profiling.mixing import shuffle_quality
    from raykit.store import open_store

    torch.set_num_threads(2)
    store = open_store(url)
    base = _rss_mb()
    loader = RayLoader(store, "train", 4096, seed=0, **options)
    start = time.perf_counter()
    iterator = iter(loader)
    first = next(iterator)
    first_s = time.perf_counter() - start
    rows = np.flatnonzero(np.asarray(store.table.splits) == "train")
    images = [first.image.numpy() - rows[0]]
    t0, rays = time.perf_counter(), 0
    for _, batch in zip(range(batches), iterator, strict=False):
        rays += len(batch)
        if len(images) < 50:
            images.append(batch.image.numpy() - rows[0])
    seconds = time.perf_counter() - t0
    del iterator
    loader.close()
    quality = shuffle_quality(images, store.table.n_pixels[rows])
    peak = _rss_mb() - base
    queue.put({"rays_per_s": rays / seconds, "first_batch_s": first_s, "peak_rss_above_open_mb": peak,
               "window_images": getattr(loader.plan, "window_images", None), "shuffle_quality": quality,
               "seconds": seconds, "rays": rays})  # fmt: skip


def measure_loader(url: str, options: dict[str, Any], batches: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_loader_child, args=(url, options, batches, queue))
    child.start()
    result: dict[str, Any] = queue.get(timeout=1800)
    child.join()
    return result


def bench_report(url: str, cache_mb: float, batches: int) -> dict[str, Any]:
    from raykit.profiling.loader import run_bench
    from raykit.store import open_store

    report = run_bench(open_store(url), batch_size=4096, cache_bytes=int(cache_mb * MB), batches=batches)
    keep = ("layout", "read_mb_per_s", "decode_share", "shuffle_quality", "warm", "stages")
    return {k: report.get(k) for k in keep}


def _q(q: dict[str, Any] | None) -> str:
    if not q:
        return "-"
    return f"{q['distinct_images']:.1f} of {q['uniform_expected']:.1f}; TV {q['tv_ratio']:.2f}x uniform"


def _ratio(x: dict[str, Any], threads: str) -> str:
    run = x.get("by_threads", {}).get(threads)
    if run is None:
        return f"{x['per_worker_vs_decode']:.2f}x" if threads == "1" else "-"
    return f"{run['per_worker_vs_decode']:.2f}x"


def markdown(r: dict[str, Any]) -> str:
    """The BENCHMARKS.md section of a results file."""
    rows = []
    for cap in ("jpeg", "png"):
        c = r[cap]
        for layout in [k for k in LAYOUTS if k in c]:
            x = c[layout]
            runs = x.get("by_threads", {})
            two = runs.get("2")
            cells = [cap, layout, f"{c['source_bytes'] / MB:.1f}", f"{x['payload_bytes'] / MB:.1f}",
                     f"{x['payload_vs_source']:.3f}", f"{x['disk_vs_source']:.3f}", f"{x['seconds']:.2f}",
                     f"{x['per_worker_vs_decode']:.2f}", f"{two['seconds']:.2f}" if two else "-",
                     f"**{two['per_worker_vs_decode']:.2f}**" if two else "-"]  # fmt: skip
            rows.append("| " + " | ".join(cells) + " |")
    rate = {k: r[k]["decode_single_core"]["mp_per_s"] for k in ("jpeg", "png")}
    load = [[round(v, 2) for v in r[k]] for k in ("load_average_start", "load_average_end")]
    convert_part = [
        "## Issue 15: images layout",
        f"Command: `{r['command']}`",
        "",
        f"Scene: built-in `{r['size']}` ({r['jpeg']['n_images']} views), as RGBA PNGs (Blender form) and as "
        "RGB JPEGs (quality 90, sensor noise: photo-like). Conversion with 1 worker of 1 and of 2 threads "
        "(per worker = 1 worker x 2 threads, issue 14's definition); decode rate: single-core Pillow decode "
        f"of the same files into arrays, best of 2 (JPEG {rate['jpeg']:.1f} MP/s, "
        f"PNG {rate['png']:.1f} MP/s). "
        f"Load average at start/end: {load[0]} / {load[1]} "
        "(a shared 2-core machine: other work was running; figures are noisy).",
        "",
        "| capture | layout | source MB | payload MB | payload / source | disk / source | 1x1 s | "
        "1x1 / decode | 1x2 s | 1x2 per worker / decode |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    png, jpeg = r["png"].get("images"), r["jpeg"].get("images")
    if png and jpeg:
        convert_part += [
            f"- images layout: {jpeg['passthrough']} of {r['jpeg']['n_images']} JPEGs and "
            f"{png['passthrough']} of {r['png']['n_images']} PNGs passed through byte for byte; store bytes "
            f"{jpeg['disk_vs_source']:.3f}x (JPEG) and {png['disk_vs_source']:.3f}x (PNG) the source images "
            "including metadata (target <= 1.02x plus metadata).",
            f"- conversion per worker (1x2): {_ratio(jpeg, '2')} (JPEG) and {_ratio(png, '2')} (PNG) the "
            f"single-core decode rate; 1x1: {_ratio(jpeg, '1')} and {_ratio(png, '1')} (target >= 0.8x).",
        ]
    if "loader" not in r:
        return "\n".join(convert_part)
    lo = r["loader"]
    lrows = []
    for layout in ("rays", "images"):
        x, b = lo[layout], r["bench"][layout]
        cells = [layout, f"{x['rays_per_s'] / 1e6:.2f}", f"{x['first_batch_s']:.3f}",
                 f"{x['peak_rss_above_open_mb']:.0f}", f"{b['read_mb_per_s']:.1f}",
                 f"{b['decode_share']:.2f}", str(x.get("window_images") or "-"),
                 _q(x["shuffle_quality"])]  # fmt: skip
        lrows.append("| " + " | ".join(cells) + " |")
    cache_mb = lo["images"]["cache_bytes"] / MB
    return "\n".join([
        *convert_part,
        "",
        "Loader on the JPEG capture, train split, batch 4096, CPU, 2 torch threads, each in a fresh "
        "process; "
        f"images layout with a window of {lo['images']['window_images']} images (`cache_bytes` "
        f"{cache_mb:.0f} MB: the window plus the 4 images decoded ahead). MB/s read and decode share from "
        "`raykit bench` (decode share: for the ray layout, read + decompress; for the images layout, image "
        "decoding, of all stage time). Shuffle quality over the first 50 batches: distinct images per batch "
        "against a uniform draw's expectation, and total-variation distance of the batch's image histogram "
        "against a uniform draw's (`raykit.profiling.mixing.shuffle_quality`).",
        "",
        "| layout | steady M rays/s | first batch s | peak RSS above open, MB | MB/s read | decode share | "
        "window | shuffle quality |",
        "|---|---|---|---|---|---|---|---|",
        *lrows,
        "",
        f"- images / rays throughput: **{lo['images_vs_rays']:.2f}x** (target >= 0.6x with a window of at "
        f"least 16 images); first batch {lo['images']['first_batch_s']:.2f} s (target < 1 s); peak RSS "
        f"{lo['images']['peak_rss_above_open_mb']:.0f} MB above the opened store, against cache_bytes "
        f"{cache_mb:.0f} MB + 400 MB.",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="realistic")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--work", default=str(ROOT / "data" / "images-work"))
    parser.add_argument("--out", default=str(ROOT / "results" / "layouts.json"))
    parser.add_argument("--markdown", default=None, metavar="FILE", help="print FILE's BENCHMARKS.md section")
    parser.add_argument(
        "--convert-only",
        action="store_true",
        help="only the conversions (no loader runs); default --out results/layouts_convert.json",
    )
    parser.add_argument(
        "--loader-only",
        action="store_true",
        help="only the loader runs (stores converted if missing); default --out results/layouts_loader.json",
    )
    parser.add_argument(
        "--loader-repeats",
        type=int,
        default=1,
        help="rays/images loader pairs, run alternately (median kept)",
    )
    parser.add_argument("--threads", default="1,2", help="threads of the one worker, one conversion each")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="layouts to convert to")
    args = parser.parse_args()
    threads = tuple(int(t) for t in args.threads.split(","))
    layouts = tuple(args.layouts.split(","))
    if args.convert_only and args.out == parser.get_default("out"):
        args.out = str(ROOT / "results" / "layouts_convert.json")
    if args.loader_only and args.out == parser.get_default("out"):
        args.out = str(ROOT / "results" / "layouts_loader.json")
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return
    load_start = os.getloadavg()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    png = png_capture(args.size)
    jpeg = jpeg_capture(png)
    report: dict[str, Any] = {"command": command_line(), "machine": describe(2), "size": args.size,
                              "load_average_start": load_start}  # fmt: skip
    if args.loader_only:
        ensure_stores(jpeg, work)
    else:
        report["png"] = measure_store(png, work, "png", threads, layouts)
        report["jpeg"] = measure_store(jpeg, work, "jpeg", threads, layouts)
    if args.convert_only:
        report["load_average_end"] = os.getloadavg()
        write_report(args.out, report)
        print(markdown(report))
        return
    from raykit.store import open_store

    images_url = str(work / "jpeg-images")
    store = open_store(images_url)
    per_image = int(store.table.n_pixels.max()) * store.rgba_channels
    cache = (args.window + 4) * per_image  # the window plus the images decoded ahead (DECODE_AHEAD)
    pairs = []  # (rays, images) measured one after the other, so that both see the same machine
    for _ in range(max(1, args.loader_repeats)):
        rays_run = measure_loader(str(work / "jpeg-rays"), {}, args.batches)
        images_run = measure_loader(images_url, {"cache_bytes": cache}, args.batches)
        pairs.append((rays_run, {**images_run, "cache_bytes": cache}))
    ratios = [b["rays_per_s"] / a["rays_per_s"] for a, b in pairs]
    median = sorted(range(len(pairs)), key=lambda j: ratios[j])[len(pairs) // 2]  # the median pair
    report["loader"] = {
        "rays": pairs[median][0],
        "images": pairs[median][1],
        "images_vs_rays": ratios[median],
    }
    if len(pairs) > 1:
        report["loader"]["pairs"] = [
            {"rays_per_s": [a["rays_per_s"], b["rays_per_s"]], "images_vs_rays": r}
            for (a, b), r in zip(pairs, ratios, strict=True)
        ]
    report["bench"] = {
        "rays": bench_report(str(work / "jpeg-rays"), 512, min(args.batches, 100)),
        "images": bench_report(images_url, cache / MB, min(args.batches, 100)),
    }
    report["load_average_end"] = os.getloadavg()
    write_report(args.out, report)
    print(json.dumps({k: report[k] for k in ("png", "jpeg", "loader") if k in report}, indent=1))


if __name__ == "__main__":
    main()
