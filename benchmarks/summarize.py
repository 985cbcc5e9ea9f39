"""Print Markdown tables from the JSON the benchmarks wrote (benchmarks/results/*.json).

    python benchmarks/summarize.py > tables.md

BENCHMARKS.md is organised by topic and edited by hand (its history is benchmarks/HISTORY.md), so this
script no longer rewrites it: it prints the loader, conversion, trainer, codec and poses sections of the
results files present, every number from those files, to copy into the topic they belong to.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from machine import describe_text, portable

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def _command(recorded: str) -> str:
    """A recorded command line without the machine's paths (results written before ``machine.py``)."""
    return " ".join(portable(word) for word in recorded.split())


def _m(x: float) -> str:
    return f"{x / 1e6:.2f} M"


def loader_section(d: dict[str, Any]) -> str:
    r, big = d["raykit"], d["raykit_store_4x_cache"]
    a, b = d["baseline_a_precomputed_rays"], d["baseline_b_cached_images"]
    ratios = d["ratios"]
    rows = [
        ["raykit RayLoader (cache holds the split)", _m(r["steady_rays_per_s"]),
         f"{r['time_to_first_batch_s']:.3f}", f"{r['host_bytes_per_cached_ray']:.2f}",
         f"{r['peak_rss_bytes'] / 2**20:.0f}"],
        ["raykit, store 4x the cache budget", _m(big["steady_rays_per_s"]),
         f"{big['time_to_first_batch_s']:.3f}", f"{big['host_bytes_per_cached_ray']:.2f}",
         f"{big['peak_rss_bytes'] / 2**20:.0f}"],
        ["(a) precomputed float32 rays, reshuffled per epoch", _m(a["steady_rays_per_s"]),
         f"{a['time_to_first_batch_s']:.2f}", f"{a['host_bytes_per_cached_ray']:.0f}", "-"],
        ["(b) cached float32 images, random pixels, nerfstudio-style rays", _m(b["steady_rays_per_s"]),
         f"{b['time_to_first_batch_s']:.2f}", f"{b['host_bytes_per_cached_ray']:.0f}", "-"],
    ]  # fmt: skip
    b2 = d.get("baseline_b_cached_images_raykit_rays")
    if b2 is not None:
        rows.append(
            ["(b') as (b), rays from raykit's RayGenerator", _m(b2["steady_rays_per_s"]),
             f"{b2['time_to_first_batch_s']:.2f}", f"{b2['host_bytes_per_cached_ray']:.0f}", "-"]
        )  # fmt: skip
    budget_mb = big["cache_bytes_budget"] / 2**20
    lines = [
        "## Loader (issue 5)",
        f"Command: `{_command(d['command'])}`",
        "",
        f"Scene: built-in `{d['scene']['size']}` ({d['scene']['train_rays']:,} train rays), batch "
        f"{d['batch_size']}, CPU, torch threads {d['machine']['torch_threads']}. "
        f"Load average at start/end: {d['machine']['loadavg_1m_at_start_and_end']}.",
        "",
        _table(["loader", "steady rays/s", "first batch s", "host bytes/cached ray", "peak RSS MB"], rows),
        "",
        f"- steady rays/s vs (b): **{ratios['steady_vs_b']:.2f}x** (target 4x); vs (a): {ratios['steady_vs_a']:.2f}x",
        f"- time to first batch: {ratios['first_batch_vs_a']:.4f} of (a), {ratios['first_batch_vs_b']:.3f} of (b) "
        "(target: under 1 s and under 0.1 of both)",
        f"- store 4x the cache budget ({budget_mb:.0f} MB): throughput {ratios['store_4x_vs_cached_throughput']:.2f} "
        f"of the fully cached case (target >= 0.5); peak RSS = budget + "
        f"{ratios['store_4x_peak_rss_minus_budget_mb']:.0f} MB (target <= +400 MB)",
    ]  # fmt: skip
    if b2 is not None:
        lines.append(
            f"- (b) generates rays the way nerfstudio's `Cameras.generate_rays` does (per-ray pose and intrinsics "
            f"gathers, a per-ray rotation, a normalisation; no pixel area), so it is the baseline the target refers "
            f"to. (b') swaps in raykit's RayGenerator and isolates the data layout: raykit is "
            f"{ratios['steady_vs_b_raykit_rays']:.2f}x (b'). Both are faster than the nerfstudio 1.1.5 "
            f"VanillaDataManager figure quoted in issue 5 (2.5 M rays/s, not measured here), against which raykit's "
            f"steady rate is {r['steady_rays_per_s'] / 2.5e6:.1f}x."
        )
    lines.append(
        "- raykit loader time by stage over the whole run (s; gather and generate are summed over the "
        "generation threads): " + ", ".join(f"{k} {v:.1f}" for k, v in r["loader_seconds"].items()) + "."
    )
    for name, base in (("(b)", b), ("(b')", b2)):
        if base is not None and "by_torch_threads" in base:
            per = ", ".join(
                f"{k} threads {_m(v['steady_rays_per_s'])}" for k, v in base["by_torch_threads"].items()
            )
            lines.append(f"- baseline {name} by torch threads: {per} rays/s (the best is used above)")
    return "\n".join(lines)


