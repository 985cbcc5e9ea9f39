"""Time through the loaders (issue 58): every ray of a ``RayLoader`` batch carries its view's time
(``RayBatch.times``) in both layouts and backends, ``ImageLoader`` batches carry each view's, and a
static store's batches carry none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raykit.converters import convert
from raykit.loaders import DeviceBatcher, ImageLoader, RayLoader, reference_batch

FORMS = ("rays", "images", "rays_wds", "images_wds")
LEGO = Path(__file__).resolve().parents[1] / "data" / "lego_tiny"


def _times_by_name(dnerf: dict[str, Any]) -> dict[str, float]:
    """Image name -> time, from the rendered scene (not from the store)."""
    scene = dnerf["scene"]
    return {f"{name}.png": float(t) for name, t in zip(scene.names, scene.times, strict=True)}


@pytest.mark.parametrize("form", FORMS)
def test_every_ray_carries_its_views_time(dnerf: dict[str, Any], form: str) -> None:
    loader = RayLoader(dnerf[form], "train", batch_size=1000, seed=1)
    times = _times_by_name(dnerf)
    names = loader.store.table.names
    seen = set()
    for batch in loader:
        assert batch.times is not None and batch.times.dtype == torch.float32
        assert batch.times.shape == (len(batch),)
        expected = torch.tensor([times[names[i]] for i in batch.image.tolist()], dtype=torch.float32)
        assert torch.equal(batch.times, expected)
        seen.update(batch.times.tolist())
    assert len(seen) == 6  # every instant served
    sub = batch[torch.arange(3)]  # slicing and splitting keep them
    assert torch.equal(sub.times, batch.times[:3])
    assert torch.equal(batch.split([2, len(batch) - 2])[1].times, batch.times[2:])


def test_fast_and_reference_batches_agree_on_times(dnerf: dict[str, Any]) -> None:
    loader = RayLoader(dnerf["rays"], "train", batch_size=500, seed=2)
    raw = next(loader.raw_batches(0))
    fast, reference = DeviceBatcher(loader.store, "cpu")(raw), reference_batch(loader.store, raw, "cpu")
    assert fast.times is not None and torch.equal(fast.times, reference.times)


@pytest.mark.parametrize("form", ["images", "rays_wds"])
def test_image_batches_carry_each_views_time(dnerf: dict[str, Any], form: str) -> None:
    times = _times_by_name(dnerf)
    seen = []
    for batch in ImageLoader(dnerf[form], "train", batch_size=4, crop=(24, 24), seed=0):
        assert batch.times is not None and batch.times.dtype == torch.float32
        assert batch.times.tolist() == [np.float32(times[n]) for n in batch.names]
        seen += batch.names
    one = next(iter(ImageLoader(dnerf[form], "test", batch_size=1, seed=0)))
    assert one.times is not None and one.times.tolist() == [np.float32(times[one.names[0]])]
    assert len(set(seen)) == len(seen) >= 16  # 18 train views in batches of 4


def test_static_store_batches_have_no_time(tmp_path: Path) -> None:
    store = convert(LEGO, tmp_path / "lego.zarr")
    assert next(iter(RayLoader(store, "train", batch_size=64, seed=0))).times is None
    assert next(iter(ImageLoader(store, "train", batch_size=1, seed=0))).times is None
