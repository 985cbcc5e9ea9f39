"""``raykit demo --dynamic``: the built-in dynamic scene beside the static one.

One stage, ``demo-dynamic``: render the built-in dynamic scene (one sphere moving; 4 cameras x 6
times, 32x32, ``raykit.testing.render_dynamic``), write it as a D-NeRF capture and convert it into
``OUT/dynamic``, then train the static field and the time-conditioned one (``--field static`` and
``kplanes``, the default sampler) for the same time, ``DemoPlan.dynamic_seconds`` each. The report's
section: both fields' test PSNR, test PSNR against scene time and the test camera over time, the ground
truth beside each field's render (``raykit.pipeline``'s plot and video of a dynamic run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from raykit.pipeline import Attempt, Stage, camera_video, plot_psnr_over_time, train_summary
from raykit.report import Figure, Section, Table, Video, para
from raykit.trainer import TrainConfig

__all__ = ["FIELDS", "dynamic_section", "dynamic_stage"]

FIELDS = ("static", "kplanes")
FIGURE, VIDEO = "dynamic_psnr_time.png", "dynamic_test_camera"


def dynamic_stage(
    out: Path, plan: Any, seed: int, command: list[str], base: TrainConfig | None = None
) -> Stage:
    """The ``demo-dynamic`` stage (see the module); its result is :func:`dynamic_section`'s input.
    ``base``: the trainer's other options (default: its defaults)."""
    root = out / "dynamic"
    base = base or TrainConfig()

    def run(attempt: Attempt) -> dict[str, Any]:
        from raykit.converters import convert
        from raykit.testing import render_dynamic, write_dnerf
        from raykit.trainer import train

        scene = render_dynamic(seed=seed)
        store = convert(write_dnerf(scene, root / "capture"), root / "store", overwrite=True)
        runs = {}
        for field in FIELDS:
            config = base.replace(
                store=store.url, out=str(root / "runs" / field), field=field, steps=1_000_000,
                max_seconds=plan.dynamic_seconds, seed=seed, eval_splits="test",
                threads=torch.get_num_threads(), progress=False,
            )  # fmt: skip
            summary = train_summary(train(config))
            runs[field] = {
                k: summary[k] for k in ("run_dir", "step", "psnr", "ssim", "frames", "ray_sampling")
            }
            runs[field]["field"] = field
        (out / "figures").mkdir(parents=True, exist_ok=True)
        plot_psnr_over_time(runs, out / "figures" / FIGURE)
        renders = {field: Path(r["run_dir"]) / "renders" / "test" for field, r in runs.items()}
        video = camera_video(store.url, runs, out / "figures", renders, VIDEO)
        views = {split: int(info.n_images) for split, info in store.splits.items()}
        return {"views": views, "seconds": plan.dynamic_seconds, "runs": runs, "video": video, "output": ""}

    inputs = {"seconds": plan.dynamic_seconds, "seed": seed, "train": base.to_dict()}
    made = (
        root,
        out / "figures" / FIGURE,
        out / "figures" / f"{VIDEO}.mp4",
        out / "figures" / f"{VIDEO}.gif",
    )
    return Stage("demo-dynamic", inputs, run, [*command, "--dynamic"], made, resumable=False)


def dynamic_section(result: dict[str, Any]) -> Section:
    """The report's section of the dynamic scene (``result``: the ``demo-dynamic`` stage's)."""
    runs, video = result["runs"], result["video"]
    rows = [[f, f"{r['psnr']:.2f}", f"{r['ssim']:.3f}", str(r["step"])] for f, r in runs.items()]
    views = ", ".join(f"{split} {n}" for split, n in result["views"].items())
    times = ", ".join(f"{t:.2f}" for t in video["times"])
    return Section("Dynamic scene", [
        para("The built-in dynamic scene (one sphere moving along x; 4 cameras x 6 times, 32x32, images "
             f"{views}) as a D-NeRF capture: the static field against the time-conditioned one (K-Planes' "
             f"space-time planes), {result['seconds']:.0f} s of training each, the default sampler."),
        Table(["field", "test PSNR dB", "SSIM", "steps"], rows),
        para("Test PSNR of each test frame against its scene time:"),
        Figure(FIGURE, "dynamic scene: test PSNR against scene time"),
        para(f"Test camera over time, {video['camera']} ({len(video['times'])} frames, scene times {times}): "
             f"{', '.join(video['columns'])}."),
        Video(Path(video["path"]).name, "dynamic scene: test camera over time"),
    ])  # fmt: skip
