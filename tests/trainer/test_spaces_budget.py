"""Scene spaces end to end, the proposal sampler's checkpointed state, and the samples budget per step."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raykit.cameras import Camera
from raykit.rays import RayBatch
from raykit.store import ImageRecord, SceneInfo, write_store
from raykit.testing import render_scene
from raykit.trainer import TrainConfig, compare, render, train
from raykit.trainer.budget import SampleBudget, concat_batches
from raykit.trainer.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from raykit.trainer.defaults import resolve_resolution

from .conftest import SIZE, ball_image
from .test_train import TINY

SMALL = {
    **{k: v for k, v in TINY.items() if k not in ("n_samples", "hier_coarse", "hier_fine")},
    "prop_samples": "16,8",
    "prop_final": 8,
    "prop_resolution": 16,
}


def _config(store: Path, out: Path, **changes: Any) -> TrainConfig:
    return TrainConfig(store=str(store), out=str(out), **{**SMALL, **changes})


def _log(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def _pixels(image: np.ndarray) -> np.ndarray:
    return image


@pytest.fixture(scope="module")
def unbounded_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny unbounded variant of the built-in scene as a Zarr store (bounds enclose the sky dome)."""
    scene = render_scene("tiny", seed=0, unbounded=True)
    records = [
        ImageRecord(name, split, scene.camera, scene.c2w[i], float(scene.near[i]), float(scene.far[i]),
                    f"builtin://{name}", functools.partial(_pixels, scene.images[i]))
        for i, (name, split) in enumerate(zip(scene.names, scene.splits, strict=True))
    ]  # fmt: skip
    bounds = (tuple(scene.bounds[0].tolist()), tuple(scene.bounds[1].tolist()))
    path = tmp_path_factory.mktemp("unbounded") / "store"
    write_store(path, records, scene=SceneInfo(bounds=bounds), backend="zarr", chunk_rays=512)
    return path


def test_budget_controller_keeps_samples_per_step_near_the_target() -> None:
    target, granule = 20_000, 32
    budget = SampleBudget.start(target, granule, max_samples_per_ray=256)
    assert budget.rays * 256 <= target + granule * 256  # the first step cannot overshoot
    rng = np.random.default_rng(0)
    per_step = []
    for step in range(300):
        spr = 8.0 + 120.0 * np.exp(-step / 30.0)  # a sampler that prunes more and more (occupancy)
        rays = budget.rays
        samples = int(rays * spr * rng.uniform(0.9, 1.1))
        per_step.append(samples)
        budget.update(rays, samples)
    after = np.array(per_step[60:])
    assert abs(after.mean() / target - 1) < 0.05 and np.abs(after / target - 1).max() < 0.3
    state = json.loads(json.dumps(budget.state_dict()))
    again = SampleBudget.start(target, granule, 256)
    again.load_state_dict(state)
    assert again == budget and again.update(640, 10_000) == budget.update(640, 10_000)


def test_samples_per_step_adapts_rays_and_memory_stays_flat(tiny_store: Path, tmp_path: Path) -> None:
    config = _config(tiny_store, tmp_path / "b", sampler="occupancy", steps=40, samples_per_step=3000,
                     budget_granule=16, log_every=4)  # fmt: skip
    run = train(config)
    records = _log(run)
    assert all({"rays_per_step", "samples_per_step", "step_memory_mb"} <= set(r) for r in records)
    assert len({r["rays_per_step"] for r in records}) > 1  # the rays per step adapted
    after = records[len(records) // 4 :]
    mean = sum(r["samples_per_step"] for r in after) / len(after)
    assert abs(mean / 3000 - 1) < 0.25, [r["samples_per_step"] for r in records]
    memory = [r["step_memory_mb"] for r in after]
    assert min(memory) > 0 and (max(memory) - min(memory)) / min(memory) <= 0.10
    rows = {(row.split, row.metric): row for row in compare(run, run)}
    assert rows[("train", "samples_per_step")].a == records[-1]["samples_per_step"]
    assert rows[("train", "rays_per_step")].delta == 0


def test_proposal_budget_run_resumes_exactly_with_its_networks(tiny_store: Path, tmp_path: Path) -> None:
    config = _config(tiny_store, tmp_path / "straight", sampler="proposal", samples_per_step=900,
                     budget_granule=16, keep_checkpoints=3)  # fmt: skip
    straight = train(config)
    meta, tensors = load_checkpoint(latest_checkpoint(straight))  # type: ignore[arg-type]
    assert any(key.startswith("nets.") for key in tensors["grid"])  # the proposal networks are saved
    assert "budget" in meta.extra
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    for path in list_checkpoints(resumed)[1:]:  # back to the step-4 checkpoint, as after a crash
        shutil.rmtree(path)
    train(config.replace(out=str(resumed), resume=True))
    assert [r["loss"] for r in _log(resumed)] == [r["loss"] for r in _log(straight)]
    a = load_checkpoint(latest_checkpoint(straight))[1]  # type: ignore[arg-type]
    b = load_checkpoint(latest_checkpoint(resumed))[1]  # type: ignore[arg-type]
    for part in ("field", "grid"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part])


