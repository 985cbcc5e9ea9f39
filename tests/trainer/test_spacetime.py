"""The time-conditioned field (``--field kplanes``): the automatic choice, time reaching the field,
K-Planes' regularisers, the occupancy grid over time, exact resume and an export that verifies."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from raykit.errors import ConfigError, SourceError
from raykit.trainer import TrainConfig, train
from raykit.trainer.checkpoint import latest_checkpoint, load_checkpoint
from raykit.trainer.deploy import render_export, verify_export
from raykit.trainer.export import export_run
from raykit.trainer.field import RadianceField
from raykit.trainer.occupancy import OccupancyGrid
from raykit.trainer.spacetime import (
    TV_EVERY,
    SpaceTimeField,
    max_over_time,
    plane_tv,
    regularisation,
    time_smoothness,
)

from ..reliability.paused import start_paused
from .test_train import config_flags, tiny_config

AABB = torch.tensor([-1.0, -1.0, -1.0, 1.0, 1.0, 1.0])
SMALL = {"levels": 2, "base_resolution": 8, "max_resolution": 16, "features": 4, "hidden": 16, "seed": 3}


def _run(path: Path) -> dict[str, Any]:
    return json.loads((path / "run.json").read_text())


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "log.jsonl").read_text().splitlines()]


def _field_state(run: Path) -> dict[str, torch.Tensor]:
    path = latest_checkpoint(run)
    assert path is not None
    return load_checkpoint(path)[1]["field"]


def test_the_space_time_field_starts_as_the_static_field_and_depends_on_time() -> None:
    static = RadianceField(AABB, **SMALL)
    timed = SpaceTimeField(AABB, (0.0, 1.0), 5, **SMALL)
    assert all(torch.equal(a, b) for a, b in zip(static.planes, timed.planes, strict=True))  # same draws
    points = torch.rand(64, 3, generator=torch.Generator().manual_seed(0)) * 1.6 - 0.8
    directions = torch.nn.functional.normalize(torch.randn(64, 3), dim=-1)
    times = torch.rand(64)
    sigma, rgb = static(points, directions)
    sigma_t, rgb_t = timed(points, directions, times)
    assert torch.allclose(sigma, sigma_t, rtol=1e-5) and torch.allclose(rgb, rgb_t, atol=1e-6)  # planes at 1
    # Gradients reach the time planes, and once they move the output depends on time.
    sigma_t.sum().backward()
    assert all(float(p.grad.abs().sum()) > 0 for p in timed.time_planes)  # type: ignore[union-attr]
    with torch.no_grad():
        for p in timed.time_planes:
            p.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
    early = timed.density(points, torch.zeros(64))
    late = timed.density(points, torch.ones(64))
    assert not torch.allclose(early, late)
    with pytest.raises(ValueError, match="time"):
        timed.density(points)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_six_plane_lookup_equals_its_plain_twin_in_values_and_gradients(threads: int) -> None:
    """``plane_lookup`` (one autograd function for a level's six lookups and their product, in
    ``lookup_parts`` parts) against ``reference_lookup`` (autograd through each plane stack's
    ``plane_features``): the same features and plane gradients to float32 rounding, points inside
    and outside the box, times inside and outside the time range (clamped)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        timed = SpaceTimeField(AABB, (0.5, 2.0), 5, **SMALL)
        generator = torch.Generator().manual_seed(threads)
        with torch.no_grad():  # away from one, so that every factor's gradient differs
            for p in [*timed.planes, *timed.time_planes]:
                p.uniform_(0.5, 1.5, generator=generator)
        coords = torch.rand(300, 3, generator=generator) * 2.4 - 1.2
        times = torch.rand(300, generator=generator) * 2.0 + 0.25
        weights = torch.randn(300, 8, generator=generator)  # levels x features
        results = []
        for lookup in (timed.plane_lookup, timed.reference_lookup):
            timed.zero_grad(set_to_none=True)
            features = lookup(coords, times)
            (features * weights).sum().backward()
            grads = [p.grad for p in [*timed.planes, *timed.time_planes]]
            assert all(g is not None and float(g.abs().sum()) > 0 for g in grads)
            results.append((features.detach(), grads))
        (fast, fast_grads), (plain, plain_grads) = results
        assert fast.shape == (300, 8) and bool((fast == 0).any())  # some points outside the box
        assert torch.allclose(fast, plain, rtol=1e-6, atol=1e-7)
        for a, b in zip(fast_grads, plain_grads, strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), float((a - b).abs().max())
    finally:
        torch.set_num_threads(before)


