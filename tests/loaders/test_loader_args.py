"""RayLoader arguments and loader states: each bad one is a RaykitError naming it, its value and what is
expected; a store path or URL is opened."""

from __future__ import annotations

from typing import Any

import pytest

from raykit.errors import ConfigError, RaykitError, ResumeError
from raykit.loaders import RayLoader


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"seed": "abc"}, "seed: expected an integer >= 0, got 'abc' (str)"),
        ({"seed": 1.5}, "seed: expected an integer >= 0, got 1.5 (float)"),
        ({"seed": -2}, "seed: expected an integer >= 0, got -2"),
        ({"batch_size": True}, "batch_size: expected an integer >= 1, got True (bool)"),
        ({"batch_size": 0}, "batch_size: expected an integer >= 1, got 0"),
        ({"num_workers": "2"}, "num_workers: expected an integer in [0, "),
        ({"world_size": 0, "rank": 0}, "world_size: expected an integer >= 1, got 0"),
        ({"prefetch": 2.0}, "prefetch: expected an integer >= 1, got 2.0"),
    ],
)
def test_bad_arguments_name_themselves(stores, kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        RayLoader(stores["zarr"], "train", **{"batch_size": 64, **kwargs})
    assert needle in str(info.value)


def test_every_bad_argument_is_listed(stores) -> None:
    with pytest.raises(ConfigError) as info:
        RayLoader(stores["zarr"], "train", batch_size=True, seed="abc")
    assert "batch_size: expected" in str(info.value) and "seed: expected" in str(info.value)


def test_store_path_or_url_is_opened(stores) -> None:
    store = stores["zarr"]
    by_path = RayLoader(store.url, "train", 64, seed=3)
    by_object = RayLoader(store, "train", 64, seed=3)
    assert by_path.store.fingerprint == store.fingerprint
    first = next(iter(by_path)), next(iter(by_object))
    assert (first[0].origins == first[1].origins).all()
    by_path.close()
    by_object.close()
    with pytest.raises(RaykitError, match="no such store"):
        RayLoader(store.url + "-missing", "train", 64)
    with pytest.raises(ConfigError, match="expected a RayStore, a chunk source, or a store path or URL"):
        RayLoader(42, "train", 64)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (None, "expected a dict from state_dict(), got NoneType"),
        ({"epoch": -1}, "epoch: expected an integer >= 0, got -1"),
        ({"epoch": "x"}, "epoch: expected an integer >= 0, got 'x'"),
        ({"batch": 2.5}, "batch: expected an integer >= 0, got 2.5"),
        ({"n_batches": 0}, "n_batches: expected an integer >= 1, got 0"),
        ({"n_batches": "many"}, "n_batches: expected an integer >= 1, got 'many'"),
        ({"world_size": "x"}, "world_size: expected an integer >= 1, got 'x'"),
        ({"batch_size": -4}, "batch_size: expected an integer >= 1, got -4"),
        ({"drop_last": "yes"}, "drop_last: expected true or false, got 'yes'"),
        ({"epoch": None}, "epoch: expected an integer >= 0, got None"),
    ],
)
def test_bad_states_are_refused_and_leave_the_position(stores, change: Any, needle: str) -> None:
    loader = RayLoader(stores["zarr"], "train", 64, seed=1)
    state = None if change is None else {**loader.state_dict(), "batch": 1, **change}
    with pytest.raises(ResumeError) as info:
        loader.load_state_dict(state)  # type: ignore[arg-type]
    assert needle in str(info.value)
    assert (loader.epoch, loader.batch) == (0, 0)
    loader.close()
