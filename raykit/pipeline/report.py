"""``report.md`` of a pipeline run and its figures (PNG, in ``OUT/figures``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from PIL import Image

from raykit.pipeline.config import StageConfigs
from raykit.trainer import OLD_PROTOCOL

__all__ = ["capture_summary", "code", "figures", "render_strip", "table", "write_markdown"]


def code(text: object) -> str:
    """``text`` (a name from a capture or a store: anything) as one markdown code span that shows it
    literally and cannot end early (for paragraphs, not table cells): control characters written as
    escapes (a newline as ``\\n``: no line break, no new block), and a fence of one backtick more than
    the longest run of backticks inside, padded with a space where the text starts or ends with a
    backtick or a space. Inside a code span nothing is markup: ``![x](/etc/passwd)`` stays text."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text[:1] in ("`", " ") or text[-1:] in ("`", " ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _on_white(image: np.ndarray) -> np.ndarray:
    """(H, W, 3|4) uint8 -> (H, W, 3) uint8 composited over white."""
    if image.shape[-1] == 3:
        return image
    alpha = image[..., 3:].astype(np.float32) / 255.0
    return (image[..., :3] * alpha + 255.0 * (1.0 - alpha) + 0.5).astype(np.uint8)


def render_strip(url: str, runs: Mapping[str, Any], path: Path, views: int) -> list[str]:
    """Rows: test views; columns: the store's ground truth, then each sampler's render. Returns names."""
    from raykit.store import open_store

    store = open_store(url)
    names = store.images("test")[:views]
    truth = [_on_white(store.read_image(n)) for n in names]
    columns = [truth] + [
        [_on_white(np.asarray(Image.open(p).convert("RGBA"))) for p in r["renders"][:views]]
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


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path.name


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
    made["psnr"] = _save(fig, folder / "psnr.png")
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
    made["samplers"] = _save(fig, folder / "samplers.png")
    stages = {k: v["rays_per_s"] / 1e6 for k, v in (results["profile"]["stages"] or {}).items() if v}
    stages["end to end (warm)"] = results["profile"]["warm"]["rays_per_s"] / 1e6
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.barh(list(stages), list(stages.values()), color="tab:green")
    ax.set(xlabel="M rays/s", title="Loader throughput by stage")
    made["loader"] = _save(fig, folder / "loader.png")
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(records) + 1.2))
    ax.barh(list(records), [r.get("wall_s") or 0.0 for r in records.values()], color="tab:orange")
    ax.invert_yaxis()
    ax.set(xlabel="wall time of the last attempt (s)", title="Stage times")
    made["stages"] = _save(fig, folder / "stages.png")
    made["renders"] = Path(results["render"]["path"]).name
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
    store_bytes = sum(int(v["size"]) for v in store.files.values())
    return {
        "source": cfg.run.src,
        "kind": results["kind"],
        "cameras": len(table_.cameras),
        "models": sorted({c.model for c in table_.cameras}),
        "resolutions": sizes,
        "splits": {s: i.n_images for s, i in store.splits.items()},
        "rays": sum(i.n_rays for i in store.splits.values()),
        "left_out": left_out,
        "store_bytes": store_bytes,
        "source_bytes": results["store"].get("source_bytes"),
        "backend": store.backend,
        "layout": store.layout("train"),
        "fingerprint": store.fingerprint,
        "points": 0 if store.sparse_points() is None else len(store.sparse_points().xyz),  # type: ignore[union-attr]
    }


