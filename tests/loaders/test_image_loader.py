"""``ImageLoader``: whole images with cameras, seeded order, ranks, exact resume, workers, crops, cache."""

from __future__ import annotations

import functools
import inspect
import json
import mmap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raykit.cameras import Camera, pixels_to_rays
from raykit.errors import ConfigError, ResumeError
from raykit.image_geometry import RemapTable, reference_remap, undistortion_coordinates
from raykit.loaders import ImageBatch, ImageLoader, ImageLoaderConfig
from raykit.rays import unit_colours
from raykit.store import ImageRecord, SceneInfo, write_store


def _pixels(store: Any, name: str) -> np.ndarray:
    """The synthetic image of ``name`` as the conftest made it (seed = the index in the name)."""
    i = int(name.split("_")[1].split(".")[0])
    h, w, _ = store.image_shape(name)
    return np.random.default_rng(i).integers(0, 256, (h, w, 4), dtype=np.uint8)


def _positions(loader: ImageLoader) -> list[list[str]]:
    return [list(batch.names) for batch in loader]


@pytest.mark.parametrize("split", ["train", "test"])
def test_batches_hold_the_stores_images_and_cameras(stores: dict[str, Any], split: str) -> None:
    store = stores["zarr"]
    loader = ImageLoader(store, split, batch_size=2, seed=3)
    seen = []
    for batch in loader:
        assert isinstance(batch, ImageBatch) and batch.images.shape == (2, 16, 24, 3)
        assert batch.images.dtype == torch.float32 and batch.alpha is not None
        for j, name in enumerate(batch.names):
            expected = _pixels(store, name)
            np.testing.assert_array_equal((batch.images[j] * 255).round().byte().numpy(), expected[..., :3])
            np.testing.assert_array_equal((batch.alpha[j] * 255).round().byte().numpy(), expected[..., 3])
            # the same bits as the ray loaders' colours (raykit.rays.unit_colours)
            assert torch.equal(batch.images[j], unit_colours(torch.from_numpy(expected[..., :3])))
            row = store.image_index(name)
            assert int(batch.image[j]) == row
            np.testing.assert_allclose(batch.c2w[j].numpy(), store.table.c2w[row], atol=1e-6)
            assert batch.K is not None
            np.testing.assert_allclose(batch.K[j].numpy(), batch.cameras[j].K(), atol=1e-5)
            seen.append(name)
    assert sorted(seen) == store.images(split)


def test_order_is_seeded_per_epoch_and_every_image_once(stores: dict[str, Any]) -> None:
    loader = ImageLoader(stores["zarr"], "train", seed=5)
    epochs = [_positions(loader) for _ in range(3)]
    for epoch in epochs:
        assert sorted(n for b in epoch for n in b) == stores["zarr"].images("train")
    assert epochs[0] != epochs[1]
    again = ImageLoader(stores["zarr"], "train", seed=5)
    assert _positions(again) == epochs[0]
    ordered = ImageLoader(stores["zarr"], "train", shuffle=False)
    assert [b[0] for b in _positions(ordered)] == stores["zarr"].images("train")


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_are_disjoint_and_equal(stores: dict[str, Any], world_size: int, drop_last: bool) -> None:
    per_rank = [
        [n for b in _positions(ImageLoader(stores["zarr"], "train", seed=1, rank=r, world_size=world_size,
                                             drop_last=drop_last)) for n in b]
        for r in range(world_size)
    ]  # fmt: skip
    assert len({len(names) for names in per_rank}) == 1
    flat = [n for names in per_rank for n in names]
    if drop_last:
        assert len(set(flat)) == len(flat) == 6 // world_size * world_size
    else:
        assert set(flat) == set(stores["zarr"].images("train"))


