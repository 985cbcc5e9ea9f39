"""Split rules and world normalisation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raykit.converters.normalize import apply_similarity, normalization
from raykit.converters.splits import assign_splits
from raykit.errors import ConfigError, SourceError


@settings(max_examples=30, deadline=None)
@given(names=st.lists(st.text("abc/ _.0123", min_size=1, max_size=6), unique=True, max_size=30),
       n=st.integers(2, 10))  # fmt: skip
def test_every_nth_is_order_independent_and_holds_out_sorted_multiples(names: list[str], n: int) -> None:
    splits = assign_splits(names, [None] * len(names), f"every:{n}")
    shuffled = list(reversed(names))
    again = dict(zip(shuffled, assign_splits(shuffled, [None] * len(names), f"every:{n}"), strict=True))
    assert dict(zip(names, splits, strict=True)) == again
    test = sorted(name for name, split in zip(names, splits, strict=True) if split == "test")
    assert test == sorted(names)[::n]
    assert set(splits) <= {"train", "test"}


def test_auto_source_all_and_lists(tmp_path: Path) -> None:
    names = [f"im{i}.png" for i in range(10)]
    assert assign_splits(names, ["train"] * 9 + ["val"], "auto")[-1] == "val"
    assert assign_splits(names, [None] * 10, None) == assign_splits(names, [None] * 10, "every:8")
    assert set(assign_splits(names, ["val"] * 10, "all")) == {"train"}
    (tmp_path / "test.txt").write_text("# held out\nim3.png\n\nim5.png\n")
    (tmp_path / "val.txt").write_text("im7.png\n")
    got = assign_splits(names, [None] * 10, f"test={tmp_path / 'test.txt'},val={tmp_path / 'val.txt'}")
    assert [n for n, s in zip(names, got, strict=True) if s != "train"] == ["im3.png", "im5.png", "im7.png"]
    assert got[7] == "val"
    assert assign_splits(names, [None] * 10, {"test": ["im1.png"]})[1] == "test"


def test_split_errors_list_every_problem() -> None:
    names = ["a.png", "b.png", "c.png"]
    with pytest.raises(SourceError) as info:
        assign_splits(names, [None] * 3, {"train": ["a.png", "zz.png"], "test": ["a.png"]})
    assert info.value.problems == [
        "split 'train': image 'zz.png' is not in the capture",
        "split 'test': image 'a.png' is already in split 'train'",
        "split: image 'b.png' is in no split list",
        "split: image 'c.png' is in no split list",
    ]
    for bad in ("every:1", "every:x", "bogus", "source"):
        with pytest.raises(ConfigError):
            assign_splits(names, [None] * 3, bad)


def test_normalization_modes() -> None:
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(20, 3)) * 5 + 10
    points = np.concatenate([rng.normal(size=(500, 3)) * 20, [[1e6, 0, 0]]])  # one stray point
    matrix, params = normalization("cameras", centres)
    moved = centres @ matrix[:3, :3].T + matrix[:3, 3]
    assert np.max(np.abs(moved)) == pytest.approx(1.0)
    assert np.allclose(moved.max(0) + moved.min(0), 0.0)
    unit, p2 = normalization("unit-box", centres, points)
    assert p2["scale"] < params["scale"] and p2["scale"] > 1e-4  # points widen the box; the stray is ignored
    assert np.array_equal(normalization("none", centres)[0], np.eye(4))
    with pytest.raises(ConfigError):
        normalization("sphere", centres)
    c2w = np.eye(4)
    c2w[:3, 3] = centres[0]
    out = apply_similarity(unit, c2w)
    assert np.allclose(out[:3, :3], np.eye(3)) and np.allclose(
        out[:3, 3], unit[:3, :3] @ centres[0] + unit[:3, 3]
    )