def test_regularisers_vanish_on_smooth_planes_and_match_their_definitions() -> None:
    flat = torch.ones(3, 2, 5, 6)
    ramp = torch.linspace(0, 1, 5)[None, None, :, None].expand(3, 2, 5, 6)  # linear along time
    assert float(plane_tv([flat])) == 0.0 and float(time_smoothness([flat, ramp])) == pytest.approx(0.0)
    planes = torch.rand(3, 2, 5, 6, generator=torch.Generator().manual_seed(0))
    tv = sum(
        2 * ((p[:, 1:] - p[:, :-1]) ** 2).mean() + 2 * ((p[:, :, 1:] - p[:, :, :-1]) ** 2).mean()
        for p in planes
    )
    second = sum(((p[:, 2:] - 2 * p[:, 1:-1] + p[:, :-2]) ** 2).mean() for p in planes)
    assert float(plane_tv([planes])) == pytest.approx(float(tv), rel=1e-5)
    assert float(time_smoothness([planes])) == pytest.approx(float(second), rel=1e-5)
    timed = SpaceTimeField(AABB, (0.0, 1.0), 5, **SMALL)
    assert regularisation(RadianceField(AABB, **SMALL), 1e-4, 1e-3) is None  # the static field: none
    assert regularisation(timed, 0.0, 0.0) is None
    with torch.no_grad():  # the total variation every TV_EVERY steps, at TV_EVERY times its weight
        value = regularisation(timed, 1.0, 0.0, step=2 * TV_EVERY)
        assert value is not None and float(value) == pytest.approx(TV_EVERY * float(plane_tv(timed.planes)))
        assert regularisation(timed, 1.0, 0.0, step=TV_EVERY + 1) is None
        smooth = regularisation(timed, 1.0, 0.5, step=1)  # the smoothness along time every step
        assert smooth is not None and float(smooth) == pytest.approx(
            0.5 * float(time_smoothness(timed.time_planes))
        )


def test_occupancy_density_is_the_densest_of_the_stratified_times() -> None:
    def density(positions: torch.Tensor, times: torch.Tensor) -> torch.Tensor:  # content at time 0.9 only
        return torch.exp(-(((times - 0.9) / 0.05) ** 2)) * positions[:, 0]

    points = torch.rand(10, 3) + 0.5
    densest = max_over_time(density, torch.tensor([0.0, 1.0]), 4, None)(points)
    expected = torch.stack([density(points, torch.full((10,), t)) for t in (0.125, 0.375, 0.625, 0.875)])
    assert torch.equal(densest, expected.amax(0)) and bool((densest > 0.5 * points[:, 0]).all())
    jittered = max_over_time(density, torch.tensor([0.0, 1.0]), 4, torch.Generator().manual_seed(0))(points)
    assert jittered.shape == (10,) and bool((jittered >= 0).all())


def test_one_random_time_per_refresh_keeps_every_cell_that_moving_content_crosses() -> None:
    """The default --occ-time-samples 1: each refresh sees one time per cell, the grid's decaying
    maximum over refreshes covers time: a dense cell sweeping along x over time leaves every cell of
    its path occupied and no other (it is dense at each one an eighth of the time)."""

    def sweep(positions: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        cells = (positions * 8).floor()
        now = (times * 8).floor().clamp(max=7)
        on_path = (cells[:, 1] == 4) & (cells[:, 2] == 4)
        return 100.0 * (on_path & (cells[:, 0] == now)).float()

    grid = OccupancyGrid(torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0]), resolution=8)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        grid.refresh(max_over_time(sweep, torch.tensor([0.0, 1.0]), 1, generator), 0.1, generator)
    path = torch.zeros(8, 8, 8, dtype=torch.bool)
    path[:, 4, 4] = True
    assert torch.equal(grid.occupied.view(8, 8, 8), path)


