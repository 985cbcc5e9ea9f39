"""Scale benchmark: how raykit's costs grow with the number of photos (1,000-4,000-photo captures).

A capture of N photo-like 1920x1080 JPEGs (quality 90) is generated once and cached outside the
repository (``$RAYKIT_BENCH_CACHE``, default ``~/.cache/raykit/bench_scale``): a large procedural
panorama (multi-octave value noise, colour gradients, textured shapes) of which each photo is a
window at its camera's azimuth and elevation, plus per-photo gain, vignetting and sensor noise, so
the JPEGs compress like photographs (about 0.3-0.6 bytes per pixel at quality 90, recorded as
``jpeg_bytes_per_pixel``). Poses are distinct (a golden-angle orbit on five elevation rings, looking
at the origin) and a COLMAP binary model holds them with ``--points`` sparse points (default 100k),
each observed, at its true projection, in three of the capture's photos.

For each N (``--sizes``, default 250, 1000, 2000; the capture of each N is the first N photos), the
run measures, each in a subprocess of its own (wall, CPU, peak RSS from ``wait4``):

* ``floor``: reading and decoding every photo once on the same cores (Pillow, one process per core);
* ``convert``: ``raykit convert`` to Zarr in the rays and the images layout (WebDataset rays at the
  smallest N): wall, rays/s per core, peak RSS, peak disk used under the output folder (staging
  included) against the final store bytes, bytes per ray / against the JPEG bytes;
* ``info``, ``validate`` and ``validate --deep`` times, beside hashing the store's bytes once
  (SHA-256, one core), each after dropping the page cache where the run may (root);
* loaders at each ``--cache-gb``: ``RayLoader`` on either layout and ``ImageLoader``: time to the
  first batch, steady rays/s (images/s) over ``--loader-seconds``, peak RSS; and a plain per-item
  PIL ``DataLoader`` over the same JPEGs with the same workers (``ImageLoader``'s baseline);
* ``train``: ``raykit train`` for ``--train-minutes`` on the largest N: rays/s, loader-wait fraction,
  peak RSS.

Per-photo costs (each figure over N) and their growth from the smallest to the largest N are in
``growth``; a log-log plot of each figure against N goes beside the JSON. Free disk is checked
first: sizes that do not fit are dropped with a message.

    python benchmarks/bench_scale.py                                  # the full benchmark (hours)
    python benchmarks/bench_scale.py --sizes 250 --train-minutes 0    # one size, no training
    python benchmarks/bench_scale.py --sizes 8,16 --width 320 --height 180 --points 2000 \\
        --loader-seconds 2 --train-minutes 0 --cache-gb 0.25 --out scale-smoke.json   # a smoke run

Results go to ``benchmarks/results/scale.json`` (and ``scale.png``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
from machine import command_line, describe
from PIL import Image, ImageDraw

RESULTS = Path(__file__).resolve().parent / "results"
RINGS_DEG = (5.0, 15.0, 25.0, 35.0, 45.0)
RADIUS = 4.0
TRACK = 3  # observations per sparse point


# ----------------------------------------------------------------------------------------------- capture
def panorama(seed: int, width: int, height: int) -> np.ndarray:
    """(height, width, 3) uint8 photo-like texture: noise octaves, gradients and textured shapes."""
    rng = np.random.default_rng(seed)
    img = np.zeros((height, width, 3), np.float32)
    for octave in range(1, 11):  # equal weights down to 2-pixel cells: detail at every scale, as photos
        cells = (max(2, height >> (11 - octave)), max(2, width >> (11 - octave)))
        grid = rng.random((*cells, 3), dtype=np.float32)
        layer = Image.fromarray((grid * 255).astype(np.uint8)).resize((width, height), Image.BICUBIC)
        img += np.asarray(layer, np.float32)
    detail = (img - img.mean()) / img.std() * 50.0
    rows = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    img = detail + 110.0 + 60.0 * rows * np.array([0.4, 0.6, 1.0], np.float32)
    canvas = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    for _ in range(width * height // 40000):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        r = int(rng.integers(8, max(9, height // 6)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x - r, y - r // 2, x + r, y + r // 2), fill=colour, outline=(20, 20, 20), width=2)
    textured = np.asarray(canvas, np.float32) + 0.6 * detail  # shapes with surface texture, not flat
    return np.clip(textured, 0, 255).astype(np.uint8)


def orbit(n: int) -> np.ndarray:
    """(n, 4, 4) float64 OpenCV camera-to-world poses: golden-angle azimuths on five rings."""
    poses = np.zeros((n, 4, 4))
    for i in range(n):
        azimuth = math.radians((i * 137.50776405) % 360.0)
        elevation = math.radians(RINGS_DEG[i % len(RINGS_DEG)])
        eye = RADIUS * np.array(
            [
                math.cos(elevation) * math.cos(azimuth),
                math.cos(elevation) * math.sin(azimuth),
                math.sin(elevation),
            ]
        )
        forward = -eye / np.linalg.norm(eye)
        right = np.cross(forward, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        down = np.cross(forward, right)
        poses[i, :3, :3] = np.stack([right, down, forward], axis=1)
        poses[i, :3, 3] = eye
        poses[i, 3, 3] = 1.0
    return poses


def _photo_job(args: tuple[Path, int, int, int, int, int]) -> int:
    """Write photo ``i`` (a window of the panorama with gain, vignetting and noise); returns its bytes."""
    root, i, width, height, quality, seed = args
    out = root / "photos" / f"{i:05d}.jpg"
    if out.exists():
        return out.stat().st_size
    pano = np.load(root / "panorama.npy", mmap_mode="r")
    ph, pw = pano.shape[:2]
    azimuth = (i * 137.50776405) % 360.0
    x0 = int(azimuth / 360.0 * pw)
    y0 = int((i % len(RINGS_DEG)) / (len(RINGS_DEG) - 1) * (ph - height))
    cols = (np.arange(width) + x0) % pw
    window = np.asarray(pano[y0 : y0 + height][:, cols], np.float32)
    rng = np.random.default_rng([seed, i])
    yy, xx = np.mgrid[-1 : 1 : height * 1j, -1 : 1 : width * 1j].astype(np.float32)
    vignette = 1.0 - 0.25 * (xx * xx + yy * yy)
    gain = rng.uniform(0.85, 1.15, 3).astype(np.float32)
    pixels = window * vignette[..., None] * gain + rng.standard_normal(window.shape, dtype=np.float32) * 3.0
    tmp = out.with_suffix(".tmp")
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(tmp, "JPEG", quality=quality)
    tmp.rename(out)
    return out.stat().st_size


def generate_photos(
    root: Path, n: int, width: int, height: int, quality: int, seed: int, cores: int
) -> float:
    """The first ``n`` photos under ``root/photos`` (made where missing); returns the seconds it took."""
    t0 = time.perf_counter()
    (root / "photos").mkdir(parents=True, exist_ok=True)
    if not (root / "panorama.npy").exists():
        np.save(root / "panorama.tmp.npy", panorama(seed, 4 * width, int(1.5 * height)))
        (root / "panorama.tmp.npy").rename(root / "panorama.npy")
    jobs = [(root, i, width, height, quality, seed) for i in range(n)]
    with Pool(cores) as pool:
        for k, _ in enumerate(pool.imap_unordered(_photo_job, jobs, chunksize=4), 1):
            progress_line("generate", k, n)
    return time.perf_counter() - t0


def write_colmap(
    capture: Path, photos: Path, n: int, width: int, height: int, points: int, seed: int
) -> None:
    """``capture/images`` (hard links to the first ``n`` photos) and ``capture/sparse/0``."""
    from raykit.colmap_io import ColmapCamera, ColmapImage, ColmapPoint3D, Reconstruction, write_model
    from raykit.conventions import colmap_from_c2w

    (capture / "images").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        link = capture / "images" / f"{i:05d}.jpg"
        if not link.exists():
            os.link(photos / f"{i:05d}.jpg", link)
    focal = 0.5 * width / math.tan(math.radians(32.5))
    camera = ColmapCamera(1, "PINHOLE", width, height, (focal, focal, width / 2, height / 2))
    c2w = orbit(n)
    rng = np.random.default_rng(seed)
    xyz = rng.uniform(-1.0, 1.0, (points, 3)) * 0.8
    seen = np.stack([rng.choice(n, TRACK, replace=n < TRACK) for _ in range(points)]) + 1 if n else None
    obs: list[list[tuple[float, float, int]]] = [[] for _ in range(n)]
    tracks = []
    for p in range(points):
        track = []
        for image_id in seen[p]:
            w2c = np.linalg.inv(c2w[image_id - 1])
            cam = w2c[:3, :3] @ xyz[p] + w2c[:3, 3]
            uv = (focal * cam[0] / cam[2] + width / 2, focal * cam[1] / cam[2] + height / 2)
            track.append((image_id, len(obs[image_id - 1])))
            obs[image_id - 1].append((*uv, p + 1))
        tracks.append(np.asarray(track, np.int64))
    images = {}
    for i in range(n):
        qvec, tvec = colmap_from_c2w(c2w[i])
        o = np.asarray(obs[i], np.float64).reshape(-1, 3)
        images[i + 1] = ColmapImage(
            i + 1, tuple(qvec), tuple(tvec), 1, f"{i:05d}.jpg", o[:, :2].copy(), o[:, 2].astype(np.int64)
        )
    colours = rng.integers(0, 256, (points, 3))
    pts = {
        p + 1: ColmapPoint3D(p + 1, tuple(xyz[p]), tuple(int(c) for c in colours[p]), 0.5, tracks[p])
        for p in range(points)
    }
    write_model(Reconstruction({1: camera}, images, pts, {}, {}), capture / "sparse" / "0", binary=True)


# ------------------------------------------------------------------------------------------- measuring
_LAST_LINE = [0.0]


def progress_line(what: str, done: int, total: int) -> None:
    """A progress line: in place on a terminal, else one line every 10 s (a log stays readable)."""
    now = time.monotonic()
    if sys.stderr.isatty():
        print(f"\r{what}: {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)
    elif done == total or now - _LAST_LINE[0] >= 10.0:
        _LAST_LINE[0] = now
        print(f"{what}: {done}/{total}", file=sys.stderr, flush=True)


def tree_bytes(path: Path, allocated: bool = False) -> int:
    """Bytes of the files under ``path``: their sizes, or (``allocated``) the disk blocks they hold,
    which is what a staging file whose consumed runs were freed (punched holes) still takes."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a staging file removed meanwhile
                st = os.lstat(os.path.join(dirpath, name))
                total += st.st_blocks * 512 if allocated else st.st_size
    return total


