"""Evaluation loader (whole images in order) and torch.utils.data adapters."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from raykit.loaders import RayLoader, image_rays, reference_batch
from raykit.loaders.eval import EvalLoader
from raykit.loaders.torch_adapters import RayDataset, RayIterableDataset, collate_rays


def test_eval_loader_yields_whole_images_in_order(stores: dict[str, Any]) -> None:
    store = stores["wds"]
    loader = EvalLoader(store, "test")
    images = list(loader)
    assert [im.name for im in images] == store.images("test") and len(images) == 2
    for im in images:
        reference = image_rays(store, im.name)
        assert len(im.rays) == im.height * im.width
        assert torch.equal(im.rays.origins, reference.origins) and torch.equal(im.rays.rgb, reference.rgb)
        xy = im.rays.pixel
        np.testing.assert_array_equal((xy[:, 1] * im.width + xy[:, 0]).numpy(), np.arange(len(im.rays)))
        pieces = list(im.batches(100))
        assert sum(len(p) for p in pieces) == len(im.rays) and max(len(p) for p in pieces) == 100


def test_iterable_dataset_matches_loader_with_dataloader_workers(stores: dict[str, Any]) -> None:
    store = stores["zarr"]
    expected = list(RayLoader(store, "train", batch_size=128, seed=5))
    dataset = RayIterableDataset(store.url, "train", batch_size=128, seed=5)
    for workers in (0, 2):
        got = list(DataLoader(dataset, batch_size=None, num_workers=workers))
        assert len(got) == len(expected) == len(dataset)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a.pixel, b.pixel) and torch.equal(a.directions, b.directions)


def test_map_dataset_gathers_batches(stores: dict[str, Any]) -> None:
    store = stores["zarr"]
    dataset = RayDataset(store.url, "train", cache_bytes=1 << 20)
    everything = store.read("train", 0, len(dataset))
    loader = DataLoader(
        dataset,
        batch_size=50,
        shuffle=True,
        collate_fn=collate_rays,
        generator=torch.Generator().manual_seed(0),
    )
    seen = []
    for batch in loader:
        seen.append(batch.image * 10**6 + batch.pixel[:, 1] * 1000 + batch.pixel[:, 0])
    seen_all = torch.cat(seen)
    assert len(seen_all) == len(dataset) and len(torch.unique(seen_all)) == len(dataset)
    single = dataset[7]
    reference = reference_batch(store, everything.take(np.array([7])))
    assert torch.equal(single.rgb, reference.rgb) and torch.equal(single.origins, reference.origins)


def test_iterable_dataset_pickles_without_its_loader(stores: dict[str, Any]) -> None:
    dataset = RayIterableDataset(stores["wds"].url, "train", batch_size=128, seed=1)
    first = next(iter(dataset))
    copy = pickle.loads(pickle.dumps(dataset))  # what a spawned DataLoader worker receives
    assert torch.equal(next(iter(copy)).pixel, first.pixel)
