"""The run's report: its sections in ``raykit.report``'s model (``OUT/report.md`` and the self-contained
``OUT/report.html``) and its figures (PNG, in ``OUT/figures``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from raykit.pipeline.config import StageConfigs
from raykit.pipeline.timeline import over_white, plot_psnr_over_time
from raykit.report import Code, Figure, Scene, Section, Table, Video, para, pyplot, save_figure, write_report
from raykit.trainer import OLD_PROTOCOL, SAMPLING_MAP

plt = pyplot()

__all__ = ["capture_summary", "figures", "psnr_curve", "render_strip", "scene_points", "write"]

MAX_POINTS = 4000  # sparse points drawn in the 3-D view


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def render_strip(url: str, runs: Mapping[str, Any], path: Path, views: int) -> list[str]:
    """Rows: test views; columns: the store's ground truth, then each sampler's render. Returns names."""
    from raykit.store import open_store

    store = open_store(url)
    names = store.images("test")[:views]
    truth = [over_white(store.read_image(n)) for n in names]
    columns = [truth] + [
        [over_white(np.asarray(Image.open(p).convert("RGBA"))) for p in r["renders"][:views]]
        for r in runs.values()
    ]
    height, width = truth[0].shape[:2]
    scale = max(1, 160 // width)
    sheet = np.full((height * len(names), width * len(columns), 3), 255, np.uint8)
    for c, images in enumerate(columns):
        for r, image in enumerate(images):
            if image.shape[:2] == (height, width):
                sheet[r * height : (r + 1) * height, c * width : (c + 1) * width] = image
    img = Image.fromarray(sheet)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST).save(path)
    return names


def _images(count: int | None) -> str:
    return "all test images" if count is None else f"all {count} test images"


def psnr_curve(sampler: str, run: Mapping[str, Any]) -> tuple[list[tuple[float, float]], str]:
    """One sampler's PSNR-against-time curve: its progress checks only (one measurement, on one set of
    images), in time order, and the curve's legend label, which names the subset when the checks
    scored fewer images than the final evaluation (that one is plotted apart, not joined to it)."""
    points = [
        p for p in run.get("progress") or [] if p.get("psnr") is not None and p.get("elapsed_s") is not None
    ]
    points.sort(key=lambda p: (p["elapsed_s"], p.get("step") or 0))
    curve = [(float(p["elapsed_s"]), float(p["psnr"])) for p in points]
    counts = {p.get("n_images") for p in points}
    checked = next(iter(counts)) if len(counts) == 1 else None
    total = run.get("n_images")
    if checked is not None and total is not None and checked < total:
        label = f"{sampler}: progress checks, first {checked} of {total} test images (a subset)"
    elif checked is not None:
        label = f"{sampler}: progress checks, {checked} test images"
    else:
        label = f"{sampler}: progress checks"
    return curve, label


def figures(out: Path, results: Mapping[str, Any], records: Mapping[str, Any]) -> dict[str, str]:
    """Plot every figure of the report; returns ``{key: file name in OUT/figures}``."""
    folder = out / "figures"
    folder.mkdir(parents=True, exist_ok=True)
    runs = results["runs"]
    made: dict[str, str] = {}
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for sampler, run in runs.items():
        curve, label = psnr_curve(sampler, run)
        line = ax.plot(*zip(*curve, strict=True), marker="o", label=label)[0] if curve else None
        colour = line.get_color() if line is not None else None
        if run.get("elapsed_s") is not None and run.get("psnr") is not None:  # apart: another measurement
            final = f"{sampler}: final evaluation, {_images(run.get('n_images'))}"
            ax.plot([run["elapsed_s"]], [run["psnr"]], marker="*", markersize=11, linestyle="none",
                    color=colour, label=final)  # fmt: skip
    ax.set(
        xlabel="training time (s)", ylabel="test PSNR (dB)", title="PSNR against training time per sampler"
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    made["psnr"] = save_figure(fig, folder / "psnr.png").name
    names = list(runs)
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.2))
    memory = {s: runs[s]["memory_mb"] or 0.0 for s in names}
    panels = (
        ("samples_per_ray", "samples per ray"),
        ("memory", "peak memory (MB; CUDA, else RSS)"),
        ("loader_wait_fraction", "loader wait (share of step)"),
    )
    for ax, (key, title) in zip(axes, panels, strict=True):
        values = [memory[s] if key == "memory" else runs[s][key] or 0.0 for s in names]
        ax.bar(names, values, color="tab:blue")
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    made["samplers"] = save_figure(fig, folder / "samplers.png").name
    stages = {k: v["rays_per_s"] / 1e6 for k, v in (results["profile"]["stages"] or {}).items() if v}
    stages["end to end (warm)"] = results["profile"]["warm"]["rays_per_s"] / 1e6
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.barh(list(stages), list(stages.values()), color="tab:green")
    ax.set(xlabel="M rays/s", title="Loader throughput by stage")
    made["loader"] = save_figure(fig, folder / "loader.png").name
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(records) + 1.2))
    ax.barh(list(records), [r.get("wall_s") or 0.0 for r in records.values()], color="tab:orange")
    ax.invert_yaxis()
    ax.set(xlabel="wall time of the last attempt (s)", title="Stage times")
    made["stages"] = save_figure(fig, folder / "stages.png").name
    made["renders"] = Path(results["render"]["path"]).name
    if plot_psnr_over_time(runs, folder / "psnr_time.png"):
        made["psnr_time"] = "psnr_time.png"
    if (video := results["render"].get("video")) is not None:
        made["video"] = Path(video["path"]).name
    for sampler, run in runs.items():  # --ray-sampling loss: where the map put the rays
        source = Path(run["run_dir"]) / SAMPLING_MAP
        if source.is_file():
            target = folder / f"sampling_map_{sampler}.png"
            target.write_bytes(source.read_bytes())
            made[f"sampling_map:{sampler}"] = target.name
    return made


def capture_summary(cfg: StageConfigs, results: Mapping[str, Any]) -> dict[str, Any]:
    """Cameras, resolutions, images per split, photos left out (and why), store size against source."""
    from raykit.store import open_store

    store = open_store(results["store"]["url"])
    table_ = store.table
    sizes = sorted({f"{w}x{h}" for w, h in zip(table_.width.tolist(), table_.height.tolist(), strict=True)})
    left_out: list[tuple[str, str]] = []
    poses = results.get("poses")
    if poses:
        left_out = [(n, "not registered by structure from motion") for n in poses["summary"]["unregistered"]]
    points = store.sparse_points()
    return {
        "source": cfg.run.src,
        "kind": results["kind"],
        "cameras": len(table_.cameras),
        "models": sorted({c.model for c in table_.cameras}),
        "resolutions": sizes,
        "splits": {s: i.n_images for s, i in store.splits.items()},
        "rays": sum(i.n_rays for i in store.splits.values()),
        "left_out": left_out,
        "store_bytes": sum(int(v["size"]) for v in store.files.values()),
        "source_bytes": results["store"].get("source_bytes"),
        "backend": store.backend,
        "layout": store.layout("train"),
        "fingerprint": store.fingerprint,
        "points": 0 if points is None else len(points.xyz),
    }


def scene_points(url: str, seed: int = 0) -> dict[str, Any]:
    """Cameras (centre and a point along the viewing axis) and up to ``MAX_POINTS`` sparse points
    (``[x, y, z, css colour]``), centred and scaled into the unit ball: the report's 3-D view."""
    from raykit.store import open_store

    store = open_store(url)
    c2w = store.table.c2w
    centres, forward = c2w[:, :3, 3], c2w[:, :3, 2]  # OpenCV camera frame: z looks forward
    points = store.sparse_points()
    xyz = np.zeros((0, 3)) if points is None else points.xyz
    rgb = np.zeros((0, 3), np.uint8) if points is None else points.rgb
    if len(xyz) > MAX_POINTS:
        keep = np.random.default_rng(seed).choice(len(xyz), MAX_POINTS, replace=False)
        xyz, rgb = xyz[keep], rgb[keep]
    everything = np.concatenate([centres, xyz])
    middle = np.median(everything, axis=0)
    scale = float(np.percentile(np.linalg.norm(everything - middle, axis=1), 95)) or 1.0
    length = 0.15 * scale

    def unit(p: np.ndarray) -> list[float]:
        return [round(float(v), 4) for v in (p - middle) / scale]

    cameras = [[unit(c), unit(c + length * f)] for c, f in zip(centres, forward, strict=True)]
    dots = [[*unit(p), "#" + "".join(f"{int(v):02x}" for v in col)] for p, col in zip(xyz, rgb, strict=True)]
    return {"cameras": cameras, "points": dots}