@pytest.mark.parametrize("sampler", ["occupancy", "proposal"])
def test_unbounded_store_picks_contraction_and_renders_back(
    unbounded_store: Path, tmp_path: Path, sampler: str
) -> None:
    run = train(_config(unbounded_store, tmp_path / sampler, sampler=sampler, steps=30, lr=3e-2))
    assert json.loads((run / "config.json").read_text())["scene_space"] == "contract"
    space = json.loads((run / "run.json").read_text())["scene_space"]
    assert space["mode"] == "contract" and "inside the scene bounds" in space["reason"]
    radius = (np.array(space["aabb"][3:]) - np.array(space["aabb"][:3])).max() / 2
    assert radius == pytest.approx(4.0, rel=1e-3)  # the ball through the cameras (distance 4)
    losses = [r["loss"] for r in _log(run)]
    assert sum(losses[-5:]) < sum(losses[:5])
    trained = json.loads((run / "eval.json").read_text())["splits"]["test"]["psnr"]
    again = render(run, "test")["splits"]["test"]["psnr"]
    assert again == pytest.approx(trained, abs=1e-6)  # the sampler state came back from the checkpoint


def test_sampler_auto_follows_the_scene_space(
    unbounded_store: Path, tiny_store: Path, tmp_path: Path
) -> None:
    """The default ``--sampler auto`` picks per scene space; the choice is in config.json, why in run.json."""
    assert TrainConfig().sampler == "auto"
    for store, space, sampler in (
        (unbounded_store, "contract", "proposal"),
        (tiny_store, "box", "occupancy"),
    ):
        run = train(_config(store, tmp_path / space, steps=2))
        config = json.loads((run / "config.json").read_text())
        assert (config["scene_space"], config["sampler"]) == (space, sampler)
        choice = json.loads((run / "run.json").read_text())["sampler"]
        assert choice["name"] == sampler and f"scene space {space}" in choice["reason"]
        field = json.loads((run / "run.json").read_text())["field"]
        assert field["max_resolution"] == config["max_resolution"] and field["reason"]
        assert (run / "eval.json").exists()
    run = train(_config(unbounded_store, tmp_path / "explicit", sampler="stratified", steps=1, n_samples=8))
    assert json.loads((run / "run.json").read_text())["sampler"] == {
        "name": "stratified", "reason": "chosen with --sampler"
    }  # fmt: skip


def _opaque_ball(c2w_flat: tuple[float, ...], size: int) -> np.ndarray:
    return ball_image(c2w_flat, size, True)[..., :3]  # RGB: an opaque photo, no alpha


def test_background_auto_is_black_for_opaque_photos_white_with_alpha(
    tiny_store: Path, tmp_path: Path
) -> None:
    camera = Camera("PINHOLE", SIZE, SIZE, (SIZE * 1.2, SIZE * 1.2, SIZE / 2, SIZE / 2))
    records = []
    for i in range(4):
        c2w = np.eye(4)
        c2w[:3, :3] = np.array([[1.0, 0, 0], [0, 0, 1], [0, -1, 0]]).T
        c2w[:3, 3] = [0.2 * i - 0.3, -2.5, 0.0]
        load = functools.partial(_opaque_ball, tuple(c2w.ravel()), SIZE)
        records.append(
            ImageRecord(f"p_{i}.jpg", "test" if i == 3 else "train", camera, c2w, 1.5, 4.0, "", load)
        )
    opaque = tmp_path / "opaque"
    write_store(opaque, records, scene=SceneInfo(), backend="zarr", chunk_rays=128)
    assert TrainConfig().background == "auto"
    for store, colour, why in ((opaque, "black", "opaque photos"), (tiny_store, "white", "with alpha")):
        run = train(_config(store, tmp_path / colour, sampler="stratified", steps=2, n_samples=8))
        assert json.loads((run / "config.json").read_text())["background"] == colour
        choice = json.loads((run / "run.json").read_text())["background"]
        assert choice["colour"] == colour and why in choice["reason"]
    run = train(
        _config(opaque, tmp_path / "set", sampler="stratified", steps=1, n_samples=8, background="white")
    )
    assert json.loads((run / "run.json").read_text())["background"]["reason"] == "chosen with --background"


