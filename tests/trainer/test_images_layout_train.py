"""The trainer trains from an images-layout store unchanged (the loader picks the windowed shuffle)."""

from __future__ import annotations

import json
from pathlib import Path

from raykit.store.write import copy_store
from raykit.trainer import TrainConfig, train

from . import test_train as _tt


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "log.jsonl").read_text().splitlines()]


def test_trains_from_images_layout(tiny_store: Path, tmp_path: Path) -> None:
    images = copy_store(tiny_store, tmp_path / "images", backend="zarr", layout="images")
    config = {**_tt.TINY, "sampler": "hierarchical", "steps": 30, "lr": 3e-2}
    a = train(TrainConfig(store=images.url, out=str(tmp_path / "a"), **config))
    b = train(TrainConfig(store=images.url, out=str(tmp_path / "b"), **config))
    losses = _losses(a)
    assert sum(losses[-5:]) < sum(losses[:5])
    assert losses == _losses(b)