def _own_peak_rss(pid: int) -> int:
    """``VmHWM`` of process ``pid``: its own address space's high-water mark (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_measured(
    cmd: list[str], watch: Path | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``cmd``; wall and CPU seconds, peak RSS, peak bytes under ``watch``, stdout.

    Peak RSS is the child's own ``VmHWM``, read every 0.1 s while it runs (the mark only grows, so
    the last reading is the peak but for the last 0.1 s). ``wait4``'s ``ru_maxrss`` is kept beside it
    as ``ru_maxrss_mb``: on Linux it starts from this driver's own high-water mark at the ``exec``.
    """
    peak, hwm = [0], [0]
    done = threading.Event()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    def poll() -> None:
        ticks = 0
        while not done.wait(0.1):
            hwm[0] = max(hwm[0], _own_peak_rss(proc.pid))
            ticks += 1
            if watch and ticks % 5 == 0:  # the staging disk every 0.5 s (a walk of the store's files)
                peak[0] = max(peak[0], tree_bytes(watch, allocated=True))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    poller.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {err.decode()[-2000:]}")
    result = {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": (hwm[0] or usage.ru_maxrss * 1024) / 2**20,
        "ru_maxrss_mb": usage.ru_maxrss / 1024,
        "stdout": out.decode(),
    }
    if watch is not None:
        result["peak_disk_bytes"] = max(peak[0], tree_bytes(watch, allocated=True))
    return result


