"""The ``loss`` sampling stage: its draws against the map (chi-square), the floor, the probabilities,
resuming, worker counts, the byte bound; ``uniform`` stays the plans' order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.errors import ConfigError, ResumeError
from raykit.loaders import LoaderConfig, RayLoader
from raykit.loaders.loss_draws import LossSampler
from raykit.loaders.sampling import (
    MAP_BYTES_MAX,
    ErrorMap,
    ImageGeometry,
    SamplingConfig,
    map_bytes,
    map_grid,
)
from raykit.store import SceneInfo, open_store, write_store

from .conftest import make_records

SIZES = ((16, 8), (12, 12), (20, 6))  # (width, height) of the maps' test images


def _geometry() -> ImageGeometry:
    w = np.array([s[0] for s in SIZES])
    h = np.array([s[1] for s in SIZES])
    offsets = np.concatenate([[0], np.cumsum(w * h)[:-1]])
    return ImageGeometry(w, h, offsets, np.arange(len(SIZES)), len(SIZES))


def _sampler(floor: float, hot: float = 50.0) -> tuple[LossSampler, Any]:
    """A sampler whose map has learnt: image 0's left half and image 2's top rows cost ``hot``."""
    geometry = _geometry()
    errors = ErrorMap(geometry, 8, SamplingConfig("loss", grid=8, interval=1, floor=floor), lag=1)
    for i, (w, h) in enumerate(SIZES):
        y, x = np.divmod(np.arange(w * h), w)
        loss = np.where((i == 0) & (x < w // 2) | (i == 2) & (y < 2), hot, 1.0) * (1 + 0.1 * (y % 3))
        for _ in range(200):  # enough samples per image for the finest level
            errors.observe(np.full(w * h, i), y, x, loss)
    errors.settle(0)  # rebuild 1 (at batch 1 - lag = 0) captured
    return LossSampler(errors, seed=3, rank=0, world_size=1, n_batches=10), errors.snapshot(1)


def _expected(snapshot: Any, geometry: ImageGeometry, images: list[int], floor: float) -> np.ndarray:
    """Each pixel's probability of one draw, pixel by pixel from the map (no shared code path)."""
    est_a = _estimates(snapshot, images)
    return floor / len(est_a) + (1 - floor) * est_a / est_a.sum()


def _estimates(snapshot: Any, images: list[int]) -> np.ndarray:
    """The map's estimate at each pixel of ``images``, pixel by pixel."""
    est = []
    for i in images:
        w, h = SIZES[i]
        side = snapshot.side
        for p in range(w * h):
            y, x = divmod(p, w)
            cy, cx = y * side // h, x * side // w
            z = sum(((cy >> b) & 1) << (2 * b + 1) | ((cx >> b) & 1) << (2 * b) for b in range(8))
            est.append(float(snapshot.est[i, z]))
    return np.array(est)


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = counts.sum() * probs
    return float(((counts - expected) ** 2 / expected).sum())


def _bound(dof: int) -> float:
    return dof + 6 * np.sqrt(2 * dof)  # far beyond chance at a fixed seed, far below a wrong law


@pytest.mark.parametrize("floor", [0.0, 0.3])
def test_image_draws_follow_the_map_and_report_their_probability(floor: float) -> None:
    sampler, snapshot = _sampler(floor)
    assert snapshot.side == 8  # the level grew with the samples seen
    images = [0, 2]
    geometry = sampler.errors.geometry
    expected = _expected(snapshot, geometry, images, floor)
    starts = {0: 0, 2: SIZES[0][0] * SIZES[0][1]}
    counts = np.zeros(len(expected))
    for k in range(300):
        image, pixel, prob, weight = sampler.draw_images(
            snapshot, np.array(images), [(1000, sampler.rng(0, k))]
        )
        flat = np.array([starts[int(i)] for i in image]) + pixel
        np.testing.assert_allclose(prob, expected[flat], rtol=1e-5)  # what was drawn with
        np.testing.assert_allclose(weight, 1 / (len(expected) * expected[flat]), rtol=1e-5)
        counts += np.bincount(flat, minlength=len(expected))
    assert _chi2(counts, expected) < _bound(len(expected) - 1)
    uniform = np.full(len(expected), 1 / len(expected))
    assert _chi2(counts, uniform) > 10 * _bound(len(expected) - 1)  # the test can tell


