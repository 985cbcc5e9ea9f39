"""Scale benchmark, nerfstudio side (issue 29): the memory nerfstudio's own datamanagers need as the
capture grows, beside raykit's nerfstudio datamanagers on the same capture.

The capture is ``bench_scale.py``'s: its generated 1920x1080 JPEGs (quality 90, cached under
``$RAYKIT_BENCH_CACHE``, default ``~/.cache/raykit/bench_scale``; made there where missing) and, for each
N of ``--sizes`` (the first N photos), a COLMAP folder (``images/`` hard links, ``sparse/0`` binary, with
``--points`` sparse points) written by ``bench_scale.write_colmap`` under ``--work`` (outside the
repository), converted there by ``raykit.converters.convert`` to a rays-layout and an images-layout store
for the raykit cases. Every (case, N) runs in a fresh subprocess, on the CPU (``device="cpu"``), which
builds the datamanager (``config.setup``), takes ``next_train(0)``, then up to ``--steps`` batches (at most
``--steady-seconds``). Cases (nerfstudio's with the settings a user gets; both splits hold out every 8th
photo):

* ``vanilla``: ``VanillaDataManager`` (nerfacto's ray datamanager contract), ``ColmapDataParser``
  (``colmap_path="sparse/0"``, ``downscale_factor=1``: full resolution, no downscaled copies written),
  ``train_num_rays_per_batch`` ``--rays`` (nerfacto's 4096); its ``CacheDataloader`` decodes every train
  and eval image as float32 at setup;
* ``full-image-uint8`` / ``full-image-float32``: ``FullImageDatamanager`` (splatfacto's; uint8 is
  splatfacto's setting), same parser, ``cache_images="gpu"`` on the CPU device (``"cpu"`` pins memory,
  which needs CUDA; as ``bench_integrations.py``); it caches every train image at the first batch;
* ``raykit-rays`` / ``raykit-images-uint8`` / ``raykit-images-float32``: ``RaykitDataManager`` on the
  rays store and ``RaykitImageDataManager`` on the images store, with ``bench_integrations.py``'s budgets
  (a cache that holds the train split: 4 bytes per ray / the split as served, + 64 MB);
* ``raykit-rays-default`` / ``raykit-images-uint8-default``: the same with the datamanagers' default
  budgets (512 MB; 2 GB, uint8), what ``raykit-nerfacto`` / ``raykit-splatfacto`` run with.

Per run: setup seconds, ``next_train(0)`` seconds, steady batches/s, and peak RSS three ways: the
largest ``VmRSS`` of the child and its descendants sampled by this driver every 0.1 s, the child's own
``VmHWM``, and ``ru_maxrss`` from ``wait4``. A child whose RSS passes ``--rss-cap-gb`` is killed
(``"failed": "killed at X GB RSS (cap)"``); one that dies keeps its error tail. Sizes go up in order and
a case stops after a failure or once its linear fit predicts more than the cap at the next N
(``--run-to-failure``: only a failure stops it). Per case, RSS = a + b*N is fitted by least squares over
the measured N and predicted at 1,000, 2,000 and 4,000 photos (``"extrapolated": true``); for the
``-default`` cases, whose budget is fixed, over the N where the budget is full. ``RayLoader``'s chunk
cache fills as it reads, so the raykit ray cases draw batches until it is 95 % full or an epoch is drawn
(at most ``--fill-seconds``); a run stopped before is a lower bound (``"filled": false``), left out of
the fit. ``--summarize`` redoes a result file's fits from its runs; ``--markdown`` prints its tables.

    python benchmarks/bench_scale_nerfstudio.py                               # 25, 50, 100, 250 photos
    python benchmarks/bench_scale_nerfstudio.py --sizes 25,50,100,250,500,1000 --rss-cap-gb 9.5 \\
        --run-to-failure                                                      # the recorded run (20 min)
    python benchmarks/bench_scale_nerfstudio.py --sizes 4,8 --width 320 --height 180 --points 2000 \\
        --out scale-ns-smoke.json                                             # a smoke run (seconds)
    python benchmarks/bench_scale_nerfstudio.py --markdown benchmarks/results/scale_nerfstudio.json
    python benchmarks/bench_scale_nerfstudio.py --summarize benchmarks/results/scale_nerfstudio.json

Results go to ``benchmarks/results/scale_nerfstudio.json``; the tables are printed (markdown).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import machine  # noqa: E402

RESULTS = HERE / "results"
MARK = "@@bench "  # the child's result lines (nerfstudio prints its own lines to stdout too)
NERFSTUDIO = ("vanilla", "full-image-uint8", "full-image-float32")
RAYKIT = (
    "raykit-rays",
    "raykit-images-uint8",
    "raykit-images-float32",
    "raykit-rays-default",
    "raykit-images-uint8-default",
)
CASES = NERFSTUDIO + RAYKIT
RAY_CASES = ("vanilla", "raykit-rays", "raykit-rays-default")
PREDICT_AT = (1000, 2000, 4000)
SLACK = 64 << 20  # bench_integrations' budgets: the split + 64 MB


def store_for(case: str) -> str | None:
    """Which raykit store a case reads (None: nerfstudio's, from the COLMAP folder)."""
    if case.startswith("raykit-rays"):
        return "rays"
    if case.startswith("raykit-images"):
        return "images"
    return None


# ------------------------------------------------------------------------------------------- children
def emit(**fields: Any) -> None:
    print(MARK + json.dumps(fields), flush=True)


def prepare_child(spec: dict[str, Any]) -> None:
    """The COLMAP folder of N photos and the stores ``spec["stores"]`` names (each made once)."""
    import bench_scale

    root, capture, n = Path(spec["root"]), Path(spec["capture"]), spec["n"]
    w, h = spec["width"], spec["height"]
    out: dict[str, Any] = {}
    if not all((root / "photos" / f"{i:05d}.jpg").exists() for i in range(n)):
        cores = len(os.sched_getaffinity(0))
        out["generate_s"] = bench_scale.generate_photos(root, n, w, h, spec["quality"], spec["seed"], cores)
    if not (capture / "sparse" / "0" / "points3D.bin").exists():
        t0 = time.perf_counter()
        shutil.rmtree(capture, ignore_errors=True)
        bench_scale.write_colmap(capture, root / "photos", n, w, h, spec["points"], spec["seed"])
        out["write_colmap_s"] = time.perf_counter() - t0
    from raykit.converters import convert

    for layout, path in spec["stores"].items():
        done = Path(path + ".done")  # beside the store, not in it: converted to the end
        if done.exists():
            continue
        shutil.rmtree(path, ignore_errors=True)
        t0 = time.perf_counter()
        convert(capture, path, layout=layout)
        out[f"convert_{layout}_s"] = time.perf_counter() - t0
        out[f"store_{layout}_bytes"] = bench_scale.tree_bytes(Path(path))
        done.touch()
    emit(stage="prepared", **out)


def build(case: str, spec: dict[str, Any]) -> tuple[Any, int | None]:
    """The case's datamanager on the CPU (``config.setup``) and its cache budget (None: nerfstudio's)."""
    from nerfstudio.data.datamanagers.base_datamanager import VanillaDataManagerConfig
    from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig
    from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig

    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
    from raykit.integrations.nerfstudio.image_datamanager import RaykitImageDataManagerConfig
    from raykit.integrations.nerfstudio.ray_datamanager import RaykitDataManagerConfig
    from raykit.store import open_store

    colmap = ColmapDataParserConfig(
        data=Path(spec["capture"]),
        colmap_path=Path("sparse/0"),
        images_path=Path("images"),
        downscale_factor=1,
    )
    if case == "vanilla":
        config = VanillaDataManagerConfig(dataparser=colmap, train_num_rays_per_batch=spec["rays"])
        return config.setup(device="cpu"), None
    if case.startswith("full-image"):  # "gpu" caching on the cpu device: "cpu" pins memory, which needs CUDA
        kind = case.rsplit("-", 1)[1]
        config = FullImageDatamanagerConfig(dataparser=colmap, cache_images="gpu", cache_images_type=kind)
        return config.setup(device="cpu"), None
    parser = RaykitDataParserConfig(data=Path(spec["store"]))
    train_pixels = open_store(spec["store"]).splits["train"].n_rays
    if case.startswith("raykit-rays"):
        cache = RaykitDataManagerConfig.cache_bytes if case.endswith("default") else train_pixels * 4 + SLACK
        config = RaykitDataManagerConfig(
            dataparser=parser, train_num_rays_per_batch=spec["rays"], cache_bytes=cache
        )
        return config.setup(device="cpu"), cache
    kind = "uint8" if "uint8" in case else "float32"
    served = train_pixels * 3 * (1 if kind == "uint8" else 4)
    cache = RaykitImageDataManagerConfig.cache_bytes if case.endswith("default") else served + SLACK
    config = RaykitImageDataManagerConfig(dataparser=parser, cache_bytes=cache, cache_images_type=kind)
    return config.setup(device="cpu"), cache


def fill(manager: Any, spec: dict[str, Any], served: int) -> None:
    """Draw batches until ``RayLoader``'s chunk cache is full (95 %) or an epoch is drawn, at most
    ``spec["fill_seconds"]``: its cache fills as chunks are read, so the first batches show little of
    it (nerfstudio's and the image datamanagers hold what they cache from setup or the first batch)."""
    cache = manager.train_loader.cache
    n_rays = manager.dataparser.store.splits[manager.train_loader.split].n_rays
    t0, step = time.perf_counter(), 0
    stats = cache.stats()
    while time.perf_counter() - t0 < spec["fill_seconds"]:
        for _ in range(200):
            step += 1
            manager.next_train(step)
        served += 200 * spec["rays"]
        stats = cache.stats()
        if stats.bytes >= 0.95 * stats.capacity or served >= n_rays:
            break
    emit(
        stage="filled",
        fill_s=time.perf_counter() - t0,
        epoch_fraction=served / n_rays,
        cache_used_bytes=stats.bytes,
        filled=stats.bytes >= 0.95 * stats.capacity or served >= n_rays,
        rss=machine.rss(),
        peak_rss=machine.peak_rss(),
    )


def case_child(spec: dict[str, Any]) -> None:
    """One (case, N) in this process: setup, first batch, steady batches; a line after each stage."""
    # imports before the baseline
    import nerfstudio.data.datamanagers.base_datamanager
    import nerfstudio.data.datamanagers.full_images_datamanager
    import nerfstudio.data.dataparsers.colmap_dataparser  # noqa: F401

    import raykit.integrations.nerfstudio.image_datamanager
    import raykit.integrations.nerfstudio.ray_datamanager  # noqa: F401

    case = spec["case"]
    emit(stage="imported", rss=machine.rss())
    t0 = time.perf_counter()
    manager, cache = build(case, spec)
    setup_s = time.perf_counter() - t0
    emit(stage="setup", setup_s=setup_s, rss=machine.rss(), peak_rss=machine.peak_rss(), cache_bytes=cache)
    t1 = time.perf_counter()
    manager.next_train(0)
    first_s = time.perf_counter() - t1
    emit(stage="first", first_batch_s=first_s, rss=machine.rss(), peak_rss=machine.peak_rss())
    t2, steps = time.perf_counter(), 0
    while steps < spec["steps"] and time.perf_counter() - t2 < spec["seconds"]:
        steps += 1
        manager.next_train(steps)
    seconds = time.perf_counter() - t2
    rays = spec["rays"] if case in RAY_CASES else int(manager.get_train_rays_per_batch())
    if case in RAY_CASES and case != "vanilla":
        fill(manager, spec, served=(steps + 1) * rays)
    emit(
        stage="done",
        steps=steps,
        steady_s=seconds,
        batches_per_s=steps / seconds,
        rays_per_s=steps * rays / seconds,
        train_images=len(manager.train_dataset),
        rss=machine.rss(),
        peak_rss=machine.peak_rss(),
        loadavg_1m=os.getloadavg()[0],
    )


# -------------------------------------------------------------------------------------------- driver
def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (through ``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as handle:
                    todo.extend(int(c) for c in handle.read().split())
        except OSError:
            pass
    return out


def run_capped(spec: dict[str, Any], cap: int, timeout_s: float) -> dict[str, Any]:
    """Run a child on ``spec``, killing it (its whole session) past ``cap`` resident bytes or the timeout.

    Peak RSS: the largest sum of ``VmRSS`` over the child and its descendants, read every 0.1 s
    (``peak_rss_sampled``), the child's own ``VmHWM`` at its last reading (``vmhwm``) and ``wait4``'s
    ``ru_maxrss`` (on Linux it starts from the RSS this driver had when it forked: this driver imports
    no torch, so that is small).
    """
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    events: list[dict[str, Any]] = []
    tail: collections.deque[str] = collections.deque(maxlen=60)

    errors: list[str] = []

    def read_stdout() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith(MARK):
                event = json.loads(line[len(MARK) :])
                if "error" in event:
                    errors.append(event["error"])
                else:
                    events.append({**event, "t": time.perf_counter() - t0})
            else:
                tail.append(line.rstrip())

    def read_stderr() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            tail.append(line.rstrip())

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
    for r in readers:
        r.start()
    peak = hwm = 0
    killed = None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        rss = sum(_status_kb(p, "VmRSS:") for p in _tree(proc.pid))
        peak, hwm = max(peak, rss), max(hwm, _status_kb(proc.pid, "VmHWM:"))
        elapsed = time.perf_counter() - t0
        if killed is None and (rss > cap or elapsed > timeout_s):
            why = f"{rss / 1e9:.2f} GB RSS (cap)" if rss > cap else f"{elapsed:.0f} s (timeout)"
            killed = f"killed at {why}"
            os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and its descendants only
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    for r in readers:
        r.join(timeout=5)
    out: dict[str, Any] = {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_sampled": peak,
        "vmhwm": hwm,
        "ru_maxrss": usage.ru_maxrss * 1024,
        "returncode": proc.returncode,
        "events": events,
    }
    out["peak_rss"] = max(peak, hwm, *(e.get("peak_rss", 0) for e in events))
    if killed:
        out["failed"] = killed
        out["failed_after_s"] = wall
        out["last_stage"] = events[-1]["stage"] if events else "start"
    elif proc.returncode != 0:
        signalled = f"died of signal {-proc.returncode}" if proc.returncode < 0 else ""
        out["failed"] = errors[-1] if errors else signalled or f"exited {proc.returncode}"
        out["failed_after_s"] = wall
        out["last_stage"] = events[-1]["stage"] if events else "start"
        out["error_tail"] = "\n".join(list(tail)[-25:])
    return out


def scrub(value: Any) -> Any:
    """``value`` (a report, recursively) without this machine's paths: the repository's become relative,
    installed packages' ``site-packages/...``, the standard library's ``lib/python/...``, the home ``~``."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if not isinstance(value, str):
        return value
    value = re.sub(r"/[^\s\"']*/site-packages/", "site-packages/", value)
    value = re.sub(r"/[^\s\"']*/lib/python3\.\d+/", "lib/python/", value)
    return value.replace(str(machine.REPO) + "/", "").replace(str(Path.home()), "~")


def fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """Least-squares ``a + b*N`` over ``(N, bytes)`` points (None under two distinct N)."""
    if len({n for n, _ in points}) < 2:
        return None
    k = len(points)
    mn = sum(n for n, _ in points) / k
    my = sum(y for _, y in points) / k
    b = sum((n - mn) * (y - my) for n, y in points) / sum((n - mn) ** 2 for n, _ in points)
    return my - b * mn, b


def steady(run: dict[str, Any]) -> bool:
    """A run that measured the datamanager as it stays: finished, its cache filled where it fills."""
    return run.get("measured", False) and run.get("filled", True)


def budget_binds(run: dict[str, Any], pixels_per_photo: int) -> bool:
    """The run's fixed cache budget is full: the chunk cache at 95 %, or a split larger than the image
    cache (as served, uint8)."""
    if "cache_used_bytes" in run:
        return run["cache_used_bytes"] >= 0.95 * run["cache_bytes"]
    return run.get("train_images", 0) * pixels_per_photo * 3 > run["cache_bytes"]


def summarize(case: str, runs: list[dict[str, Any]], cap: int, pixels_per_photo: int) -> dict[str, Any]:
    """The case's fit, predictions and how far it was measured.

    The fit is over every steady run; for the cases with a fixed budget (``-default``), over the runs
    where the budget is full when there are two (beyond that N their RSS no longer grows with N)."""
    measured = [(r["n"], float(r["peak_rss"])) for r in runs if steady(r)]
    fit_over = "every measured N"
    if case.endswith("default"):
        bound = [
            (r["n"], float(r["peak_rss"])) for r in runs if steady(r) and budget_binds(r, pixels_per_photo)
        ]
        if len(bound) >= 2:
            measured, fit_over = bound, "the N where the fixed cache budget is full"
    line = fit(measured)
    out: dict[str, Any] = {"case": case, "measured_n": [n for n, _ in measured], "fit_over": fit_over}
    failed = [r for r in runs if "failed" in r]
    skipped = [r for r in runs if "skipped" in r]
    if failed:
        out["status"] = f"measured up to failure: N={failed[0]['n']} {failed[0]['failed']}"
    elif skipped:
        out["status"] = f"extrapolated beyond N={max(out['measured_n'], default=0)}: {skipped[0]['skipped']}"
    else:
        out["status"] = "measured at every size; extrapolated beyond"
    if line is None:
        return out
    a, b = line
    out["fit"] = {
        "a_bytes": a,
        "b_bytes_per_photo": b,
        "b_per_decoded_rgb_float32_photo": b / (pixels_per_photo * 12),
    }
    out["fit"]["max_residual_bytes"] = max(abs(y - (a + b * n)) for n, y in measured)
    out["predicted"] = [{"n": n, "peak_rss": a + b * n, "extrapolated": True} for n in PREDICT_AT]
    out["n_at_cap"] = (cap - a) / b if b > 0 else None
    return out


def prepare(args: argparse.Namespace, root: Path, n: int, layouts: set[str], cap: int) -> dict[str, Any]:
    """N's capture, then each store, each in a capped child: paths, what each took, what failed."""
    work = args.work / f"{args.width}x{args.height}-q{args.quality}-s{args.seed}-p{args.points}"
    paths = {"capture": str(work / "captures" / str(n))}
    base = {"mode": "prepare", "root": str(root), "n": n, **paths}
    base |= {k: getattr(args, k) for k in ("width", "height", "quality", "points", "seed")}
    steps, failed = [], {}
    for layout in [None, *sorted(layouts)]:
        stores = {} if layout is None else {layout: str(work / "stores" / f"{n}-{layout}.zarr")}
        run = run_capped({**base, "stores": stores}, cap, args.case_timeout_s)
        info = next((e for e in run["events"] if e["stage"] == "prepared"), {})
        step = {
            "n": n,
            "what": layout or "capture",
            **info,
            "wall_s": run["wall_s"],
            "peak_rss": run["peak_rss"],
        }
        step.pop("stage", None)
        if "failed" in run:
            step |= {"failed": run["failed"], "error_tail": run.get("error_tail")}
            failed[layout or "capture"] = (
                f"preparing the {layout or 'capture'} failed at N={n}: {run['failed']}"
            )
            for path in stores.values():  # a partial store: not kept
                shutil.rmtree(path, ignore_errors=True)
            steps.append(step)
            if layout is None:
                break
            continue
        paths |= stores
        steps.append(step)
    return {"paths": paths, "steps": steps, "failed": failed}


def run_case(args: argparse.Namespace, case: str, n: int, paths: dict[str, str], cap: int) -> dict[str, Any]:
    layout = store_for(case)
    spec = {"mode": "case", "case": case, "capture": paths["capture"], "rays": args.rays}
    spec |= {"steps": args.steps, "seconds": args.steady_seconds, "fill_seconds": args.fill_seconds}
    if layout:
        spec["store"] = paths[layout]
    run = run_capped(spec, cap, args.case_timeout_s)
    stages = {e["stage"]: e for e in run.pop("events")}
    out: dict[str, Any] = {"case": case, "n": n, "measured": "failed" not in run}
    out |= {k: v for k, v in run.items() if k != "returncode"}
    out["rss_before"] = stages.get("imported", {}).get("rss")
    for stage, keys in (
        ("setup", ("setup_s", "cache_bytes")),
        ("first", ("first_batch_s",)),
        ("filled", ("fill_s", "epoch_fraction", "cache_used_bytes", "filled")),
        ("done", ("steps", "batches_per_s", "rays_per_s", "train_images", "loadavg_1m")),
    ):
        out |= {k: stages[stage][k] for k in keys if stage in stages}
    out["rss_after_setup"] = stages.get("setup", {}).get("rss")
    if "failed" in out and "accelerator" in out["failed"] and case.startswith("full-image"):
        out["failed"] += (
            ' (above 500 train images nerfstudio switches cache_images to "cpu", which pins memory:'
            " CUDA only)"
        )
    if "failed" in out:
        out["failed_at_stage"] = {"imported": "setup", "setup": "first batch", "first": "steady batches"}.get(
            out.pop("last_stage"), "start"
        )
    return out


def gb(x: float | None) -> str:
    return "" if x is None else f"{x / 1e9:.2f}"


def _how(summary: dict[str, Any]) -> str:
    status = summary["status"]
    if status.startswith("measured up to failure"):
        return "run to failure; fit extrapolated"
    if status.startswith("extrapolated"):
        return "extrapolated (next N over the cap)"
    return "measured at every N; fit extrapolated" + (
        " (over the N with the budget full)" if summary.get("fit_over", "").startswith("the N") else ""
    )


def markdown(report: dict[str, Any]) -> str:
    """The BENCHMARKS.md tables: peak RSS (GB) per case and N, measured then fitted, and the times."""
    sizes = report["sizes"]
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for r in report["runs"]:
        runs.setdefault(r["case"], {})[r["n"]] = r
    head = " | ".join(f"N={n}" for n in sizes)
    pred = " | ".join(f"*N={n}* (fit)" for n in PREDICT_AT)
    rows = [
        f"| case | {head} | {pred} | fit MB per photo | how |",
        "|---|" + "---|" * (len(sizes) + len(PREDICT_AT) + 2),
    ]
    notes = []
    for s in report["summary"]:
        cells = []
        for n in sizes:
            r = runs.get(s["case"], {}).get(n)
            if r is None or "skipped" in r:
                cells.append("not run" if r else "")
            elif "failed" in r:
                when = f"{gb(r['peak_rss'])}, {r['failed_after_s']:.0f} s"
                if r["failed"].startswith("killed at"):
                    cells.append(f"**killed** at the cap ({when})")
                else:
                    notes.append(f"{s['case']} at N={n}, in the {r['failed_at_stage']}: {r['failed']}")
                    cells.append(f"**{r['failed'].split(':')[0]}** [{len(notes)}] ({when})")
            elif not steady(r):
                cells.append(
                    f"&ge; {gb(r['peak_rss'])} (cache {r['cache_used_bytes'] / r['cache_bytes']:.0%} full)"
                )
            else:
                cells.append(gb(r["peak_rss"]))
        predicted = [f"*{gb(p['peak_rss'])}*" for p in s.get("predicted", [])] or [""] * len(PREDICT_AT)
        per = f"{s['fit']['b_bytes_per_photo'] / 1e6:.2f}" if "fit" in s else ""
        rows.append(f"| {s['case']} | {' | '.join(cells)} | {' | '.join(predicted)} | {per} | {_how(s)} |")
    rows += [""] + [f"[{i}] {note}" for i, note in enumerate(notes, 1)] + [""] * bool(notes)
    rows += [
        "| case | N | setup s | first batch s | steady batches/s | M rays/s | cache MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        if "skipped" in r or "failed" in r:
            continue
        cache = "" if r.get("cache_bytes") is None else f"{r['cache_bytes'] / 1e6:,.0f}"
        rate = f"{r['rays_per_s'] / 1e6:,.2f}" if r["case"] in RAY_CASES else ""
        rows.append(
            f"| {r['case']} | {r['n']} | {r['setup_s']:.2f} | {r['first_batch_s']:.2f} | "
            f"{r['batches_per_s']:,.0f} | {rate} | {cache} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[25, 50, 100, 250])
    p.add_argument("--cases", type=lambda s: s.split(","), default=list(CASES), help="comma-separated")
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--points", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rays", type=int, default=4096, help="rays per batch of the ray datamanagers")
    p.add_argument("--steps", type=int, default=100, help="steady batches after the first (at most)")
    p.add_argument("--steady-seconds", type=float, default=10.0, help="the steady batches' time limit")
    p.add_argument(
        "--fill-seconds", type=float, default=120.0, help="raykit ray cases: time to fill the cache"
    )
    p.add_argument("--rss-cap-gb", type=float, default=10.0, help="kill a child past this RSS (GB, 1e9 B)")
    p.add_argument("--case-timeout-s", type=float, default=900.0)
    p.add_argument("--run-to-failure", action="store_true", help="stop a case only when it fails")
    p.add_argument("--work", type=Path, default=Path.home() / ".cache" / "raykit" / "bench_scale_nerfstudio")
    p.add_argument("--keep-stores", action="store_true", help="keep each N's stores (default: removed)")
    p.add_argument("--out", type=Path, default=RESULTS / "scale_nerfstudio.json")
    p.add_argument("--markdown", metavar="JSON", help="print the tables of a result file")
    p.add_argument("--summarize", metavar="JSON", help="redo a result file's fits from its runs")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        try:
            (prepare_child if spec["mode"] == "prepare" else case_child)(spec)
        except BaseException as exc:  # MemoryError, nerfstudio's own errors: said to the driver, then raised
            print(MARK + json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}), flush=True)
            raise
        return 0
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    if args.summarize:  # the fits again from a result file's runs (the runs themselves unchanged)
        report = json.loads(Path(args.summarize).read_text())
        pixels = report["capture"]["width"] * report["capture"]["height"]
        cases = list(dict.fromkeys(r["case"] for r in report["runs"]))
        report["summary"] = [
            summarize(c, [r for r in report["runs"] if r["case"] == c], report["rss_cap_bytes"], pixels)
            for c in cases
        ]
        report["summarized_by"] = machine.command_line()  # the fits' command; "command" ran the cases
        machine.write_report(args.summarize, scrub(report))
        print(markdown(report))
        return 0
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        raise SystemExit(f"bench_scale_nerfstudio: unknown cases {unknown}; known: {', '.join(CASES)}")
    cache = Path(os.environ.get("RAYKIT_BENCH_CACHE", Path.home() / ".cache" / "raykit" / "bench_scale"))
    root = cache / f"{args.width}x{args.height}-q{args.quality}-s{args.seed}"
    cap = int(args.rss_cap_gb * 1e9)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    sizes = sorted(set(args.sizes))
    active = [c for c in CASES if c in args.cases]
    stopped: dict[str, str] = {}
    runs: list[dict[str, Any]] = []
    prepared: list[dict[str, Any]] = []
    report: dict[str, Any] = {}
    for i, n in enumerate(sizes):
        todo = [c for c in active if c not in stopped]
        for c in [c for c in active if c in stopped]:
            runs.append({"case": c, "n": n, "measured": False, "skipped": stopped[c]})
        if not todo:
            break
        layouts = {store_for(c) for c in todo} - {None}
        print(f"N={n}: preparing the capture{' and ' + ', '.join(sorted(layouts)) if layouts else ''}",
              file=sys.stderr, flush=True)  # fmt: skip
        prep = prepare(args, root, n, layouts, cap)  # type: ignore[arg-type]
        prepared += prep["steps"]
        for case in todo:
            why = prep["failed"].get("capture") or prep["failed"].get(store_for(case) or "")
            if why:
                runs.append({"case": case, "n": n, "measured": False, "skipped": why})
                stopped[case] = why
                continue
            print(f"N={n}: {case}", file=sys.stderr, flush=True)
            run = run_case(args, case, n, prep["paths"], cap)
            runs.append(run)
            brief = run.get("failed") or f"peak {gb(run['peak_rss'])} GB"
            print(f"N={n}: {case}: {brief} ({run['wall_s']:.1f} s)", file=sys.stderr, flush=True)
            if "failed" in run:
                stopped[case] = f"failed at N={n}"
                continue
            line = fit([(r["n"], float(r["peak_rss"])) for r in runs if r["case"] == case and steady(r)])
            if line and i + 1 < len(sizes) and not args.run_to_failure:
                nxt = line[0] + line[1] * sizes[i + 1]
                if nxt > cap:
                    stopped[case] = f"predicted {gb(nxt)} GB at N={sizes[i + 1]} > the {gb(cap)} GB cap"
        if not args.keep_stores:
            for layout in layouts:
                if layout in prep["paths"]:
                    shutil.rmtree(prep["paths"][layout], ignore_errors=True)
                    Path(prep["paths"][layout] + ".done").unlink(missing_ok=True)
        report = {
            "command": machine.command_line(),
            "machine": machine.describe(),
            "started": started,
            "load_average": os.getloadavg(),
            "capture": {
                "width": args.width,
                "height": args.height,
                "quality": args.quality,
                "points": args.points,
                "seed": args.seed,
                "photos": str(root / "photos"),
            },
            "rays": args.rays,
            "rss_cap_bytes": cap,
            "run_to_failure": args.run_to_failure,
            "sizes": sizes,
            "prepare": prepared,
            "runs": runs,
            "summary": [
                summarize(c, [r for r in runs if r["case"] == c], cap, args.width * args.height)
                for c in active
            ],
        }
        machine.write_report(args.out, scrub(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