def _convert_rows(d: dict[str, Any]) -> list[list[str]]:
    dec = d["decode_single_core"]["mp_per_s"]

    def label(c: dict[str, Any]) -> str:
        if c.get("running_cluster"):
            return f"{c['workers']}, Dask cluster already running (`--scheduler`)"
        return f"{c['workers']}, local Dask cluster started (start-up included)" if c["workers"] > 1 else "1"

    return [
        [label(c), str(c.get("threads", 1)), f"{c['seconds']:.1f}", f"{c['mp_per_s']:.2f}",
         f"{c['mp_per_s_per_worker']:.2f}", f"{c['mp_per_s_per_worker'] / dec:.3f}",
         f"{c.get('mp_per_s_per_core', c['mp_per_s_per_worker']) / dec:.3f}"]
        for c in d["convert"]
    ]  # fmt: skip


_CONVERT_HEADER = ["workers", "threads each", "seconds", "MP/s", "MP/s per worker", "per worker / decode",
                   "per core / decode"]  # fmt: skip


def _store_size(d: dict[str, Any]) -> str:
    """Bytes per ray of the store, by field, with the default colours and with ``--rgba-codec zstd``."""
    rays = d["scene"]["megapixels"] * 1e6
    lz4 = d["convert"][0]
    text = f"Store size with the default `--rgba-codec lz4`: {lz4['store_bytes'] / rays:.2f} bytes per ray"
    by_field = lz4.get("store_bytes_per_ray_by_field")
    if by_field:
        text += " (" + ", ".join(f"{k} {v:.2f}" for k, v in by_field.items()) + ")"
    zstd = d.get("rgba_codec_zstd_1x2")
    if zstd:
        text += (
            f". With `--rgba-codec zstd` (1 worker x 2 threads): {zstd['store_bytes'] / rays:.2f} bytes per "
            f"ray ({1 - zstd['store_bytes'] / lz4['store_bytes']:.0%} smaller; train rgba "
            f"{zstd['store_bytes_per_ray_by_field']['train/rgba']:.2f}) in {zstd['seconds']:.1f} s, against "
            f"{d['convert'][1]['seconds']:.1f} s with lz4"
        )
    return text + "."