def sections(cfg: StageConfigs, results: Mapping[str, Any], records: Mapping[str, Any]) -> dict[str, str]:
    """The report's sections as markdown (shared by report.md and report.html)."""
    cap = capture_summary(cfg, results)
    left = "; ".join(f"{code(n)} ({why})" for n, why in cap["left_out"]) or "none"
    ratio = (
        "" if not cap["source_bytes"] else f" ({cap['store_bytes'] / cap['source_bytes']:.2f}x the source)"
    )
    source_mb = "-" if not cap["source_bytes"] else f"{cap['source_bytes'] / 1e6:.2f}"
    capture = "\n".join(
        [
            f"Source {code(cap['source'])} ({cap['kind']}): {cap['cameras']} camera(s) "
            f"({', '.join(cap['models'])}), "
            f"resolution {', '.join(cap['resolutions'])}, images "
            + ", ".join(f"{s} {n}" for s, n in cap["splits"].items())
            + f", {cap['rays']:,} rays, "
            f"{cap['points']:,} sparse points.",
            "",
            f"Photos left out: {left}.",
            "",
            table(
                ["", "MB"],
                [
                    ["source", source_mb],
                    [
                        f"store ({cap['backend']}, {cap['layout']} layout)",
                        f"{cap['store_bytes'] / 1e6:.2f}{ratio}",
                    ],
                ],
            ),
        ]
    )
    prof = results["profile"]
    rows = [[k, f"{v['rays_per_s'] / 1e6:.2f}"] for k, v in (prof["stages"] or {}).items() if v]
    rows += [
        ["end to end, cold", f"{prof['cold']['rays_per_s'] / 1e6:.2f}"],
        ["end to end, warm", f"{prof['warm']['rays_per_s'] / 1e6:.2f}"],
    ]
    loader = table(["loader stage (train split)", "M rays/s"], rows)
    runs = results["runs"]
    train_rows = [
        [
            s,
            f"{r['psnr']:.2f}",
            f"{r['ssim']:.3f}",
            _fmt(r.get("lpips"), ".3f"),
            _fmt(r.get("psnr_float"), ".2f"),
            r.get("protocol", OLD_PROTOCOL),
            str(r["step"]),
            _fmt(r["samples_per_ray"], ".1f"),
            _fmt(r["rays_per_s"], ".0f"),
            _fmt(r["memory_mb"], ".0f"),
            _fmt(records[f"train-{s}"].get("peak_rss_mb"), ".0f"),
            _fmt(r["loader_wait_fraction"], ".3f"),
        ]
        for s, r in runs.items()
    ]
    training = table(
        [
            "sampler",
            "PSNR dB",
            "SSIM",
            "LPIPS",
            "float PSNR dB (extra)",
            "protocol",
            "steps",
            "samples/ray",
            "rays/s",
            "trainer memory MB",
            "peak RSS MB",
            "loader wait",
        ],
        train_rows,
    )
    exports = table(
        ["sampler", "export MB", "PSNR from export", "run's PSNR", "difference dB", "verified"],
        [
            [
                s,
                f"{e['bytes'] / 1e6:.2f}",
                f"{e['verify']['psnr']:.3f}",
                f"{e['verify']['run_psnr']:.3f}",
                f"{e['verify']['difference_db']:.4f}",
                "yes",
            ]
            for s, e in results["exports"].items()
        ],
    )
    stage_rows = [
        [
            n,
            r["status"],
            _fmt(r.get("wall_s"), ".1f"),
            _fmt(r.get("cpu_s"), ".1f"),
            _fmt(r.get("peak_rss_mb"), ".0f"),
            _fmt(r.get("peak_gpu_mb"), ".0f"),
            str(len(r["attempts"])),
        ]
        for n, r in records.items()
    ]
    stages = table(
        ["stage", "status", "wall s", "CPU s", "peak RSS MB", "peak GPU MB", "attempts"], stage_rows
    )
    views = ", ".join(code(n) for n in results["render"]["views"])
    return {
        "Capture": capture,
        "Loader throughput": loader,
        "Training": training
        + "\n\nBudget: "
        + (f"{cfg.run.steps} steps per sampler" if cfg.run.steps else f"{cfg.run.minutes} min split evenly")
        + ". PSNR, SSIM and LPIPS follow the community evaluation protocol (8-bit images, as nerfbaselines "
        "scores them; LPIPS AlexNet, '-' without its weights); the float PSNR, the figure of earlier "
        "releases, is an extra column.",
        "Test views": f"Ground truth, then {', '.join(runs)}: {views}.",
        "Export verification": exports,
        "Stage times": stages + "\n\nEvery stage's command, inputs and attempts: `pipeline.json`.",
    }


FIGURES = {
    "Loader throughput": ("loader",),
    "Training": ("psnr", "samplers"),
    "Test views": ("renders",),
    "Stage times": ("stages",),
}


def write_markdown(
    out: Path,
    cfg: StageConfigs,
    results: Mapping[str, Any],
    records: Mapping[str, Any],
    extra: Mapping[str, str],
    made: Mapping[str, str],
) -> Path:
    """Write ``OUT/report.md`` (``made``: the figures' file names by key, see :func:`figures`)."""
    parts = ["# raykit run report", "The interactive view of cameras and points is in `report.html`."]
    for title, body in {**sections(cfg, results, records), **extra}.items():
        images = [f"![{key}](figures/{made[key]})" for key in FIGURES.get(title, ())]
        parts.append("\n\n".join([f"## {title}", body, *images]))
    path = out / "report.md"
    path.write_text("\n\n".join(parts) + "\n")
    return path