def test_state_dict_resumes_exactly(stores: dict[str, Any]) -> None:
    loader = ImageLoader(stores["wds"], "train", seed=2, crop=(8, 12))
    reference = [(b.names, b.crop_origin.tolist()) for _ in range(2) for b in loader]
    loader = ImageLoader(stores["wds"], "train", seed=2, crop=(8, 12))
    it = iter(loader)
    first = [next(it) for _ in range(4)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = ImageLoader(stores["wds"], "train", seed=2, crop=(8, 12))
    resumed.load_state_dict(state)
    rest = [(b.names, b.crop_origin.tolist()) for _ in range(2) for b in resumed][: len(reference) - 4]
    assert [(b.names, b.crop_origin.tolist()) for b in first] + rest == reference
    with pytest.raises(ResumeError, match="seed"):
        ImageLoader(stores["wds"], "train", seed=3, crop=(8, 12)).load_state_dict(state)
    with pytest.raises(ResumeError, match="kind"):
        ImageLoader(stores["wds"], "train", seed=2, crop=(8, 12)).load_state_dict({**state, "kind": "rays"})


class _Reversed:
    """A view-sampling stage for the seam: the uniform order reversed, every ``turn``-th epoch not,
    with a JSON-able state (``turn``)."""

    def __init__(self, loader: ImageLoader, turn: int) -> None:
        self.plan, self.turn = loader.plan, turn

    def epoch_views(self, epoch: int) -> np.ndarray:
        order = self.plan.rank_order(epoch)
        return order if epoch % self.turn == 0 else order[::-1].copy()

    def state_dict(self) -> dict[str, Any]:
        return {"turn": self.turn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.turn = int(state["turn"])


def test_a_view_sampling_stage_plugs_in_with_its_state(stores: dict[str, Any]) -> None:
    """The seam of view sampling (issue 57): another stage decides the views, resumes with its state;
    the uniform stage keeps the state as it was (no ``views`` key)."""
    with ImageLoader(stores["zarr"], "train", seed=2) as uniform:
        orders = [[b.names[0] for b in uniform] for _ in range(3)]
        assert "views" not in uniform.state_dict()
    with ImageLoader(stores["zarr"], "train", seed=2) as loader:
        loader.views = _Reversed(loader, 2)
        got = [[b.names[0] for b in loader] for _ in range(2)]
        assert got == [orders[0], orders[1][::-1]]
        it = iter(loader)
        next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        assert state["views"] == {"turn": 2}
        rest = [b.names[0] for b in it]
    resumed = ImageLoader(stores["zarr"], "train", seed=2)
    resumed.views = _Reversed(resumed, 5)
    resumed.load_state_dict(state)
    assert resumed.views.state_dict() == {"turn": 2}
    assert [b.names[0] for b in resumed] == rest == orders[2][1:]
    with pytest.raises(ResumeError, match="uniform views keep no state"):
        ImageLoader(stores["zarr"], "train", seed=2).load_state_dict(state)
    resumed.close()


def test_keywords_are_checked_once_into_the_config(stores: dict[str, Any]) -> None:
    """One place for the options: ``ImageLoaderConfig``'s fields, given by name (``split``,
    ``batch_size``, ``seed`` also by position), as a config, or a config with overrides."""
    loader = ImageLoader(stores["zarr"], "train", 2, 5, crop=(8, 12), prefetch=3)
    expected = ImageLoaderConfig(split="train", batch_size=2, seed=5, crop=(8, 12), prefetch=3)
    assert loader.config == expected
    got = [(b.names, b.crop_origin.tolist()) for b in loader]
    assert len(got) == loader.plan.n_batches
    loader.close()
    assert ImageLoader(stores["zarr"]).config == ImageLoaderConfig()
    base = ImageLoaderConfig(batch_size=2, seed=5, crop=(8, 12))
    with ImageLoader(stores["zarr"], base, prefetch=3) as by_config:
        assert by_config.config == expected
        assert [(b.names, b.crop_origin.tolist()) for b in by_config] == got
    assert ImageLoader(stores["zarr"], config=expected).config is expected
    parameters = inspect.signature(ImageLoader).parameters
    assert not set(parameters) & set(ImageLoaderConfig.__dataclass_fields__)  # written once: the config's
    with pytest.raises(ConfigError, match=r"batch_size: expected an integer >= 1, got 0.*convert_threads"):
        ImageLoaderConfig(batch_size=0, convert_threads=0)
    with pytest.raises(ConfigError, match=r"convert_threads: expected an integer >= 1, got 0"):
        ImageLoader(stores["zarr"], convert_threads=0)
    with pytest.raises(ConfigError, match=r"unknown option 'batchsize'; the options are split, batch_size"):
        ImageLoader(stores["zarr"], batchsize=2)
    with pytest.raises(ConfigError, match=r"option 'split' given twice"):
        ImageLoader(stores["zarr"], "train", split="test")
    with pytest.raises(ConfigError, match=r"at most 3 options by position"):
        ImageLoader(stores["zarr"], "train", 1, 0, True)


def test_crops_are_windows_with_their_own_camera(stores: dict[str, Any]) -> None:
    store = stores["zarr"]
    loader = ImageLoader(store, "test", seed=4, crop=(8, 12))
    for batch in loader:
        (x0, y0), name, camera = batch.crop_origin[0].tolist(), batch.names[0], batch.cameras[0]
        window = _pixels(store, name)[y0 : y0 + 8, x0 : x0 + 12, :3]
        np.testing.assert_array_equal((batch.images[0] * 255).round().byte().numpy(), window)
        full = store.table.cameras[store.table.camera_index[store.image_index(name)]]
        c2w = torch.from_numpy(store.table.c2w[store.image_index(name)])
        pixels = torch.tensor([[0, 0], [11, 7], [5, 3]])
        _, d1, _ = pixels_to_rays(camera, c2w, pixels)
        _, d2, _ = pixels_to_rays(full, c2w, pixels + torch.tensor([x0, y0]))
        torch.testing.assert_close(d1, d2)
        assert batch.K is not None and float(batch.K[0, 0, 2]) == pytest.approx(full.K()[0, 2] - x0)


def test_cache_decodes_a_fitting_capture_once_and_respects_its_budget(stores: dict[str, Any]) -> None:
    loader = ImageLoader(stores["zarr"], "test", seed=0, cache_bytes=1 << 20)
    for _ in range(3):
        list(loader)
    stats = loader.cache_stats()
    assert stats.items == 2 and stats.misses == 2 and stats.hits == 4
    one = 16 * 24 * 4
    small = ImageLoader(stores["zarr"], "test", seed=0, cache_bytes=one + 10)
    for _ in range(3):
        list(small)
    assert small.cache_stats().bytes == one and small.cache_stats().items == 1


def test_shuffled_split_is_filled_in_one_pass_or_read_image_by_image(stores: dict[str, Any]) -> None:
    """A ray-layout train split: one scan fills the cache; with no cache every image is scanned for."""
    store = stores["zarr"]
    full = [[b.images.clone() for b in ImageLoader(store, "train", seed=1, cache_bytes=1 << 20)]]
    none = [[b.images.clone() for b in ImageLoader(store, "train", seed=1, cache_bytes=0)]]
    for a, b in zip(full[0], none[0], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_workers_give_identical_batches_and_close_cleanly(stores: dict[str, Any]) -> None:
    def run(num_workers: int) -> list[tuple[Any, ...]]:
        with ImageLoader(stores["zarr"], "test", batch_size=1, seed=7, crop=(10, 10), num_workers=num_workers,
                         cache_bytes=0) as loader:  # fmt: skip
            if num_workers:
                loader.wait_for_workers()  # so that the workers, not the loader's thread, read
            return [(b.names, b.crop_origin.tolist(), b.images.clone()) for _ in range(2) for b in loader]

    zero, two = run(0), run(2)
    for (n0, c0, i0), (n2, c2, i2) in zip(zero, two, strict=True):
        assert (n0, c0) == (n2, c2)
        torch.testing.assert_close(i0, i2, rtol=0, atol=0)
    assert not [t for t in threading.enumerate() if t.name == "raykit-images"]


def test_break_out_of_an_epoch_and_close_are_safe(stores: dict[str, Any]) -> None:
    loader = ImageLoader(stores["zarr"], "train", seed=0)
    for batch in loader:
        assert len(batch) == 1
        break
    assert loader.batch == 1
    loader.close()
    loader.close()
    assert len(list(loader)) == len(loader) - 1  # continues where it stopped


def _opencv_records(n: int, width: int = 40, height: int = 30) -> list[ImageRecord]:
    camera = Camera("OPENCV", width, height, (32.0, 33.0, 20.5, 14.5, -0.25, 0.06, 0.003, -0.002))
    return [
        ImageRecord(f"img_{i:03d}.png", "test", camera, np.eye(4), 0.5, 6.0, f"mem://{i}",
                    functools.partial(_rgb, i, height, width))
        for i in range(n)
    ]  # fmt: skip


def _rgb(seed: int, height: int, width: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_undistort_reports_the_pinhole_camera_and_its_pixels(tmp_path: Path) -> None:
    store = write_store(tmp_path / "cv", _opencv_records(3), scene=SceneInfo(), chunk_rays=256)
    distorted = store.table.cameras[0]
    table, pinhole = RemapTable.undistort(distorted)
    plain = ImageLoader(store, "test", shuffle=False)
    assert next(iter(plain)).K is None  # a distorted camera has no K
    loader = ImageLoader(store, "test", shuffle=False, undistort=True, crop=(20, 30), seed=1)
    for batch in loader:
        source = _rgb(int(batch.names[0][4:7]), 30, 40)
        x0, y0 = batch.crop_origin[0].tolist()
        expected = table.apply(source)[y0 : y0 + 20, x0 : x0 + 30]
        np.testing.assert_array_equal((batch.images[0] * 255).round().byte().numpy(), expected)
        reference = reference_remap(source, undistortion_coordinates(distorted, pinhole))
        assert np.abs(reference[y0 : y0 + 20, x0 : x0 + 30].astype(int) - expected).max() <= 1
        assert batch.cameras[0].model == "PINHOLE" and batch.K is not None
        np.testing.assert_allclose(batch.K[0, :2, 2].numpy(), [20.5 - x0, 14.5 - y0])


def test_bad_arguments_are_named(stores: dict[str, Any], tmp_path: Path) -> None:
    store = stores["zarr"]
    with pytest.raises(ConfigError, match="crop 20x30"):
        ImageLoader(store, "train", crop=(20, 30))
    with pytest.raises(ConfigError, match="no split 'nope'"):
        ImageLoader(store, "nope")
    with pytest.raises(ConfigError, match="fewer than one batch"):
        ImageLoader(store, "test", batch_size=3)
    with pytest.raises(ConfigError, match="rank"):
        ImageLoader(store, "train", rank=2, world_size=2)
    records = _opencv_records(1) + _opencv_records(1, 20, 10)
    records[1] = ImageRecord("other", "test", Camera("PINHOLE", 20, 10, (9.0, 9.0, 10, 5)), np.eye(4), 0.5,
                             6.0, "mem://x", functools.partial(_rgb, 9, 10, 20))  # fmt: skip
    mixed = write_store(tmp_path / "mixed", records, scene=SceneInfo(), chunk_rays=256)
    with pytest.raises(ConfigError, match="2 image sizes"):
        ImageLoader(mixed, "test", batch_size=2)


def test_changed_world_size_mid_epoch_skips_to_the_next_epoch(stores: dict[str, Any]) -> None:
    loader = ImageLoader(stores["zarr"], "train", seed=0, rank=0, world_size=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    single = ImageLoader(stores["zarr"], "train", seed=0)
    with pytest.warns(UserWarning, match="skipping the rest of that epoch"):
        single.load_state_dict(state)
    assert (single.epoch, single.batch) == (1, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_equal_cpu_batches(stores: dict[str, Any]) -> None:
    """Pinned uint8 staging + non-blocking copy + conversion on the GPU gives the CPU batch."""
    cpu = list(ImageLoader(stores["zarr"], "train", batch_size=2, seed=1, crop=(8, 8)))
    gpu = list(ImageLoader(stores["zarr"], "train", batch_size=2, seed=1, crop=(8, 8), device="cuda"))
    for a, b in zip(cpu, gpu, strict=True):
        assert b.images.is_cuda and b.c2w.is_cuda and b.K is not None and b.K.is_cuda
        torch.testing.assert_close(a.images, b.images.cpu())
        torch.testing.assert_close(a.c2w, b.c2w.cpu())


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_an_images_layout_store_gives_the_same_batches(
    stores: dict[str, Any], tmp_path: Path, backend: str
) -> None:
    from raykit.store import open_store
    from raykit.store.write import copy_store

    copy_store(stores["zarr"].url, tmp_path / "images", backend=backend, layout="images")
    images = open_store(tmp_path / "images")
    assert images.layout("train") == "images"
    for split in ("train", "test"):
        a = list(ImageLoader(stores["zarr"], split, batch_size=2, seed=4))
        b = list(ImageLoader(images, split, batch_size=2, seed=4))
        assert [x.names for x in a] == [y.names for y in b] and len(a) > 0
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x.images, y.images, rtol=0, atol=0)
            assert x.alpha is not None and y.alpha is not None
            torch.testing.assert_close(x.alpha, y.alpha, rtol=0, atol=0)
            torch.testing.assert_close(x.c2w, y.c2w, rtol=0, atol=0)


def _grey_float(image: np.ndarray) -> np.ndarray:
    """A transform: (H, W, 4) uint8 -> (H, W, 1) float32 mean of RGB (module level: it pickles)."""
    return image[..., :3].mean(axis=-1, keepdims=True, dtype=np.float32)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_transform_is_applied_once_before_the_cache_and_served_as_is(
    stores: dict[str, Any], num_workers: int
) -> None:
    store = stores["zarr"]
    with ImageLoader(store, "test", seed=1, transform=_grey_float, num_workers=num_workers) as loader:
        for _ in range(2):
            for batch in loader:
                assert batch.images.shape == (1, 16, 24, 1) and batch.images.dtype == torch.float32
                assert batch.alpha is None
                np.testing.assert_array_equal(
                    batch.images[0].numpy(), _grey_float(_pixels(store, batch.names[0]))
                )
        stats = loader.cache_stats()
    assert stats.items == 2 and stats.bytes == 2 * 16 * 24 * 4  # cached as served: 4 bytes a pixel
    assert stats.misses == 2 and stats.hits == 2


def test_preload_fills_the_cache_and_cached_epochs_match_the_producer_thread(stores: dict[str, Any]) -> None:
    """After ``preload`` every epoch is assembled on the calling thread; its batches, position and
    resume equal those of a loader whose epochs go through the producer thread (cache_bytes=0)."""
    store = stores["wds"]
    cached = ImageLoader(store, "train", seed=4, crop=(8, 12), cache_bytes=1 << 20)
    assert cached.preload() == cached.source.n_images
    streamed = ImageLoader(store, "train", seed=4, crop=(8, 12), cache_bytes=0)
    assert streamed.preload() == 0
    started = threading.Thread.start
    threads: list[str] = []

    def spy(thread: threading.Thread) -> None:
        threads.append(thread.name)
        started(thread)

    for _ in range(2):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(threading.Thread, "start", spy)
            ours = [(b.names, b.crop_origin.tolist(), b.images.clone()) for b in cached]
        theirs = [(b.names, b.crop_origin.tolist(), b.images.clone()) for b in streamed]
        assert "raykit-images" not in threads
        for (n0, c0, i0), (n1, c1, i1) in zip(ours, theirs, strict=True):
            assert (n0, c0) == (n1, c1)
            torch.testing.assert_close(i0, i1, rtol=0, atol=0)
        assert cached.state_dict() == streamed.state_dict()
    it = iter(cached)
    next(it)
    state = cached.state_dict()
    expected = next(it).names
    resumed = ImageLoader(store, "train", seed=4, crop=(8, 12), cache_bytes=0)
    resumed.load_state_dict(state)
    assert next(iter(resumed)).names == expected


def _mapping_of(address: int) -> tuple[int, int] | None:
    """The ``(start, end)`` of the mapping holding ``address`` (the kernel may merge neighbours)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
        if lo <= address < hi:
            return lo, hi
    return None


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_large_cpu_batches_are_recycled_mappings_returned_when_dropped(tmp_path: Path) -> None:
    """A float batch of >= 1 MiB is an anonymous mapping, not heap: it goes back to the loader's pool
    once the batch and its views are gone, and later batches are made in it (no fresh pages to fault
    in and zero); the pool keeps a few, and closing the loader unmaps them (BENCHMARKS.md)."""
    store = write_store(tmp_path / "big", _opencv_records(3, 400, 300), scene=SceneInfo(), chunk_rays=1 << 16)
    with ImageLoader(store, "test", shuffle=False) as loader:
        pool = loader.batcher.transfer.buffers
        batches = list(loader)
        pixels = _rgb(int(batches[0].names[0][4:7]), 300, 400)
        np.testing.assert_array_equal(
            batches[0].images[0].numpy(), unit_colours(torch.from_numpy(pixels)).numpy()
        )
        starts = [batch.images.untyped_storage().data_ptr() for batch in batches]
        nbytes = 300 * 400 * 3 * 4
        for start in starts:
            assert start % mmap.PAGESIZE == 0  # its own mapping starts on a page, not inside a heap chunk
            region = _mapping_of(start)
            assert region is not None and region[1] - start >= nbytes
        view = batches[0].images[0, :10].numpy()
        del batches
        assert pool.free == 2 and pool.made == 3  # the view keeps the first batch's buffer
        del view
        assert pool.free == 2  # at most ``keep`` kept: the oldest free one was unmapped
        assert sum(_mapping_of(start) is not None for start in starts) >= 2
        again = [(b.images.untyped_storage().data_ptr(), b.names[0], b.images.clone()) for b in loader]
        assert pool.made <= 4  # the free buffers reused
        assert len({start for start, _, _ in again} & set(starts)) >= 2
        for _, name, images in again:
            pixels = _rgb(int(name[4:7]), 300, 400)
            np.testing.assert_array_equal(images[0].numpy(), unit_colours(torch.from_numpy(pixels)).numpy())
        del again
        loader.close()
        assert pool.free == 0
        assert all(_mapping_of(start) is None for start in starts)  # unmapped: pages back with the system