def convert_section(d: dict[str, Any]) -> str:
    dec = d["decode_single_core"]["mp_per_s"]
    best = max(c["mp_per_s_per_worker"] / dec for c in d["convert"])
    phases = d["convert"][0]["phases_s"]
    ceiling = d["compression_ceiling_single_worker"]
    png = d["scene"].get("png_bytes_per_pixel")
    lines = [
        "## Conversion (issue 4)",
        f"Command: `{_command(d.get('command', 'python benchmarks/bench_convert.py'))}`",
        "",
        f"Scene: built-in `{d['scene']['size']}` as a Blender capture, {d['scene']['images']} images, "
        f"{d['scene']['megapixels']:.1f} MP" + (f" ({png:.2f} PNG bytes/pixel)" if png else "") + ", to Zarr. "
        f"Single-core PNG decode rate in the same run: "
        f"{d['decode_single_core']['mp_per_s']:.1f} MP/s; the converter's own parse + decode + checks: "
        f"{d['converter_side_single_core']['mp_per_s']:.1f} MP/s ({d['converter_side_ratio_vs_decode']:.2f}x decode). "
        f"Load average at the end: {d['machine']['loadavg_1m_at_end']:.1f}.",
        "",
        _table(_CONVERT_HEADER, _convert_rows(d)),
        "",
        "Time by phase, 1 worker of 1 thread (s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()) + ".",
        "",
        f"Target (per worker >= 0.8x decode) is **{'met' if best >= 0.8 else 'not met'}** (best "
        f"{best:.2f}x). Compression alone runs at {ceiling['compress_mp_per_s']:.1f} MP/s, so on one core "
        f"decode + compress can reach at most {ceiling['decode_plus_compress_mp_per_s']:.1f} MP/s "
        f"({ceiling['ratio_vs_decode']:.2f}x decode) on this machine, before the train shuffle, checksums "
        f"and writes. Dask workers (separate processes) stage images in files; one process stages them in "
        f"memory. A local cluster takes {d['dask_cluster_startup_s']:.1f} s to start and stop. Output is "
        f"byte-identical across worker and thread counts: {d['identical_across_workers']}.",
    ]  # fmt: skip
    lines += ["", _store_size(d)]
    noisy = d.get("photo_noise")
    if noisy:
        ndec = noisy["decode_single_core"]["mp_per_s"]
        nbest = max(c["mp_per_s_per_worker"] / ndec for c in noisy["convert"])
        lines += [
            "",
            f"**Photo-like variant** (not the issue's benchmark; context): the same views with seeded Gaussian "
            f"noise (sigma {noisy['noise_sigma']:g} levels) on RGB, {noisy['png_bytes_per_pixel']:.2f} PNG "
            f"bytes/pixel like photographs. Decode {ndec:.1f} MP/s; best per worker {nbest:.2f}x decode; "
            f"{noisy['convert'][0]['store_bytes'] / (noisy['megapixels'] * 1e6):.2f} bytes per ray stored.",
            "",
            _table(_CONVERT_HEADER, _convert_rows(noisy)),
        ]  # fmt: skip
    return "\n".join(lines)


def trainer_section(d: dict[str, Any]) -> str:
    rows = []
    for sampler, r in d["results"].items():
        reach = r.get("seconds_to_stratified_final_quick_psnr")
        f = r["fraction"]
        rows.append([
            sampler, f"{r['test_psnr']:.2f}", f"{r['test_ssim']:.3f}", str(r["steps"]), f"{r['samples_per_ray']:.1f}",
            f"{r['rays_per_s']:.0f}", "-" if reach is None else f"{reach:.0f}",
            " / ".join(f"{f.get(k, 0.0):.2f}" for k in ("data", "sampling", "network", "rendering", "backward")),
        ])  # fmt: skip
    return "\n".join([
        "## Trainer (issue 6)",
        f"Command: `{_command(d['command'])}`"
        + "".join(
            f"; {name} from `{_command(r['command'])}`"
            for name, r in d["results"].items()
            if r.get("command", d["command"]) != d["command"]
        ),
        "",
        f"Scene: built-in `{d['scene']}`, {d['budget_seconds']:.0f} s training budget per sampler, CPU "
        f"({d['machine'].get('torch_threads')} torch threads). Test PSNR/SSIM over the full test images.",
        "",
        _table(["sampler", "test PSNR dB", "SSIM", "steps", "samples/ray", "rays/s",
                "s to stratified's final PSNR", "time share data/sampling/network/render/backward"], rows),
        "",
        "1-minute load average at the start/end of each run: "
        + "; ".join(f"{k} {v.get('load_average_1min')}" for k, v in d["results"].items())
        + ". \"s to stratified's final PSNR\" comes from quick test-PSNR checks every 15 s of training.",
    ])  # fmt: skip