def test_window_draws_follow_the_map_within_the_window() -> None:
    """The rays layout: the window's rays (a subset, some pixels twice) by their cells' estimates."""
    sampler, snapshot = _sampler(0.25)
    geometry = sampler.errors.geometry
    rng = np.random.default_rng(0)
    pid = rng.integers(0, int(geometry.n_pixels.sum()), 300).astype(np.uint32)

    class Window:
        def __init__(self) -> None:
            self.pid = pid

    window = Window()
    image, pixel = geometry.image_pixel_of_pid(pid)
    every = {i: _estimates(snapshot, [i]) for i in range(len(SIZES))}
    est = np.array([every[int(i)][int(p)] for i, p in zip(image, pixel, strict=True)])
    expected = 0.25 / len(pid) + 0.75 * est / est.sum()
    counts = np.zeros(len(pid))
    for k in range(200):
        index, prob, _ = sampler.draw_window(snapshot, window, [(1000, sampler.rng(1, k))])
        np.testing.assert_allclose(prob, expected[index], rtol=1e-5)
        counts += np.bincount(index, minlength=len(pid))
    assert _chi2(counts, expected) < _bound(len(pid) - 1)
    assert _chi2(counts, np.full(len(pid), 1 / len(pid))) > 10 * _bound(len(pid) - 1)


def test_batches_drawn_together_are_those_drawn_one_by_one() -> None:
    """Several batches' requests in one draw (a group's, on a generation thread) give each batch the
    rays, probabilities and weights it gets alone: each keeps its own generator's numbers."""
    sampler, snapshot = _sampler(0.3)
    images = np.array([0, 2])

    class Window:
        pid = np.random.default_rng(1).integers(0, int(sampler.errors.geometry.n_pixels.sum()), 200)

    sizes = [50, 37, 64]
    for draw, source in ((sampler.draw_images, images), (sampler.draw_window, Window())):
        together = draw(snapshot, source, [(n, sampler.rng(5, k)) for k, n in enumerate(sizes)])
        alone = [draw(snapshot, source, [(n, sampler.rng(5, k))]) for k, n in enumerate(sizes)]
        for joined, parts in zip(together, zip(*alone, strict=True), strict=True):
            np.testing.assert_array_equal(joined, np.concatenate(parts))


@pytest.mark.parametrize("floor", [0.0, 0.5])
def test_the_floor_is_drawn_uniformly(floor: float) -> None:
    """With the error in a few cells, a ``floor`` share of every batch is still uniform: that share
    lands on the cold pixels as often as they are many, the rest almost never."""
    sampler, snapshot = _sampler(floor, hot=1e7)
    images = np.array([0, 1, 2])
    importance = _expected(snapshot, sampler.errors.geometry, [0, 1, 2], 0.0)
    cold = importance < 0.1 / len(importance)
    starts = np.concatenate([[0], np.cumsum(sampler.errors.geometry.n_pixels)[:-1]])
    n_uniform = round(floor * 1000)
    head, tail = [], []
    for k in range(50):
        image, pixel, _, _ = sampler.draw_images(snapshot, images, [(1000, sampler.rng(2, k))])
        flat = starts[image] + pixel
        head.append(cold[flat[:n_uniform]])
        tail.append(cold[flat[n_uniform:]])
    cold_share = cold.mean()
    assert 0.3 < cold_share < 0.9
    if floor:
        seen = np.concatenate(head).mean()
        assert abs(seen - cold_share) < 4 * np.sqrt(cold_share * (1 - cold_share) / (50 * n_uniform))
    drawn = np.concatenate(tail)
    share = float(importance[cold].sum())  # what the importance draws leave on the cold pixels
    assert share < 0.02 and abs(drawn.mean() - share) < 4 * np.sqrt(max(share, 1e-4) / len(drawn))


def test_map_bytes_are_bounded_at_2010_photos_of_1080p() -> None:
    grid = map_grid(2010, 64)
    assert map_bytes(2010, grid) <= MAP_BYTES_MAX == 128 * 10**6
    assert grid == 32 and map_bytes(2010, 32) == 2010 * 32 * 32 * 16  # 33 MB
    assert map_bytes(2010, 64) > MAP_BYTES_MAX  # why it halved
    assert map_grid(67, 64) == 64  # a phone capture keeps the finest grid
    errors = ErrorMap(_geometry(), 8, SamplingConfig("loss", grid=8), lag=1)
    errors.settle(10**6)
    held = errors.sums.nbytes + errors.counts.nbytes + sum(s.est.nbytes for s in errors.snapshots.values())
    assert held <= errors.nbytes