def _listed(parts: Sequence[Sequence[str | Code]], sep: str) -> Iterator[str | Code]:
    for index, part in enumerate(parts):
        if index:
            yield sep
        yield from part


def _capture(cfg: StageConfigs, results: Mapping[str, Any]) -> list[Any]:
    cap = capture_summary(cfg, results)
    left: list[list[str | Code]] = [[Code(name), f" ({why})"] for name, why in cap["left_out"]]
    source = cap["source_bytes"]
    ratio = f" ({cap['store_bytes'] / source:.2f}x the source)" if source else ""
    splits = ", ".join(f"{s} {n}" for s, n in cap["splits"].items())
    return [
        para("Source ", Code(cap["source"]), f" ({cap['kind']}): {cap['cameras']} camera(s) "
             f"({', '.join(cap['models'])}), resolution {', '.join(cap['resolutions'])}, images {splits}, "
             f"{cap['rays']:,} rays, {cap['points']:,} sparse points."),
        para("Photos left out: ", *(_listed(left, "; ") if left else ["none"]), "."),
        Table(["", "MB"], [
            ["source", f"{source / 1e6:.2f}" if source else "-"],
            [f"store ({cap['backend']}, {cap['layout']} layout)", f"{cap['store_bytes'] / 1e6:.2f}{ratio}"],
        ]),
        Scene(scene_points(results["store"]["url"], cfg.run.seed)),
    ]  # fmt: skip


