"""Time-synchronous image batches (issue 58, ``ImageLoaderConfig(synchronous=True)``): each batch is
whole instants (all cameras of one time), instants in a seeded order per epoch, resumable, ranks
disjoint; one line for what cannot be served that way."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from raykit.converters import convert
from raykit.errors import ConfigError
from raykit.loaders import ImageLoader

LEGO = Path(__file__).resolve().parents[1] / "data" / "lego_tiny"


def _instants(loader: ImageLoader, batches: int | None = None) -> list[list[tuple[float, int]]]:
    """Per batch: (time, rig camera) of each view, read from the store's table by the batch's rows."""
    table = loader.store.table
    out = []
    for batch in itertools.islice(loader, batches):
        rows = batch.image.tolist()
        assert batch.times is not None and batch.times.tolist() == pytest.approx(table.time[rows].tolist())
        out.append([(float(table.time[r]), int(table.rig_camera[r])) for r in rows])
    return out


def test_each_batch_is_one_instant_of_distinct_cameras(n3dv: dict[str, Any]) -> None:
    loader = ImageLoader(n3dv["store"], "train", batch_size=3, seed=4, synchronous=True)
    epoch = _instants(loader)
    assert len(epoch) == 6
    for views in epoch:
        assert len({t for t, _ in views}) == 1 and [c for _, c in views] == [1, 2, 3]
    times = [views[0][0] for views in epoch]
    assert sorted(times) == pytest.approx([f / 5 for f in range(6)]) and times != sorted(times)  # shuffled
    again = ImageLoader(n3dv["store"], "train", batch_size=3, seed=4, synchronous=True)
    assert _instants(again) == epoch  # the seed's order
    two = _instants(ImageLoader(n3dv["store"], "train", batch_size=6, seed=4, synchronous=True))
    assert [views[:3] + views[3:] for views in two] == [
        epoch[0] + epoch[1],
        epoch[2] + epoch[3],
        epoch[4] + epoch[5],
    ]


def test_resume_gives_the_same_sequence(n3dv: dict[str, Any]) -> None:
    loader = ImageLoader(n3dv["store"], "train", batch_size=3, seed=2, synchronous=True)
    whole = _instants(loader) + _instants(loader)  # two epochs
    first = ImageLoader(n3dv["store"], "train", batch_size=3, seed=2, synchronous=True)
    head = _instants(first, 4)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["views"] == {"kind": "synchronous", "instants": [6, 3]}
    resumed = ImageLoader(n3dv["store"], "train", batch_size=3, seed=2, synchronous=True)
    resumed.load_state_dict(state)
    assert head + _instants(resumed) + _instants(resumed) == whole
    with pytest.raises(Exception, match="synchronous"):
        ImageLoader(n3dv["store"], "train", batch_size=3, seed=2).load_state_dict(state)


def test_ranks_get_disjoint_instants(n3dv: dict[str, Any]) -> None:
    seen = []
    for rank in (0, 1):
        loader = ImageLoader(
            n3dv["store"], "train", batch_size=3, seed=7, synchronous=True, rank=rank, world_size=2
        )
        seen.append({views[0][0] for views in _instants(loader)})
    assert len(seen[0]) == len(seen[1]) == 3 and not seen[0] & seen[1]


def test_what_cannot_be_synchronous_is_one_line(n3dv: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="batch_size 2 is not a multiple of the 3 cameras per instant"):
        ImageLoader(n3dv["store"], "train", batch_size=2, synchronous=True)
    with pytest.raises(ConfigError, match="has no times"):
        ImageLoader(convert(LEGO, tmp_path / "lego.zarr"), "train", synchronous=True)
    with pytest.raises(ConfigError, match="sampling must be uniform"):
        ImageLoader(n3dv["store"], "train", batch_size=3, synchronous=True, sampling="loss")