def _decode(path: str) -> int:
    with Image.open(path) as img:
        return int(np.asarray(img.convert("RGB")).shape[0])


def decode_floor(files: list[Path], cores: int, pixels: int) -> dict[str, Any]:
    """Read and decode every photo once, one process per core: the conversion's floor."""
    t0 = time.perf_counter()
    with Pool(cores) as pool:
        for _ in pool.imap_unordered(_decode, [str(f) for f in files], chunksize=8):
            pass
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "rays_per_s": pixels / wall, "rays_per_s_per_core": pixels / wall / cores}


def cold_store(store: Path) -> bool:
    """Evict the store's files from the page cache (each synced, then ``posix_fadvise(DONTNEED)``), so
    the next read of them comes from the disk, while Python and raykit's own files stay cached, as
    they are when a user runs a command; whether every file could be evicted."""
    done = True
    for dirpath, _, names in os.walk(store):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                done = False
            finally:
                os.close(fd)
    return done


def hash_floor(store: Path) -> dict[str, Any]:
    """SHA-256 of every byte of the store once, on one core."""
    t0, total = time.perf_counter(), 0
    for dirpath, _, names in os.walk(store):
        for name in names:
            digest = hashlib.sha256()
            with open(os.path.join(dirpath, name), "rb") as f:
                while chunk := f.read(8 << 20):
                    digest.update(chunk)
                    total += len(chunk)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "bytes": total, "mb_per_s": total / wall / 1e6}