def sections(
    cfg: StageConfigs, results: Mapping[str, Any], records: Mapping[str, Any], made: Mapping[str, str]
) -> list[Section]:
    """The report's sections (``made``: the figures' file names by key, see :func:`figures`)."""
    prof, runs = results["profile"], results["runs"]
    loader = [[k, f"{v['rays_per_s'] / 1e6:.2f}"] for k, v in (prof["stages"] or {}).items() if v]
    loader += [[f"end to end, {k}", f"{prof[k]['rays_per_s'] / 1e6:.2f}"] for k in ("cold", "warm")]
    training = [
        [s, f"{r['psnr']:.2f}", f"{r['ssim']:.3f}", _fmt(r.get("lpips"), ".3f"), _fmt(r.get("psnr_float")),
         r.get("protocol", OLD_PROTOCOL), str(r["step"]), _fmt(r["samples_per_ray"], ".1f"),
         _fmt(r["rays_per_s"], ".0f"), _fmt(r["memory_mb"], ".0f"),
         _fmt(records[f"train-{s}"].get("peak_rss_mb"), ".0f"), _fmt(r["loader_wait_fraction"], ".3f")]
        for s, r in runs.items()
    ]  # fmt: skip
    header = ["sampler", "PSNR dB", "SSIM", "LPIPS", "float PSNR dB (extra)", "protocol", "steps",
              "samples/ray", "rays/s", "trainer memory MB", "peak RSS MB", "loader wait"]  # fmt: skip
    floats = any(r.get("psnr_float") is not None for r in runs.values())  # runs of earlier releases
    if not floats:
        header, training = header[:4] + header[5:], [row[:4] + row[5:] for row in training]
    exports = [
        [s, f"{e['bytes'] / 1e6:.2f}", *(f"{e['verify'][k]:.{d}f}" for k, d in
         (("psnr", 3), ("run_psnr", 3), ("difference_db", 4))), "yes"]
        for s, e in results["exports"].items()
    ]  # fmt: skip
    stages = [
        [n, r["status"], *(_fmt(r.get(k), d) for k, d in
         (("wall_s", ".1f"), ("cpu_s", ".1f"), ("peak_rss_mb", ".0f"), ("peak_gpu_mb", ".0f"))),
         str(len(r["attempts"]))]
        for n, r in records.items()
    ]  # fmt: skip
    budget = f"{cfg.run.steps} steps per sampler" if cfg.run.steps else f"{cfg.run.minutes} min split evenly"
    views: list[list[str | Code]] = [[Code(n)] for n in results["render"]["views"]]
    return [
        Section("Capture", _capture(cfg, results)),
        Section("Loader throughput", [Table(["loader stage (train split)", "M rays/s"], loader),
                                      Figure(made["loader"], "loader")]),
        Section("Training", [
            Table(header, training),
            para(f"Budget: {budget}. PSNR, SSIM and LPIPS follow the community evaluation protocol (8-bit "
                 "images, as nerfbaselines scores them; LPIPS AlexNet, '-' without its weights)"
                 + ("; the float PSNR, the figure of earlier releases, is an extra column." if floats
                    else ".")),
            Figure(made["psnr"], "psnr"), Figure(made["samplers"], "samplers"), *_over_time(made),
            *_sampling_maps(made),
        ]),
        Section("Test views", [para(f"Ground truth, then {', '.join(runs)}: ", *_listed(views, ", "), "."),
                               Figure(made["renders"], "renders"), *_video(results, made)]),
        Section("Export verification", [Table(["sampler", "export MB", "PSNR from export", "run's PSNR",
                                               "difference dB", "verified"], exports)]),
        Section("Stage times", [
            Table(["stage", "status", "wall s", "CPU s", "peak RSS MB", "peak GPU MB", "attempts"], stages),
            para("Every stage's command, inputs and attempts: ", Code("pipeline.json"), "."),
            Figure(made["stages"], "stages"),
        ]),
    ]  # fmt: skip