def test_sampling_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="sampling: expected one of uniform, loss"):
        LoaderConfig(sampling="lossy")
    with pytest.raises(ConfigError, match="floor"):
        LoaderConfig(sampling={"kind": "loss", "floor": 1.5})
    with pytest.raises(ConfigError, match="power of two"):
        SamplingConfig("loss", grid=48)
    assert LoaderConfig(sampling="loss").sampler == SamplingConfig("loss")


# ---- the loader -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root: Path = tmp_path_factory.mktemp("sampling")
    records = make_records(6, 2)
    write_store(root / "rays", records, scene=SceneInfo(), backend="zarr", chunk_rays=128, shard_chunks=4)
    write_store(root / "images", records, scene=SceneInfo(), backend="zarr", layout="images")
    return {layout: open_store(root / layout) for layout in ("rays", "images")}


def _loss_of(batch: Any) -> Any:
    """A deterministic per-ray loss: high on the images' right halves and on image 3."""
    return (batch.pixel[:, 0] > 12).float() * 4 + (batch.image == 3).float() * 8 + 0.5


def _keys(batch: Any) -> np.ndarray:
    """Each ray as ``image * 10^6 + y * 1000 + x``."""
    return batch.image.numpy() * 10**6 + batch.pixel[:, 1].numpy() * 1000 + batch.pixel[:, 0].numpy()


