"""``ImageLoader(sampling="loss")``: views drawn by the moving average of their fed-back losses, with a
uniform floor, probabilities on the batches, exact resume and the same views for any worker count."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from raykit.errors import ConfigError, ResumeError
from raykit.loaders import ImageLoader, ImagePlan, SamplingConfig
from raykit.loaders.image_views import LossViews


def _chi_square(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def test_draws_follow_the_loss_shares_with_the_floor() -> None:
    plan = ImagePlan(n_images=8, batch_size=1, seed=3)
    views = LossViews(plan, SamplingConfig(kind="loss", floor=0.25, decay=0.5))
    losses = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 0.5, 0.5, 0.0])
    views.observe(np.arange(7), losses[:7])  # view 7 never observed: it counts as the mean
    views.observe(np.array([1]), np.array([3.0]))  # 0.5 * 1 + 0.5 * 3
    ema = np.array([0.0, 2.0, 2.0, 3.0, 4.0, 0.5, 0.5, 0.0])
    ema[7] = ema[:7].mean()
    expected = 0.75 * ema / ema.sum() + 0.25 / 8
    np.testing.assert_allclose(views.probabilities(), expected)
    assert views.probabilities()[0] == pytest.approx(0.25 / 8)  # a zero-loss view keeps the floor
    epochs = 2000
    drawn = np.concatenate([views.epoch_views(e) for e in range(epochs)])
    assert len(drawn) == epochs * plan.per_rank
    counts = np.bincount(drawn, minlength=8)
    # 7 degrees of freedom: 24.3 is the 0.999 quantile; a wrong share (e.g. no floor) is far beyond
    assert _chi_square(counts, expected * len(drawn)) < 24.3
    half_floor = 0.5 * ema / ema.sum() + 0.5 / 8  # another floor is rejected by the same test
    assert _chi_square(counts, half_floor * len(drawn)) > 100
    np.testing.assert_allclose(views.epoch_probs(epochs - 1), expected[views.epoch_views(epochs - 1)])


def test_uniform_before_any_loss_and_floor_one_is_uniform() -> None:
    plan = ImagePlan(n_images=5, batch_size=1, seed=0)
    fresh = LossViews(plan, SamplingConfig(kind="loss"))
    np.testing.assert_allclose(fresh.probabilities(), np.full(5, 0.2))
    flat = LossViews(plan, SamplingConfig(kind="loss", floor=1.0))
    flat.observe(np.arange(5), np.array([9.0, 0, 0, 0, 1]))
    np.testing.assert_allclose(flat.probabilities(), np.full(5, 0.2))


def _losses(batch: Any) -> torch.Tensor:
    """A deterministic loss per view: large for some views, so the draws lean towards them."""
    return torch.tensor([float(int(n.split("_")[1].split(".")[0]) % 4) for n in batch.names])


def _run(loader: ImageLoader, epochs: int) -> list[tuple[tuple[str, ...], list[float]]]:
    seen = []
    for _ in range(epochs):
        for batch in loader:
            assert batch.prob is not None and batch.prob.shape == (len(batch),)
            seen.append((batch.names, batch.prob.tolist()))
            loader.observe(batch, _losses(batch))
    return seen


def test_loss_views_lean_towards_high_loss_and_report_their_probability(stores: dict[str, Any]) -> None:
    with ImageLoader(stores["zarr"], "train", seed=1, sampling="loss") as loader:
        first = [b for b in loader]
        assert all(b.prob is not None for b in first)
        n = loader.plan.n_images
        for batch in first:  # nothing observed yet: uniform
            torch.testing.assert_close(batch.prob, torch.full((1,), 1 / n))
            loader.observe(batch, _losses(batch))
        later = [b for _ in range(30) for b in loader if loader.observe(b, _losses(b)) is None]
        names = [b.names[0] for b in later]
        loss_of = {name: _losses(b).item() for b in later for name in b.names}
        high = sum(loss_of[name] == 3.0 for name in names) / len(names)
        low = sum(loss_of[name] == 0.0 for name in names) / len(names)
        assert high > 2 * low  # share 3/(mean 1.5) vs the floor alone
        planned = loader.views.probabilities()  # the next epoch is drawn from these
        position = {name: k for k, name in enumerate(loader.source.names)}
        for batch in loader:
            expected = torch.tensor([planned[position[name]] for name in batch.names], dtype=torch.float32)
            torch.testing.assert_close(batch.prob, expected)
    with ImageLoader(stores["zarr"], "train", seed=1) as uniform:
        assert all(b.prob is None for b in uniform)
        uniform.observe(next(iter(uniform)), torch.zeros(1))  # a no-op, shapes still checked


def test_resume_mid_run_is_exact(stores: dict[str, Any]) -> None:
    options = {"seed": 4, "batch_size": 2, "crop": (8, 8), "sampling": "loss"}
    with ImageLoader(stores["wds"], "train", **options) as loader:
        reference = _run(loader, 4)
    with ImageLoader(stores["wds"], "train", **options) as loader:
        head = _run(loader, 1)
        it = iter(loader)
        for _ in range(1):
            batch = next(it)
            head.append((batch.names, batch.prob.tolist()))
            loader.observe(batch, _losses(batch))
        state = json.loads(json.dumps(loader.state_dict()))
        del it
    assert state["views"]["kind"] == "loss" and state["view_sampling"]["kind"] == "loss"
    with ImageLoader(stores["wds"], "train", **options) as resumed:
        resumed.load_state_dict(state)
        rest = _run(resumed, 4)[: len(reference) - len(head)]
    assert head + rest == reference
    with pytest.raises(ResumeError):
        ImageLoader(stores["wds"], "train", seed=4, batch_size=2, crop=(8, 8)).load_state_dict(state)
    with pytest.raises(ResumeError, match="views"):
        bad = {**state, "views": {**state["views"], "ema": [1.0]}}
        ImageLoader(stores["wds"], "train", **options).load_state_dict(bad)


def test_workers_draw_the_same_views(stores: dict[str, Any]) -> None:
    def run(num_workers: int) -> list[Any]:
        with ImageLoader(stores["zarr"], "test", seed=7, num_workers=num_workers, cache_bytes=0,
                         sampling="loss") as loader:  # fmt: skip
            if num_workers:
                loader.wait_for_workers()
            return _run(loader, 3)

    assert run(0) == run(2)


def test_observe_with_wrong_losses_is_one_clear_error(stores: dict[str, Any]) -> None:
    with ImageLoader(stores["zarr"], "train", batch_size=2, sampling="loss") as loader:
        batch = next(iter(loader))
        for bad, problem in [
            (torch.zeros(3), r"shape \(2,\)"),
            (torch.zeros(2, 1), r"shape \(2,\)"),
            (np.array([1.0, np.nan]), "finite"),
            (np.array([1.0, -1.0]), ">= 0"),
        ]:
            with pytest.raises(ConfigError, match=problem):
                loader.observe(batch, bad)
    with pytest.raises(ConfigError, match="sampling"):
        ImageLoader(stores["zarr"], "train", sampling="importance")