def _over_time(made: Mapping[str, str]) -> list[Any]:
    """A capture with times: test PSNR against each test frame's scene time."""
    if "psnr_time" not in made:
        return []
    return [para("Test PSNR of each test frame against its scene time (the final evaluation):"),
            Figure(made["psnr_time"], "test PSNR against scene time")]  # fmt: skip


def _sampling_maps(made: Mapping[str, str]) -> list[Any]:
    """Runs with ``--ray-sampling loss``: the training views the map favoured beside their maps."""
    maps = {key.split(":", 1)[1]: name for key, name in made.items() if key.startswith("sampling_map:")}
    if not maps:
        return []
    return [para("Where the loss sampling put the rays (training views the error map favoured most, "
                 "beside their maps: rays per pixel against uniform, log2):"),
            *(Figure(name, f"{sampler}: sampling map") for sampler, name in maps.items())]  # fmt: skip


def _video(results: Mapping[str, Any], made: Mapping[str, str]) -> list[Any]:
    """A capture with times: the test camera over time, ground truth beside each sampler's render."""
    video = results["render"].get("video")
    if video is None or "video" not in made:
        return []
    times = ", ".join(f"{t:.3f}" for t in video["times"])
    return [para(f"Test camera over time, {video['camera']} ({len(video['times'])} frames at "
                 f"{video['fps']} fps, scene times {times}): {', '.join(video['columns'])}."),
            Video(made["video"], f"{video['camera']} over time")]  # fmt: skip


def write(
    out: Path, cfg: StageConfigs, results: Mapping[str, Any], records: Mapping[str, Any], extra: list[Section]
) -> tuple[Path, Path]:
    """Plot the figures, write ``OUT/report.md`` and ``OUT/report.html``; their paths."""
    made = figures(out, results, records)
    return write_report(out, "raykit run report", [*sections(cfg, results, records, made), *extra])
