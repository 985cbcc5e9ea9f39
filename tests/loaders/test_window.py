"""The windowed shuffle of images-layout splits: the pure plan, and the loader RayLoader returns for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from raykit.errors import ConfigError, ResumeError
from raykit.loaders import RayLoader, reference_batch
from raykit.loaders.window import WindowPlan, reference_epoch_rays
from raykit.loaders.windowed import WindowImage, gather_planned
from raykit.store import SceneInfo, write_store


def _fast(plan: WindowPlan, epoch: int) -> list[list[tuple[int, int]]]:
    return [
        [(i, int(px)) for i, lo, hi in pieces for px in plan.pixels(epoch, i, lo, hi)]
        for pieces in plan.iter_batches(epoch)
    ]


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=9),
    batch=st.integers(1, 50),
    window=st.integers(1, 5),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 2),
)
def test_plan_matches_reference_and_uses_every_ray_once(sizes, batch, window, seed, epoch) -> None:
    assume(sum(sizes) >= batch)
    plan = WindowPlan(tuple(sizes), batch, window, seed, drop_last=False)
    batches = _fast(plan, epoch)
    assert batches == reference_epoch_rays(plan, epoch)
    rays = [ray for b in batches for ray in b]
    assert sorted(rays) == sorted((i, p) for i, n in enumerate(sizes) for p in range(n))
    assert all(len(b) == batch for b in batches[:-1]) and len(batches[-1]) > 0


def test_window_holds_at_most_window_images() -> None:
    plan = WindowPlan((30,) * 12, 16, 3, seed=1)
    live: set[int] = set()
    used = {i: 0 for i in range(12)}
    for pieces in plan.iter_batches(0):
        for i, lo, hi in pieces:
            assert lo == used[i]
            used[i] = hi
            live.add(i)
        live = {i for i in live if used[i] < 30}
        assert len(live) <= 3


def test_batch_is_a_pure_function_and_depends_on_the_window() -> None:
    plan = WindowPlan((50, 40, 60, 50), 20, 2, seed=5)
    streamed = list(plan.iter_batches(3))
    assert [plan.batch_pieces(3, k) for k in range(plan.n_batches)] == streamed
    assert list(WindowPlan((50, 40, 60, 50), 20, 3, seed=5).iter_batches(3)) != streamed
    assert list(plan.iter_batches(4)) != streamed
    with pytest.raises(ConfigError, match="batch index"):
        plan.batch_pieces(0, plan.n_batches)


def test_ranks_are_disjoint_and_equal() -> None:
    sizes = (30, 30, 30, 30, 30, 30, 30)
    plans = [WindowPlan(sizes, 8, 2, seed=2, world_size=3, rank=r) for r in range(3)]
    orders = [set(p.image_order(1).tolist()) for p in plans]
    assert all(len(o) == 2 for o in orders) and not (orders[0] & orders[1] | orders[1] & orders[2])
    assert len({p.n_batches for p in plans}) == 1


def _load(seed: int, h: int, w: int, c: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


@pytest.fixture(scope="module")
def images_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import functools

    from raykit.cameras import Camera
    from raykit.store import ImageRecord

    records = []
    for i in range(10):
        w, h = (24, 16) if i % 3 else (20, 12)
        camera = Camera("PINHOLE", w, h, (30.0, 31.0, w / 2, h / 2))
        c2w = np.eye(4)
        c2w[:3, 3] = (0.1 * i, 0.0, 3.0)
        load = functools.partial(_load, i, h, w, 4 if i == 2 else 3)
        records.append(
            ImageRecord(f"im{i:02d}", "train" if i < 8 else "test", camera, c2w, 0.5, 6.0, "", load)
        )
    root = tmp_path_factory.mktemp("window")
    return write_store(root / "s", records, scene=SceneInfo(), layout="images", backend="wds")


def _key(batch: Any) -> torch.Tensor:
    return batch.image * 10_000 + batch.pixel[:, 1] * 100 + batch.pixel[:, 0]


def test_ray_loader_dispatches_and_rays_match_the_images(images_store) -> None:
    loader = RayLoader(images_store.url, "train", 100, seed=1, window_images=3, drop_last=False)
    assert isinstance(loader, RayLoader) and loader.strategy.name == "window"
    assert loader.plan.window_images == 3
    keys, n = [], images_store.splits["train"].n_rays
    images = {name: images_store.read_image(name) for name in images_store.images("train")}
    for batch in loader:
        keys.append(_key(batch))
        reference = reference_batch(images_store, _raw_of(images_store, batch, images))
        assert torch.equal(batch.origins, reference.origins) and torch.equal(batch.rgb, reference.rgb)
    assert len(torch.unique(torch.cat(keys))) == n == len(torch.cat(keys))
    assert loader.state_dict()["epoch"] == 1


def _raw_of(store: Any, batch: Any, images: dict[str, np.ndarray]) -> Any:
    from raykit.store.schema import RawRays

    names = store.table.names
    pairs = zip(batch.image.tolist(), batch.pixel.tolist(), strict=True)
    rgba = np.stack([images[names[i]][y, x] for i, (x, y) in pairs])
    offsets = store.table.pixel_offset[batch.image.numpy()]
    widths = store.table.width[batch.image.numpy()]
    pid = offsets + batch.pixel[:, 1].numpy() * widths + batch.pixel[:, 0].numpy()
    return RawRays(rgba, pid.astype(np.uint32))


def test_keywords_are_checked_as_on_a_rays_store(images_store) -> None:
    loader = RayLoader(images_store, batch_size=64, window_images=2)
    assert loader.plan.batch_size == 64 and loader.plan.window_images == 2
    assert len(next(iter(loader))) == 64
    with pytest.raises(TypeError, match="batch_sise"):
        RayLoader(images_store, batch_sise=64)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="window_images: expected an integer >= 1"):
        RayLoader(images_store, window_images=0)


def test_resume_is_exact_and_states_are_checked(images_store) -> None:
    first = RayLoader(images_store, "train", 64, seed=3, window_images=2)
    batches = [_key(b) for b in first]
    second = RayLoader(images_store, "train", 64, seed=3, window_images=2)
    second.load_state_dict({**first.state_dict(), "epoch": 0, "batch": 5})
    assert all(torch.equal(a, _key(b)) for a, b in zip(batches[5:], second, strict=True))
    other = RayLoader(images_store, "train", 64, seed=3, window_images=4)
    with pytest.raises(ResumeError, match="window_images"):
        other.load_state_dict(first.state_dict())
    with pytest.raises(ResumeError, match="strategy"):
        other.load_state_dict({**first.state_dict(), "strategy": None})
    earlier = {k: v for k, v in first.state_dict().items() if k != "draws"}  # per-batch draws
    with pytest.raises(ResumeError, match="draws"):
        second.load_state_dict(earlier)


@pytest.mark.slow
def test_same_batches_for_any_worker_count(images_store) -> None:
    serial = [_key(b) for b in RayLoader(images_store, "train", 64, seed=4, window_images=3)]
    with RayLoader(images_store, "train", 64, seed=4, window_images=3, num_workers=2) as loader:
        loader.wait_for_workers()
        parallel = [_key(b) for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(serial, parallel, strict=True))


def test_window_sized_from_cache_bytes(images_store) -> None:
    per_image = 24 * 16 * 4
    # The window and as many images decoded ahead of it fit (at least 4 ahead).
    loader = RayLoader(images_store, "train", 64, cache_bytes=10 * per_image)
    assert loader.plan.window_images == 5 and loader._lookahead() == 5
    assert RayLoader(images_store, "train", 64, cache_bytes=7 * per_image).plan.window_images == 7 - 4
    assert RayLoader(images_store, "train", 64, cache_bytes=0).plan.window_images == 1


def test_eval_split_reads_whole_images(images_store, tmp_path: Path) -> None:
    from raykit.loaders.eval import EvalLoader

    for image in EvalLoader(images_store, "test"):
        pixels = images_store.read_image(image.name)
        assert torch.allclose(image.rays.rgb, torch.from_numpy(pixels[..., :3].reshape(-1, 3)) / 255.0)


def test_stages_time_themselves(images_store) -> None:
    """The window strategy's steps are timed by the stages as they run (the profile's source)."""
    loader = RayLoader(images_store, batch_size=64, num_workers=0, window_images=2)
    assert list(loader.seconds) == ["wait", "read", "decode", "enter", "gather", "generate"]
    assert not any(loader.seconds.values())
    n = sum(1 for _ in loader)
    assert n == len(loader)
    assert all(loader.seconds[step] > 0 for step in ("read", "decode", "enter", "gather", "generate"))
    loader.close()


def test_bench_reports_the_images_layout(images_store, tmp_path: Path, capsys: Any) -> None:
    import argparse
    import json

    from raykit.profiling import cli

    parser = argparse.ArgumentParser(prog="raykit")
    cli.register(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "r.json"
    args = parser.parse_args(
        ["bench", images_store.url, "--batch-size", "64", "--batches", "8", "--json", str(out)]
    )
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    stages = report["stages"]
    assert report["layout"] == "images" and set(stages) == {"read", "decode", "enter", "gather", "generate"}
    assert all(stage["seconds"] > 1e-6 and stage["rays_per_s"] > 0 for stage in stages.values())
    assert 0 < report["decode_share"] < 1 and report["read_mb_per_s"] > 0
    assert report["shuffle_quality"]["ratio"] > 0.5
    assert "layout images" in capsys.readouterr().out


@pytest.mark.parametrize("channels", [3, 4])
@pytest.mark.parametrize("group", [1, 3, 7])
def test_gather_planned_matches_the_reference_rays(channels: int, group: int) -> None:
    """Grouped gathering (ranked images, slices) against the plan's per-ray reference twin."""
    sizes = (30, 30, 42, 17, 30, 25)
    plan = WindowPlan(sizes, 11, 3, seed=5, drop_last=False)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (n, channels), dtype=np.uint8) for n in sizes]
    offsets = np.cumsum([1000, *sizes[:-1]])
    for epoch in (0, 1):
        doubled = {}
        for n in set(sizes):
            base = plan.base_permutation(epoch, n).astype(np.uint32)
            doubled[n] = np.concatenate([base, base])
        window = {
            i: WindowImage.enter(images[i], int(offsets[i]), doubled[n], plan.rotation(epoch, i))
            for i, n in enumerate(sizes)
        }
        planned = [(p, {i: window[i] for i, _, _ in p}) for p in plan.iter_batches(epoch)]
        reference = reference_epoch_rays(plan, epoch)
        for g in range(0, len(planned), group):
            raw, lengths = gather_planned(planned[g : g + group])
            expected = [ray for batch in reference[g : g + group] for ray in batch]
            assert lengths == [len(b) for b in reference[g : g + group]]
            assert raw.pid.dtype == np.uint32 and raw.rgba.shape == (len(expected), channels)
            assert raw.pid.tolist() == [int(offsets[i]) + px for i, px in expected]
            assert np.array_equal(raw.rgba, np.stack([images[i][px] for i, px in expected]))