def test_auto_picks_kplanes_on_a_dynamic_store_and_records_why(
    dnerf: dict[str, Any], tiny_store: Path, tmp_path: Path
) -> None:
    run = train(tiny_config(dnerf["rays"], tmp_path / "dynamic", steps=12, features=4))
    record, config = _run(run), json.loads((run / "config.json").read_text())
    assert config["field"] == "kplanes" and config["time_resolution"] == 3  # 6 distinct times, halved
    assert (
        record["field"]["kind"] == "kplanes"
        and "per-view times (6 distinct)" in record["field"]["kind_reason"]
    )
    assert record["field"]["time_range"] == [0.0, 1.0] and "densest" in record["field"]["sampler_over_time"]
    state = _field_state(run)  # the time planes learned (gradients reached them) and were checkpointed
    assert any(not torch.equal(state[k], torch.ones_like(state[k])) for k in state if "time_planes" in k)
    path = latest_checkpoint(run)  # the time planes step at --time-lr-scale times the schedule's rate
    assert path is not None and record["field"]["time_lr_scale"] == config["time_lr_scale"] == 4.0
    rest, timed = load_checkpoint(path)[1]["optimizer"]["param_groups"]
    assert len(timed["params"]) == 2 and timed["lr"] == rest["lr"] * 4.0 and rest["lr_scale"] == 1.0
    assert json.loads((run / "eval.json").read_text())["splits"]["test"]["psnr"] > 0

    static = train(tiny_config(tiny_store, tmp_path / "static"))
    explicit = train(tiny_config(tiny_store, tmp_path / "explicit", field="static"))
    assert json.loads((static / "config.json").read_text())["field"] == "static"
    assert "no per-view time" in _run(static)["field"]["kind_reason"]
    assert _losses(static) == _losses(explicit)  # auto on a static store is the static field's run
    with pytest.raises(ConfigError, match="--field kplanes needs per-view times"):
        train(tiny_config(tiny_store, tmp_path / "refused", field="kplanes"))


def test_kplanes_resume_after_sigkill_is_exact(dnerf: dict[str, Any], tmp_path: Path) -> None:
    store = dnerf["rays"]  # the occupancy sampler: its refreshes draw times from the saved generator
    config = tiny_config(store, tmp_path / "straight", sampler="occupancy", ckpt_every=2, features=4)
    straight = train(config)
    crashed = tmp_path / "crashed"
    config = config.replace(out=str(crashed))
    args = ["train", str(store), *config_flags(config)]
    proc, first = start_paused(f"{crashed}/checkpoints/step-*", args, os.environ.copy())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and latest_checkpoint(crashed) == Path(first)
    resumed = train(config.replace(resume=True))
    assert _losses(resumed) == _losses(straight)
    a, b = _field_state(straight), _field_state(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_kplanes_export_verifies_at_zero_difference(dnerf: dict[str, Any], tmp_path: Path) -> None:
    run = train(tiny_config(dnerf["rays"], tmp_path / "run", steps=10, features=4, sampler="occupancy"))
    out = export_run(run, tmp_path / "model")
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["scene"]["field"] == "kplanes" and manifest["scene"]["time_range"] == [0.0, 1.0]
    result = verify_export(out)
    assert result["difference_db"] == 0.0
    assert TrainConfig.from_dict(json.loads((out / "config.json").read_text())).field == "kplanes"
    # New cameras at given times: the capture's transforms file renders; a frame without a time is refused.
    transforms = json.loads((dnerf["capture"] / "transforms_test.json").read_text())
    frames, transforms = transforms["frames"][:2], {**transforms, "w": 32, "h": 32}  # images stay put
    (tmp_path / "timed.json").write_text(json.dumps({**transforms, "frames": frames}))
    figures = render_export(out, tmp_path / "timed.json", tmp_path / "renders")
    assert figures["n_images"] == 2 and len(list((tmp_path / "renders").glob("*.png"))) == 2
    untimed = [{k: v for k, v in frame.items() if k != "time"} for frame in frames]
    (tmp_path / "untimed.json").write_text(json.dumps({**transforms, "frames": untimed}))
    with pytest.raises(SourceError, match="time: expected a finite number"):
        render_export(out, tmp_path / "untimed.json", tmp_path / "refused")
