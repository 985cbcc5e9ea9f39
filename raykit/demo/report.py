"""The demo's sections of the report (beside the pipeline's): stores, the loader grid and its baselines,
the two layouts (``raykit.report``'s model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raykit.report import Code, Figure, Section, Table, para, pyplot, save_figure

plt = pyplot()

__all__ = ["dataset_section", "layouts_section", "loader_section", "plot_throughput"]


def plot_throughput(bench: dict[str, Any], path: Path) -> Path:
    """Warm rays/s against batch size, one line per worker count, baselines as horizontal lines."""
    fig, ax = plt.subplots(figsize=(6, 4))
    workers = sorted({r["settings"]["workers"] for r in bench["grid"]})
    for w in workers:
        rows = sorted(
            (r for r in bench["grid"] if r["settings"]["workers"] == w),
            key=lambda r: r["settings"]["batch_size"],
        )
        sizes = [r["settings"]["batch_size"] for r in rows]
        ax.plot(
            sizes, [r["warm"]["rays_per_s"] / 1e6 for r in rows], marker="o", label=f"raykit, {w} workers"
        )
    styles = {"a_precomputed_rays": ":", "b_cached_images": "--"}
    for name, result in bench["baselines"].items():
        ax.axhline(
            result["steady_rays_per_s"] / 1e6,
            linestyle=styles.get(name, "-."),
            color="grey",
            label=f"baseline {name}",
        )
    ax.set_xscale("log", base=2)
    return _finish(fig, ax, ("batch size (rays)", "M rays/s (warm)", "Loader throughput"), path)


def _finish(fig: Any, ax: Any, labels: tuple[str, str, str], path: Path) -> Path:
    """Label (x, y, title), add legend and grid, save as PNG, close."""
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(labels[2])
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=110)


def _store_row(name: str, s: dict[str, Any]) -> list[str]:
    rays = sum(v["rays"] for v in s["splits"].values())
    mb = s["bytes_on_disk"] / 1e6
    per_ray, seconds = s["bytes_per_ray"], s["convert_s"]
    return [
        name,
        s["backend"],
        f"{rays:,}",
        f"{mb:.2f}",
        f"{per_ray:.2f}",
        f"{seconds:.1f}",
        s["fingerprint"][:12],
    ]


def _bench_row(r: dict[str, Any]) -> list[str]:
    settings, cold, warm = r["settings"], r["cold"], r["warm"]
    rates = [f"{cold['rays_per_s'] / 1e6:.2f}", f"{warm['rays_per_s'] / 1e6:.2f}", f"{warm['mb_per_s']:.1f}"]
    return [str(settings["workers"]), str(settings["batch_size"]), *rates, f"{cold['first_batch_s']:.3f}"]


def dataset_section(scene: dict[str, Any], stores: dict[str, Any]) -> Section:
    """The demo's stores: both forms and both backends of the scene, and how their rays compare."""
    views = ", ".join(f"{n} {s}" for s, n in scene["views"].items())
    rows = [_store_row(name, s) for name, s in stores.items() if isinstance(s, dict) and "backend" in s]
    same = stores["blender_vs_colmap"]
    return Section("Dataset", [
        para("Built-in scene ", Code(scene["size"]), f" (seed {scene['seed']}): "
             f"{scene['width']}x{scene['height']} {scene['camera_model']}, {views}; rendered in "
             f"{scene['render_s']:.1f} s."),
        Table(["store", "backend", "rays", "MB on disk", "bytes/ray", "convert s", "fingerprint"], rows),
        para("Every store passed ", Code("raykit validate"), ". Zarr and WebDataset copies share one content "
             f"fingerprint: {stores['equal_fingerprints_zarr_wds']}. Blender vs COLMAP forms, largest "
             f"difference over {same['images']} test images: origins {same['origins']:.2e}, directions "
             f"{same['directions']:.2e}, rgb {same['rgb']:.2e}."),
    ])  # fmt: skip


def loader_section(out: Path, bench: dict[str, Any]) -> Section:
    """The loader over worker counts and batch sizes, and the two baselines (plots figures/throughput.png)."""
    (out / "figures").mkdir(exist_ok=True)
    plot_throughput(bench, out / "figures" / "throughput.png")
    base = [
        [name, f"{b['steady_rays_per_s'] / 1e6:.2f}", f"{b['time_to_first_batch_s']:.2f}",
         f"{b['host_bytes_per_cached_ray']:.0f}"]
        for name, b in bench["baselines"].items()
    ]  # fmt: skip
    stages = bench["grid"][0]["stages"]
    quality = bench["grid"][0].get("shuffle_quality") or {}
    return Section("Loader grid and baselines", [
        para("Train split, CPU."),
        Table(["workers", "batch", "cold M rays/s", "warm M rays/s", "warm MB/s", "first batch s"],
              [_bench_row(r) for r in bench["grid"]]),
        para(f"WebDataset copy, batch 4096: {bench['wds_4096']['warm']['rays_per_s'] / 1e6:.2f} M rays/s "
             "warm."),
        para("Baselines on the same data, batch 4096: (a) decode everything to float32 and precompute "
             "every ray; (b) cache float32 images and generate random pixels' rays per batch, the way "
             "nerfstudio's ", Code("Cameras.generate_rays"), " does. On a scene this small every approach "
             "fits in memory and (a) slices an array that fits in the CPU cache; compare start-up and bytes "
             "per ray too, and see BENCHMARKS.md for the 100-view 800x800 scene."),
        Table(["baseline", "M rays/s", "first batch s", "host bytes/ray"], base),
        para("Stage breakdown (first grid row):"),
        Table(["stage", "M rays/s"], [[k, f"{v['rays_per_s'] / 1e6:.2f}"] for k, v in stages.items() if v]),
        para(f"Shuffle quality: {', '.join(f'{k} {v:.3f}' for k, v in quality.items())}"),
        Figure("throughput.png", "throughput"),
    ])  # fmt: skip


def layouts_section(layouts: dict[str, Any]) -> Section:
    """The table comparing the two layouts."""
    rows = []
    for name in ("rays", "images"):
        r = layouts[name]
        q = r["shuffle_quality"] or {}
        rows.append([
            name, f"{r['bytes_on_disk'] / 1e6:.2f}", f"{r['convert_s']:.1f}", f"{r['rays_per_s'] / 1e6:.2f}",
            f"{(r['read_mb_per_s'] or 0):.1f}", f"{(r['decode_share'] or 0):.2f}",
            f"{q.get('distinct_images', 0):.1f} ({q.get('uniform_expected', 0):.1f})",
            f"{q.get('tv_ratio', 0):.2f}x", f"{r['test_psnr']:.2f}",
        ])  # fmt: skip
    header = ["layout", "MB on disk", "convert s", "loader M rays/s", "MB/s read", "decode share",
              "distinct images / batch (uniform)", "TV vs uniform", "test PSNR dB (protocol)"]  # fmt: skip
    return Section("Layouts", [
        para("Rays vs images (Zarr, train split, batch 4096, CPU)."),
        Table(header, rows),
        para("Same capture, same sampler (", Code(layouts["sampler"]), ") and training budget "
             f"({layouts['train_seconds']:.0f} s). The images layout keeps the capture's PNGs (passed "
             "through byte for byte) and shuffles at load time within a window of decoded images, so its "
             "batches mix fewer images than the ray layout's pre-shuffled rays (distinct images per batch "
             "and the histogram distance, TV, against a uniform draw)."),
    ])  # fmt: skip