def test_scene_space_override_is_kept(unbounded_store: Path, tmp_path: Path) -> None:
    run = train(_config(unbounded_store, tmp_path / "box", sampler="stratified", scene_space="box",
                        steps=2, n_samples=8))  # fmt: skip
    assert json.loads((run / "config.json").read_text())["scene_space"] == "box"
    aabb = json.loads((run / "run.json").read_text())["aabb"]
    assert aabb == [-30.0, -30.0, -30.0, 30.0, 30.0, 30.0]  # the store's bounds, uncontracted


@pytest.fixture(scope="module")
def facing_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A forward-facing capture of the conftest ball: 12 cameras on a small plane, all looking along +y."""
    camera = Camera("PINHOLE", SIZE, SIZE, (SIZE * 1.2, SIZE * 1.2, SIZE / 2, SIZE / 2))
    records = []
    for i in range(12):
        c2w = np.eye(4)
        c2w[:3, :3] = np.array([[1.0, 0, 0], [0, 0, 1], [0, -1, 0]]).T  # x right, y down = -z, z forward = +y
        c2w[:3, 3] = [0.25 * (i % 4) - 0.4, -2.5, 0.2 * (i // 4) - 0.2]
        load = functools.partial(ball_image, tuple(c2w.ravel()), SIZE, True)
        split = "test" if i in (5, 10) else "train"
        records.append(ImageRecord(f"f_{i:02d}.png", split, camera, c2w, 1.5, 4.0, f"mem://{i}", load))
    path = tmp_path_factory.mktemp("facing") / "store"
    write_store(path, records, scene=SceneInfo(), backend="zarr", chunk_rays=128)
    return path


@pytest.mark.parametrize("sampler", ["hierarchical", "occupancy"])
def test_forward_facing_store_picks_ndc(facing_store: Path, tmp_path: Path, sampler: str) -> None:
    """NDC is detected and recorded; both a density-guided sampler and the occupancy marcher (with its
    early-stop pass, evaluated on NDC positions) train in it, and a re-render matches the run's eval."""
    run = train(_config(facing_store, tmp_path / "ndc", sampler=sampler, steps=30, lr=3e-2,
                        hier_coarse=12, hier_fine=12))  # fmt: skip
    assert json.loads((run / "config.json").read_text())["scene_space"] == "ndc"
    frame = json.loads((run / "run.json").read_text())["scene_space"]["ndc_frame"]
    assert frame[16] == pytest.approx(0.9 * 1.5)  # the near plane: 0.9 x the smallest near bound
    losses = [r["loss"] for r in _log(run)]
    assert sum(losses[-5:]) < sum(losses[:5])
    assert "ndc_frame" in load_checkpoint(latest_checkpoint(run))[1]["field"]  # type: ignore[arg-type]
    trained = json.loads((run / "eval.json").read_text())["splits"]["test"]["psnr"]
    assert render(run, "test")["splits"]["test"]["psnr"] == pytest.approx(trained, abs=1e-6)


def test_concat_batches_inverts_split_extra_fields_included() -> None:
    n = 10
    g = torch.Generator().manual_seed(0)
    batch = RayBatch(
        origins=torch.rand(n, 3, generator=g), directions=torch.rand(n, 3, generator=g),
        rgb=torch.rand(n, 3, generator=g), alpha=None, image=torch.arange(n), pixel=torch.zeros(n, 2).long(),
        near=torch.rand(n, generator=g), far=torch.rand(n, generator=g), z_scale=torch.rand(n, generator=g),
        extra={"origins": torch.rand(n, 3, generator=g)},
    )  # fmt: skip
    whole = concat_batches(batch.split([4, 6]))
    assert whole.alpha is None and set(whole.extra) == {"origins"}
    torch.testing.assert_close(whole.extra["origins"], batch.extra["origins"], rtol=0, atol=0)
    for name in ("origins", "rgb", "image", "z_scale"):
        torch.testing.assert_close(getattr(whole, name), getattr(batch, name), rtol=0, atol=0)


def test_field_resolution_follows_the_scene_space() -> None:
    """Unset, the finest plane is 256 in a box and 512 contracted (the unit ball gets half the planes)."""
    for space, value in (("box", 256), ("auto", 256), ("ndc", 256), ("contract", 512)):
        config, reason = resolve_resolution(TrainConfig(scene_space=space))
        assert config.max_resolution == value and "--max-resolution unset" in reason
    config, reason = resolve_resolution(TrainConfig(scene_space="contract", max_resolution=64))
    assert (config.max_resolution, reason) == (64, "chosen with --max-resolution")