def raykit(*args: str) -> list[str]:
    return [sys.executable, "-m", "raykit", *args]


# ----------------------------------------------------------------------------------------- loader child
def loader_child(spec: dict[str, Any]) -> None:
    """In a subprocess: build the loader ``spec`` names, time its first batch and its steady rate."""
    import torch

    t0 = time.perf_counter()
    kind, seconds = spec["kind"], spec["seconds"]
    if kind == "pil":
        batches = _pil_batches(spec)
    elif kind == "images":
        from raykit.loaders import ImageLoader

        batches = iter(
            ImageLoader(
                spec["store"], batch_size=1, cache_bytes=spec["cache_bytes"], num_workers=spec["workers"]
            )
        )
    else:
        from raykit.loaders import RayLoader

        batches = iter(
            RayLoader(spec["store"], batch_size=spec["batch_size"], cache_bytes=spec["cache_bytes"])
        )
    first = next(batches)
    first_s = time.perf_counter() - t0
    rays = items = 0
    t1 = time.perf_counter()
    for batch in batches:
        items += 1
        rays += _rays_in(batch, torch)
        if time.perf_counter() - t1 >= seconds:
            break
    wall = time.perf_counter() - t1
    del first
    print(json.dumps({"first_batch_s": first_s, "rays_per_s": rays / wall, "items_per_s": items / wall}))


