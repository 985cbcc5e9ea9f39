"""Neural 3D Video conversion benchmark: ``raykit convert`` of a synthetic multi-view video capture
against the decode-once floor, its peak memory, and the images layout's bytes per frame per codec.

Setup (once, reused from ``benchmarks/data/video-<cams>x<frames>-<w>x<h>/``): a procedural capture of
``--cameras`` videos of ``--frames`` frames at ``--width`` x ``--height`` (smooth gradients, a moving
textured disc and sensor-like noise, different per camera), encoded like DyNeRF's: H.264 (libx264,
yuv420p, crf 18), and a ``poses_bounds.npy`` of cameras on an arc.

Measured, each in a fresh process (its peak RSS, ``ru_maxrss``, is the process's own):

* ``floor``: PyAV decoding every frame of every video once to RGB (``to_ndarray``), nothing else,
  the videos decoded ``--threads`` at a time (one decoder each, as the converter does);
* ``convert_<layout>_<codec>``: ``raykit.converters.convert`` with ``--threads`` threads, wall time,
  frames per second, ``vs_floor`` (floor seconds / conversion seconds), peak RSS, and for the images
  layout the stored bytes per frame (``index.json``'s ``image_bytes``) against the mp4's and
  ``decode_ms``, the loaders' decode of one stored frame (``RayStore.read_image``'s ``"decode"`` step,
  the median over ``--decode-frames`` frames), and ``decode_cpu_ms``, the CPU time of that
  ``read_image`` (read, CRC check and decode: what a loaded machine changes less).

Each child also reports its CPU seconds (user + system, all its threads): ``vs_floor_cpu`` (floor CPU
seconds / conversion CPU seconds) is the ratio of the work done, which neighbours on a shared machine
change less than the wall times. Both kinds of child warm up before their clock starts (the floor
decodes a frame, the conversion converts each camera's first frame elsewhere): imports and first calls
are a constant of the process, not of the video, and would weigh on a short capture only.

    python benchmarks/bench_video.py                                  # 4 cameras x 60 frames, 1352x1014
    python benchmarks/bench_video.py --frames 10 --out benchmarks/results/video_quick.json    # a quick look

Results go to ``benchmarks/results/video.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent


def _frame(cam: int, t: int, width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 128 + 100 * np.sin(xs / (60 + 7 * cam) + t / 20)
    g = 128 + 100 * np.cos(ys / (45 + 5 * cam))
    b = 128 + 60 * np.sin((xs + ys) / 90 + cam)
    image = np.stack([r, g, b], -1)
    cx, cy, radius = width * (0.3 + 0.4 * t / 60 % 1), height / 2, height / 6
    disc = (xs - cx) ** 2 + (ys - cy) ** 2 < radius**2
    image[disc] = (40 + 30 * ((xs[disc] // 16 + ys[disc] // 16) % 2))[:, None]
    image += rng.normal(0, 2, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def make_capture(folder: Path, cameras: int, frames: int, width: int, height: int) -> Path:
    import av

    if (folder / "poses_bounds.npy").is_file():
        return folder
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rows = []
    for c in range(cameras):
        angle = (c - (cameras - 1) / 2) * 0.15
        centre = np.array([4 * math.sin(angle), 0.0, 4 * math.cos(angle)])
        back = centre / np.linalg.norm(centre)
        right = np.cross([0.0, 1.0, 0.0], back)
        right /= np.linalg.norm(right)
        down = -np.cross(back, right)
        pose = np.stack([down, right, back, centre, [height, width, 0.9 * width]], 1)
        rows.append(np.concatenate([pose.reshape(-1), [1.0, 10.0]]))
        rng = np.random.default_rng(c)
        with av.open(str(tmp / f"cam{c:02d}.mp4"), "w") as container:
            stream = container.add_stream("libx264", rate=30, options={"crf": "18"})
            stream.pix_fmt, stream.width, stream.height = "yuv420p", width, height
            for t in range(frames):
                frame = av.VideoFrame.from_ndarray(_frame(c, t, width, height, rng), format="rgb24")
                container.mux(stream.encode(frame))
            container.mux(stream.encode())
    np.save(tmp / "poses_bounds.npy", np.stack(rows))
    tmp.rename(folder)
    return folder


def _decode_all(path: str) -> int:
    import av

    n = 0
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            frame.to_ndarray(format="rgb24")
            n += 1
    return n


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def floor(capture: str, threads: int) -> dict[str, float]:
    from concurrent.futures import ThreadPoolExecutor

    import av

    videos = sorted(str(p) for p in Path(capture).glob("cam*.mp4"))
    with av.open(videos[0]) as container:  # the warm-up
        next(container.decode(video=0)).to_ndarray(format="rgb24")
    start, cpu = time.perf_counter(), _cpu()
    with ThreadPoolExecutor(threads) as pool:
        frames = sum(pool.map(_decode_all, videos))
    return {"seconds": time.perf_counter() - start, "cpu_seconds": _cpu() - cpu, "frames": frames}


def _decode_ms(store: object, names: list[str]) -> tuple[float, float]:
    """Median milliseconds of the loaders' decode of one stored frame: wall (``read_image``'s own
    ``"decode"`` timing) and CPU (this thread's, over the whole ``read_image``: read, check, decode)."""
    wall: list[float] = []
    cpu: list[float] = []
    for name in names:
        start = time.thread_time()
        store.read_image(name, timed=lambda step, s: wall.append(s * 1e3) if step == "decode" else None)  # type: ignore[attr-defined]
        cpu.append((time.thread_time() - start) * 1e3)
    return float(np.median(wall)), float(np.median(cpu))


def conversion(
    capture: str, dst: str, layout: str, codec: str, threads: int, sample: int
) -> dict[str, float]:
    from raykit.converters import convert

    options = {"layout": layout, "image_codec": codec, "threads": threads}
    shutil.rmtree(dst + ".warm", ignore_errors=True)
    convert(capture, dst + ".warm", frame_stop=1, **options)  # the warm-up
    shutil.rmtree(dst + ".warm", ignore_errors=True)
    shutil.rmtree(dst, ignore_errors=True)
    start, cpu = time.perf_counter(), _cpu()
    store = convert(capture, dst, **options)
    seconds, cpu = time.perf_counter() - start, _cpu() - cpu
    out = {"seconds": seconds, "cpu_seconds": cpu, "frames": len(store.table.names)}
    if layout == "images":
        sizes = [b for split in store.splits for b in store.index[split]["image_bytes"]]
        out["bytes_per_frame"] = float(np.mean(sizes))
        names = store.table.names
        picked = np.linspace(0, len(names) - 1, sample, dtype=int)
        out["decode_ms"], out["decode_cpu_ms"] = _decode_ms(store, [names[k] for k in picked])
    shutil.rmtree(dst, ignore_errors=True)
    return out


def _child(args: argparse.Namespace) -> None:
    kind = args.child
    result = floor(args.capture, args.threads) if kind == "floor" else conversion(
        args.capture, args.dst, *kind.split(":"), args.threads, args.decode_frames
    )  # fmt: skip
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def _run(kind: str, capture: Path, args: argparse.Namespace, dst: Path) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", kind, "--capture", str(capture), "--threads",
           str(args.threads), "--dst", str(dst), "--decode-frames", str(args.decode_frames)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cameras", type=int, default=4)
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--width", type=int, default=1352)
    parser.add_argument("--height", type=int, default=1014)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--runs", default="images:lz4,images:raw,images:webp,images:png,images:jpeg,rays:webp"
    )
    parser.add_argument("--decode-frames", type=int, default=12)
    parser.add_argument("--out", default=str(ROOT / "results" / "video.json"))
    parser.add_argument("--child", default=None)
    parser.add_argument("--capture", default=None)
    parser.add_argument("--dst", default=None)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    name = f"video-{args.cameras}x{args.frames}-{args.width}x{args.height}"
    start = time.perf_counter()
    capture = make_capture(ROOT / "data" / name, args.cameras, args.frames, args.width, args.height)
    setup = time.perf_counter() - start
    mp4 = sum(p.stat().st_size for p in capture.glob("cam*.mp4")) / (args.cameras * args.frames)
    dst = ROOT / "data" / f"{name}.store"
    report: dict[str, object] = {"capture": name, "threads": args.threads, "setup_s": setup,
                                 "mp4_bytes_per_frame": mp4}  # fmt: skip
    base = _run("floor", capture, args, dst)
    report["floor"] = base
    print(f"floor: {base['frames'] / base['seconds']:.1f} frames/s ({base['cpu_seconds']:.2f} CPU s), "
          f"peak {base['peak_rss_mib']:.0f} MiB")  # fmt: skip
    for kind in args.runs.split(","):
        res = _run(kind, capture, args, dst)
        res["vs_floor"] = base["seconds"] / res["seconds"]
        res["vs_floor_cpu"] = base["cpu_seconds"] / res["cpu_seconds"]
        report[f"convert_{kind.replace(':', '_')}"] = res
        per = (f", {res['bytes_per_frame'] / 1e6:.2f} MB/frame, decode {res['decode_ms']:.1f} ms/frame "
               f"({res.get('decode_cpu_ms', 0):.1f} CPU ms)"
               if "bytes_per_frame" in res else "")  # fmt: skip
        print(f"{kind}: {res['frames'] / res['seconds']:.1f} frames/s ({res['vs_floor']:.2f}x the floor, "
              f"{res['vs_floor_cpu']:.2f}x in CPU), peak {res['peak_rss_mib']:.0f} MiB{per}")  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