def codecs_section(d: dict[str, Any]) -> str:
    rows = [
        [field, name, f"{r['bytes_per_ray']:.2f}", f"{r['encode_mrays_per_s']:.0f}", f"{r['decode_mrays_per_s']:.0f}"]
        for field in ("pid", "rgba")
        for name, r in d[field].items()
    ]  # fmt: skip
    return "\n".join([
        "## Codecs of the Zarr backend",
        f"Command: `{_command(d.get('command', 'python benchmarks/bench_codecs.py'))}`",
        "",
        f"{d['rays']:,} train rays (15 chunks) of `{Path(d['store']).parent.name}`, one thread. Defaults: "
        "pid blosc-lz4-5 with bit shuffle, rgba blosc-lz4-9 without shuffle in 256 KiB blocks "
        "(`--rgba-codec lz4`; `zstd` is zstd-3) (docs/format.md).",
        "",
        _table(["field", "codec", "bytes/ray", "encode M rays/s", "decode M rays/s"], rows),
    ])  # fmt: skip


def _machines() -> str:
    """The machines the results were measured on, as each benchmark recorded it."""
    seen: dict[str, list[str]] = {}
    for name in ("loader", "convert", "trainer", "codecs"):
        data = _load(name)
        if data is not None and "machine" in data:
            seen.setdefault(describe_text(data["machine"]), []).append(name)
    return "; ".join(f"{text} ({', '.join(names)})" for text, names in seen.items()) or "not recorded"


def poses_section(d: dict[str, Any]) -> str:
    rows = [
        [
            f"{r['views']} x {r['size']}x{r['size']}",
            f"{r['registered']}/{r['views']} ({r['registered_fraction']:.0%})",
            f"{r['stages_s']['features']:.2f}",
            f"{r['stages_s']['matching']:.2f}",
            f"{r['stages_s']['mapping']:.2f}",
            f"{r['total_s']:.1f}",
            str(r["points"]),
            f"{r['reprojection_error_px']:.3f}",
            f"{r['rotation_error_deg']['median']:.3f} / {r['rotation_error_deg']['max']:.3f}",
            f"{100 * r['centre_error_rel']['median']:.3f} / {100 * r['centre_error_rel']['max']:.3f}",
            f"{r['loadavg_before']:.2f} / {r['loadavg_after']:.2f}",
        ]
        for r in d["runs"]
    ]
    return "\n".join([
        "## Camera poses with pycolmap (issue 16)",
        f"Command: `{_command(d['command'])}`",
        "",
        f"The textured built-in scene (cameras on two rings, PNG photos), `raykit poses` defaults "
        f"(exhaustive matching, SIMPLE_RADIAL, one shared camera), pycolmap {d['pycolmap']}, "
        f"{d['threads']} threads. Errors are against the true poses after the best similarity on camera "
        "centres; centre errors are relative to the largest distance between two cameras. The machine was "
        "shared with other work (load averages in the last column), so times are upper bounds.",
        "",
        _table(["photos", "registered", "features s", "matching s", "mapping s", "total s", "points",
                "reproj. px", "rotation err. deg (median / max)", "centre err. % (median / max)",
                "1-min load before / after"], rows),
    ])  # fmt: skip


def main() -> None:
    parts = [
        "# Benchmark tables",
        f"From `benchmarks/results/*.json`. Machine, as each benchmark measured it: {_machines()}.",
    ]
    for name, section in (
        ("loader", loader_section),
        ("convert", convert_section),
        ("trainer", trainer_section),
        ("codecs", codecs_section),
        ("poses", poses_section),
    ):
        data = _load(name)
        if data is not None:
            parts.append(section(data))
    cuda = _load("loader_cuda")
    if cuda is not None:
        parts.append(f"## CUDA loader\n```json\n{json.dumps(cuda, indent=1)[:2000]}\n```")
    print("\n\n".join(parts))


if __name__ == "__main__":
    main()