def _rays_in(batch: Any, torch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.numel() // batch.shape[-1])  # (H, W, 3) images, (B, H, W, 3), (N, 3) rays
    for name in ("images", "rgb", "pixels"):
        value = batch.get(name) if isinstance(batch, dict) else getattr(batch, name, None)
        if value is not None:
            return int(value.numel() // value.shape[-1])
    raise TypeError(f"cannot count the rays of a {type(batch).__name__}")


class _PilPhotos:
    """The baseline: a map-style dataset that opens and decodes one JPEG per item with PIL and serves
    it as ``ImageLoader`` does, (H, W, 3) float32 in [0, 1] (the plain way: ``.float() / 255``)."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        import torch

        with Image.open(self.files[i]) as img:
            return torch.from_numpy(np.asarray(img.convert("RGB"))).float() / 255.0


def _pil_batches(spec: dict[str, Any]) -> Any:
    import torch

    files = sorted(str(p) for p in Path(spec["images"]).glob("*.jpg"))
    loader = torch.utils.data.DataLoader(
        _PilPhotos(files),
        batch_size=None,
        shuffle=True,
        num_workers=spec["workers"],
        generator=torch.Generator().manual_seed(0),
    )
    while True:
        yield from loader


def measure_loader(spec: dict[str, Any]) -> dict[str, Any]:
    run = run_measured([sys.executable, __file__, "--child", json.dumps(spec)])
    return {**json.loads(run.pop("stdout").strip().splitlines()[-1]), **run}


# ------------------------------------------------------------------------------------------------- a size
def measure_size(args: argparse.Namespace, root: Path, work: Path, n: int, wds: bool) -> dict[str, Any]:
    capture = root / "captures" / str(n)
    if not (capture / "sparse" / "0" / "points3D.bin").exists():
        write_colmap(capture, root / "photos", n, args.width, args.height, args.points, args.seed)
    files = sorted((capture / "images").glob("*.jpg"))
    pixels = n * args.width * args.height
    jpeg_bytes = sum(f.stat().st_size for f in files)
    out: dict[str, Any] = {
        "n": n,
        "rays": pixels,
        "jpeg_bytes": jpeg_bytes,
        "jpeg_bytes_per_pixel": jpeg_bytes / pixels,
        "floor": decode_floor(files, args.cores, pixels),
    }
    layouts = [("rays", "zarr"), ("images", "zarr")] + ([("rays", "wds")] if wds else [])
    if args.only_convert:
        layouts = [("rays", "zarr")]
    for layout, backend in layouts:
        name = f"{layout}-{backend}"
        folder = work / f"{n}-{name}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        store = folder / "scene"
        print(f"N={n}: convert {name}", file=sys.stderr, flush=True)
        run = run_measured(
            raykit(
                "convert", str(capture), str(store), "--format", backend, "--layout", layout, "--no-progress",
                *(["--profile"] if args.only_convert else []),
            ),
            watch=folder,
        )  # fmt: skip
        stdout = run.pop("stdout")
        store_bytes = tree_bytes(store)
        entry = {
            **run,
            "store_bytes": store_bytes,
            "bytes_per_ray": store_bytes / pixels,
            "store_to_jpeg": store_bytes / jpeg_bytes,
            "staging_to_store": run["peak_disk_bytes"] / store_bytes,
            "rays_per_s_per_core": pixels / run["wall_s"] / args.cores,
            "to_floor": out["floor"]["wall_s"] / run["wall_s"],
        }
        if args.only_convert:  # the conversion's phases (``--profile``), then the next size
            out[name] = {**entry, "profile": stdout.splitlines()}
            if not args.keep_stores:
                shutil.rmtree(folder, ignore_errors=True)
            continue
        entry["info_s"] = run_measured(raykit("info", str(store)))["wall_s"]
        # Each of the three reads the store from the disk (its files evicted from the page cache;
        # Python's stay cached): the same start for all three.
        cold = cold_store(store)
        entry["validate"] = {
            k: v for k, v in run_measured(raykit("validate", str(store))).items() if k != "stdout"
        }
        cold_store(store)
        entry["validate_deep"] = {
            k: v for k, v in run_measured(raykit("validate", "--deep", str(store))).items() if k != "stdout"
        }
        cold_store(store)
        entry["hash_floor"] = {**hash_floor(store), "cold_store": cold}
        entry["validate_to_hash"] = entry["hash_floor"]["wall_s"] / entry["validate"]["wall_s"]
        if backend == "zarr":
            entry["loaders"] = measure_loaders(args, store, layout, capture)
        out[name] = entry
        if layout == "rays" and backend == "zarr" and n == max(args.sizes) and args.train_minutes > 0:
            out["train"] = measure_train(args, store, folder)
        if not args.keep_stores:
            shutil.rmtree(folder, ignore_errors=True)
    return out


def measure_loaders(args: argparse.Namespace, store: Path, layout: str, capture: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for gb in args.cache_gb:
        base = {"store": str(store), "seconds": args.loader_seconds, "cache_bytes": int(gb * 2**30)}
        print(f"  loaders at {gb} GB ({layout})", file=sys.stderr, flush=True)
        result[f"ray_loader_{gb}gb"] = measure_loader({**base, "kind": "rays", "batch_size": 4096})
        if layout == "images":
            workers = args.image_workers
            result[f"image_loader_{gb}gb"] = measure_loader({**base, "kind": "images", "workers": workers})
    if layout == "images":
        pil = {
            "kind": "pil",
            "images": str(capture / "images"),
            "seconds": args.loader_seconds,
            "workers": args.image_workers,
        }
        result["pil_dataloader"] = measure_loader(pil)
    return result


def measure_train(args: argparse.Namespace, store: Path, folder: Path) -> dict[str, Any]:
    run_dir = folder / "run"
    seconds = args.train_minutes * 60
    print(f"  train {args.train_minutes} min", file=sys.stderr, flush=True)
    run = run_measured(
        raykit(
            "train",
            str(store),
            "--out",
            str(run_dir),
            "--max-seconds",
            str(seconds),
            "--steps",
            "100000000",
            "--no-progress",
            "--eval-max-images",
            "1",
        )
    )
    run.pop("stdout")
    logs = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in logs if "rays_per_s" in r]
    wait = [r["loader_wait_fraction"] for r in steps]
    return {
        **run,
        "rays_per_s": float(np.median([r["rays_per_s"] for r in steps])) if steps else None,
        "loader_wait_fraction": float(np.mean(wait)) if wait else None,
    }


# ------------------------------------------------------------------------------------------------ summary
GROWTH_FIGURES = {
    "convert rays (s/photo)": ("rays-zarr", "wall_s"),
    "convert images (s/photo)": ("images-zarr", "wall_s"),
    "rays store (bytes/photo)": ("rays-zarr", "store_bytes"),
    "images store (bytes/photo)": ("images-zarr", "store_bytes"),
    "validate rays (s/photo)": ("rays-zarr", "validate", "wall_s"),
    "validate images (s/photo)": ("images-zarr", "validate", "wall_s"),
    "convert rays peak RSS (MB/photo)": ("rays-zarr", "peak_rss_mb"),
}


def dig(d: dict[str, Any], path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return float(d)  # type: ignore[arg-type]


def growth(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-photo cost of each figure at every N, and its growth from the smallest N to the largest."""
    result = {}
    for label, path in GROWTH_FIGURES.items():
        per = {s["n"]: v / s["n"] for s in sizes if (v := dig(s, path)) is not None}
        if len(per) >= 2:
            lo, hi = min(per), max(per)
            result[label] = {"per_photo": per, "growth": per[hi] / per[lo]}
    return result


def plot(sizes: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for label, key in GROWTH_FIGURES.items():
        pts = [(s["n"], v) for s in sizes if (v := dig(s, key)) is not None]
        if pts:
            ax.loglog(*zip(*pts, strict=True), marker="o", label=label.split(" (")[0])
    ax.set_xlabel("photos (N)")
    ax.set_ylabel("figure (its own unit)")
    ax.set_title("raykit costs against the number of photos (log-log; slope 1 = linear)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def check_disk(args: argparse.Namespace, work: Path) -> list[int]:
    """The sizes whose capture, stores and staging fit in the free disk (largest dropped first)."""
    free = shutil.disk_usage(work).free
    per_photo = args.width * args.height * (0.6 + 4.0 + 2.0)  # JPEG + rays staging + the images store, about
    kept = [n for n in args.sizes if n * per_photo * 1.2 < free]
    for n in sorted(set(args.sizes) - set(kept)):
        print(
            f"N={n} dropped: needs about {n * per_photo / 1e9:.0f} GB, {free / 1e9:.0f} GB free",
            file=sys.stderr,
        )
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[250, 1000, 2000])
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--cache-gb", type=lambda s: [float(x) for x in s.split(",")], default=[2.0, 8.0])
    parser.add_argument("--loader-seconds", type=float, default=20.0)
    parser.add_argument("--image-workers", type=int, default=2)
    parser.add_argument("--train-minutes", type=float, default=10.0)
    parser.add_argument("--keep-stores", action="store_true")
    parser.add_argument(
        "--only-convert", action="store_true", help="only the rays-layout Zarr conversion, with its phases"
    )
    parser.add_argument("--work", type=Path, default=None, help="stores go here (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return loader_child(json.loads(args.child))
    cache = Path(os.environ.get("RAYKIT_BENCH_CACHE", Path.home() / ".cache" / "raykit" / "bench_scale"))
    root = cache / f"{args.width}x{args.height}-q{args.quality}-s{args.seed}"
    work = args.work or Path(tempfile.mkdtemp(prefix="raykit-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    args.sizes = check_disk(args, work)
    if not args.sizes:
        sys.exit("bench_scale: no size fits in the free disk")
    gen_s = generate_photos(
        root, max(args.sizes), args.width, args.height, args.quality, args.seed, args.cores
    )
    sizes = []
    for n in sorted(args.sizes):
        sizes.append(measure_size(args, root, work, n, wds=n == min(args.sizes)))
        report = {
            "command": command_line(),
            "machine": describe(),
            "generate_s": gen_s,
            "sizes": sizes,
            "growth": growth(sizes),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(sizes, args.out.with_suffix(".png"))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report["growth"], indent=2))


if __name__ == "__main__":
    main()
