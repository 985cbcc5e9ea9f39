"""CPU milliseconds of a training step, static against kplanes, on the built-in dynamic scene (issue 59).

The benchmark scene of ``bench_dynamic_field.py`` (``--cameras`` 16, ``--moving`` 3, 12 times at
64x64, written as a D-NeRF capture and converted once under ``--work``), trained in this process for
``--steps`` steps at the trainer's defaults (occupancy sampler, 1024 rays a step) with ``--threads``
torch threads; the first ``--skip`` steps are not counted. Each step is the training loop's own
(batch, occupancy refresh on its schedule, sampling, field, compositing, losses, regularisers,
backward, Adam). Reported per step: the process's CPU time (all threads) and the wall time. On a
machine shared with other jobs the CPU time is the steadier of the two; compare two versions by
running them alternately (``PYTHONPATH``) and taking the ratio of each pair::

    PYTHONPATH=../base python benchmarks/bench_field_step.py --field kplanes
    PYTHONPATH=. python benchmarks/bench_field_step.py --field kplanes

``--forward-backward`` times the fields alone instead (:func:`forward_backward`): both default
fields in one process, the forward and backward of the samples of 1024 rays (32 each, through the
scene box, each ray at one of 12 times), CPU milliseconds, the median of 9 after a warm-up, the least
of 3 rounds, and the kplanes / static ratio.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def scene_store(work: Path, cameras: int, moving: int) -> Path:
    """The benchmark scene's store under ``work`` (made once)."""
    from raykit.converters import convert
    from raykit.testing import render_dynamic, write_dnerf

    store = work / f"dynamic_c{cameras}_m{moving}.zarr"
    if not store.exists():
        scene = render_dynamic(n_cameras=cameras, n_times=12, size=64, moving=moving)
        convert(write_dnerf(scene, work / f"dynamic_c{cameras}_m{moving}"), store)
    return store


def measure(store: Path, field: str, steps: int, skip: int, threads: int, seed: int = 0) -> dict[str, float]:
    """CPU and wall milliseconds a step over steps ``skip`` to ``steps``, and the last step's loss."""
    from raykit.trainer import TrainConfig, loop
    from raykit.trainer.occupancy import OccupancyGrid
    from raykit.trainer.setup import setup_run

    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig(store=str(store), out=out, field=field, steps=steps, seed=seed, threads=threads)
        run = setup_run(config)
        config = run.config
        loop._start(run)
        batches, background = run.loader.forever(), loop.parse_background(config.background)
        cpu = wall = 0.0
        loss = None
        for step in range(steps):
            cpu0, wall0 = time.process_time(), time.perf_counter()
            batch = next(batches)
            if isinstance(run.grid, OccupancyGrid) and step % config.occ_update_every == 0:
                loop._refresh_grid(run, step)
            loss, total, _ = loop.step_losses(
                config, run.model, run.field, run.grid, batch, background, step, run.jitter
            )
            run.optimizer.zero_grad(set_to_none=True)
            total.backward()
            run.optimizer.step()
            loop.planes_changed(p for group in run.optimizer.param_groups for p in group["params"])
            if step >= skip:
                cpu += time.process_time() - cpu0
                wall += time.perf_counter() - wall0
        run.loader.close()
    counted = steps - skip
    return {
        "cpu_ms_per_step": 1e3 * cpu / counted,
        "wall_ms_per_step": 1e3 * wall / counted,
        "last_loss": float(loss.detach()) if loss is not None else float("nan"),
    }


def forward_backward(threads: int, rays: int = 1024, samples: int = 32) -> dict[str, float]:
    """CPU milliseconds of the forward and backward of the static and the kplanes field (defaults,
    time resolution 6) at the samples of ``rays`` rays, ``samples`` each, on ``threads`` threads."""
    import statistics

    import torch

    from raykit.trainer.field import RadianceField
    from raykit.trainer.spacetime import SpaceTimeField

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    origins = torch.nn.functional.normalize(torch.randn(rays, 3, generator=gen), dim=-1) * 1.4
    dirs = torch.nn.functional.normalize(-origins + 0.3 * torch.randn(rays, 3, generator=gen), dim=-1)
    positions = (origins[:, None] + dirs[:, None] * torch.linspace(0, 2.8, samples)[None, :, None]).reshape(
        -1, 3
    )
    directions = dirs[:, None].expand(rays, samples, 3).reshape(-1, 3)
    times = (torch.randint(0, 12, (rays,), generator=gen).float() / 11).repeat_interleave(samples)
    aabb = torch.tensor([-1.5, -1.5, -1.5, 1.5, 1.5, 1.5])
    fields = {"static": RadianceField(aabb), "kplanes": SpaceTimeField(aabb, (0.0, 1.0), 6)}

    def once(name: str) -> float:
        field = fields[name]
        start = time.process_time()
        sigma, rgb = field(positions, directions, times if field.timed else None)
        (sigma.sum() + rgb.sum()).backward()
        return time.process_time() - start

    best: dict[str, float] = {}
    for _ in range(3):
        for name in fields:
            once(name)
            median = statistics.median(once(name) for _ in range(9))
            best[name] = min(best.get(name, median), median)
    return {
        "static_cpu_ms": 1e3 * best["static"],
        "kplanes_cpu_ms": 1e3 * best["kplanes"],
        "kplanes_over_static": best["kplanes"] / best["static"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--field", default="kplanes", choices=["kplanes", "static"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--skip", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cameras", type=int, default=16)
    parser.add_argument("--moving", type=int, default=3)
    parser.add_argument("--work", default=str(ROOT / "data"))
    parser.add_argument("--forward-backward", action="store_true", help="time the fields alone")
    parser.add_argument("--out", default=str(ROOT / "results" / "field_step.json"))
    args = parser.parse_args()
    if args.forward_backward:
        measured = {"benchmark": "field_forward_backward", "threads": args.threads}
        measured.update(forward_backward(args.threads))
        Path(args.out).write_text(json.dumps(measured, indent=2) + "\n")
        print(json.dumps(measured))
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    store = scene_store(work, args.cameras, args.moving)
    record = {
        "benchmark": "field_step",
        "field": args.field,
        "steps": args.steps,
        "skip": args.skip,
        "threads": args.threads,
        **measure(store, args.field, args.steps, args.skip, args.threads),
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