def _run(loader: RayLoader, n: int, observe: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for batch in loader.forever():
        if observe:
            loader.observe(batch, _loss_of(batch))
        out.append((_keys(batch), batch.extra["prob"].numpy().copy()))
        if len(out) == n:
            return out
    raise AssertionError("unreachable")


_KW = {"batch_size": 64, "seed": 4, "sampling": {"kind": "loss", "interval": 3}, "group_rays": 128}


@pytest.mark.parametrize("layout", ["rays", "images"])
def test_same_losses_same_batches_for_any_workers_and_the_map_follows_the_loss(
    two_layouts: dict[str, Any], layout: str
) -> None:
    store = two_layouts[layout]
    loaders = [RayLoader(store, num_workers=w, **_KW) for w in (0, 2)]
    runs = [_run(loader, 40) for loader in loaders]
    for (a, pa), (b, pb) in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(pa, pb)
    assert loaders[0].sampler is not None and loaders[0].sampler.errors.rebuilds >= 5
    late = np.concatenate([keys for keys, _ in runs[0][20:]])
    hot = ((late % 1000) > 12) | (late // 10**6 == 3)
    assert hot.mean() > 0.55  # uniform: about 0.45 of these images' pixels (0.59-0.65 by seed)
    blind = _run(RayLoader(store, num_workers=0, **_KW), 40, observe=False)
    assert any((a != b).any() for (a, _), (b, _) in zip(runs[0], blind, strict=True))
    for loader in loaders:
        loader.close()


def test_the_sampling_map_shows_where_the_rays_go(two_layouts: dict[str, Any]) -> None:
    """``sampling_map``: draws per pixel relative to uniform, averaging 1 over the split; higher where
    the loss is (image 3, the right halves); uniform sampling has none; another split's image is refused."""
    store = two_layouts["images"]
    loader = RayLoader(store, num_workers=0, **_KW)
    rows = [int(r) for r in store.split_rows(loader.split)]
    flat = [loader.sampling_map(r) for r in rows]
    assert all(np.allclose(m, 1.0) for m in flat if m is not None)  # before any rebuild: uniform
    _run(loader, 40)
    maps = {r: loader.sampling_map(r) for r in rows}
    total = sum(float(m.sum()) for m in maps.values() if m is not None)
    assert total == pytest.approx(sum(m.size for m in maps.values() if m is not None), rel=1e-4)
    cold = next(r for r in rows if r != 3)
    assert maps[3] is not None and maps[cold] is not None
    assert maps[3].mean() > 1.5 * maps[cold].mean()
    assert maps[cold][:, 16:].mean() > 1.5 * maps[cold][:, :8].mean()
    other = sorted(set(range(len(store.table.names))) - set(rows))
    if other:
        with pytest.raises(ConfigError, match="not in split"):
            loader.sampling_map(other[0])
    loader.close()
    plain = RayLoader(store, num_workers=0, **{**_KW, "sampling": "uniform"})
    assert plain.sampling_map(rows[0]) is None
    plain.close()


@pytest.mark.parametrize("layout", ["rays", "images"])
def test_a_resumed_loader_continues_exactly(two_layouts: dict[str, Any], layout: str) -> None:
    store = two_layouts[layout]
    first = RayLoader(store, num_workers=0, **_KW)
    n_batches = len(first)
    whole: list[Any] = []
    state: dict[str, Any] = {}
    for batch in first.forever():
        first.observe(batch, _loss_of(batch))
        whole.append(
            batch.image.numpy() * 10**6 + batch.pixel[:, 1].numpy() * 1000 + batch.pixel[:, 0].numpy()
        )
        if len(whole) == n_batches + 7:  # mid-epoch, after several rebuilds
            state = json.loads(json.dumps(first.state_dict()))  # JSON-able
        if len(whole) == n_batches + 30:
            break
    first.close()
    resumed = RayLoader(store, num_workers=2, **_KW)
    resumed.load_state_dict(state)
    rest = _run(resumed, 23)
    for (keys, _), expected in zip(rest, whole[n_batches + 7 :], strict=True):
        np.testing.assert_array_equal(keys, expected)
    resumed.close()
    plain = RayLoader(store, num_workers=0, **{**_KW, "sampling": "uniform"})
    with pytest.raises(ResumeError):
        plain.load_state_dict(state)
    plain.close()


def test_maps_come_out_of_the_cache_budget(two_layouts: dict[str, Any]) -> None:
    store = two_layouts["rays"]
    uniform = RayLoader(store, batch_size=64, num_workers=0, cache_bytes=1 << 20)
    loss = RayLoader(store, batch_size=64, num_workers=0, cache_bytes=1 << 20, sampling="loss")
    assert loss.sampler is not None and uniform.sampler is None
    assert uniform.cache.capacity - loss.cache.capacity == loss.sampler.errors.nbytes > 0
    batch = next(iter(uniform))
    uniform.observe(batch, np.ones(len(batch)))  # a no-op for uniform
    assert "prob" not in batch.extra
    with pytest.raises(ConfigError, match="one per ray"):
        loss.observe(batch, np.ones(3))
    uniform.close()
    loss.close()


_DIGESTS = {
    "rays": "1cbe60bcfd261d78c8ad8556570fb2d314c0adf6567d8235a3846ef95a11d0a8",
    "images": "1dd087b760dd7f82db376ea88edbaaf0ec643e454d5f97c06a97d7bc5735a06c",
}  # sha256 of 30 batches' keys, colours, probabilities and weights


@pytest.mark.parametrize("layout", ["rays", "images"])
def test_batches_are_pinned_by_a_digest(two_layouts: dict[str, Any], layout: str) -> None:
    """The drawn batches of a fixed seed and losses, bit for bit: a faster draw or gather must not
    change which rays are drawn, their colours or their probabilities."""
    import hashlib

    loader = RayLoader(two_layouts[layout], num_workers=0, **_KW)
    digest = hashlib.sha256()
    for i, batch in enumerate(loader.forever()):
        loader.observe(batch, _loss_of(batch))
        for part in (
            _keys(batch),
            batch.rgb.numpy(),
            batch.extra["prob"].numpy(),
            batch.extra["weight"].numpy(),
        ):
            digest.update(np.ascontiguousarray(part).tobytes())
        if i == 29:
            break
    loader.close()
    assert digest.hexdigest() == _DIGESTS[layout]


@pytest.mark.parametrize("layout", ["rays", "images"])
def test_images_of_two_sizes_give_each_ray_its_own_colour(tmp_path: Path, layout: str) -> None:
    """Per-size tables (cells) and per-size rank orders (the images layout's gather): every drawn
    ray's colour is its image's pixel, with images of two sizes in one split."""
    import dataclasses

    small = [dataclasses.replace(r, name=f"s_{r.name}") for r in make_records(3, 0, width=20, height=12)]
    records = make_records(3, 0) + small
    store = write_store(tmp_path / layout, records, scene=SceneInfo(), backend="zarr", layout=layout,
                        **({"chunk_rays": 128} if layout == "rays" else {}))  # fmt: skip
    loader = RayLoader(store, num_workers=0, **{**_KW, "split": "train"})
    pixels = {row: store.image_raw(name).rgba for row, name in enumerate(store.table.names)}
    seen = set()
    for i, batch in enumerate(loader.forever()):
        loader.observe(batch, _loss_of(batch))
        image, xy = batch.image.numpy(), batch.pixel.numpy()
        for row in np.unique(image).tolist():
            here = image == row
            width = int(store.table.width[row])
            expected = pixels[row][xy[here, 1] * width + xy[here, 0], :3] / 255.0
            np.testing.assert_allclose(batch.rgb.numpy()[here], expected, atol=1e-6)
            seen.add(width)
        if i == 12:  # past a few rebuilds (interval 3)
            break
    loader.close()
    assert seen == {20, 24}
