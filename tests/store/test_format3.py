"""Format 3: pids derived from the split's order (``SplitOrder`` against the slow definition),
colours-only chunks and caches, ``--with-pids`` copies, ``rgb`` without alpha, ``raykit info``."""

from __future__ import annotations

import argparse
import itertools
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raykit.errors import StoreVersionError
from raykit.loaders import reference_batch
from raykit.loaders.cache import ChunkCache, nbytes_of
from raykit.store import SceneInfo, open_store, write_store
from raykit.store.cli import register
from raykit.store.order import SplitOrder, reference_split_pids
from raykit.store.schema import DerivedRays, RawRays
from raykit.store.summary import store_summary
from raykit.store.validate import validate_store
from raykit.store.write import copy_store


def _order(sizes: list[int], seed: int = 3, first: int = 2) -> tuple[SplitOrder, np.ndarray]:
    images = list(range(first, first + len(sizes)))
    offsets = list(itertools.accumulate((100, *sizes[:-1])))
    reference = reference_split_pids(seed, "train", images, tuple(sizes), offsets)
    return SplitOrder(seed, "train", True, tuple(images), tuple(sizes), tuple(offsets)), reference


@settings(max_examples=80, deadline=None)
@given(
    st.one_of(
        st.lists(st.integers(1, 40), min_size=1, max_size=6),  # mixed sizes
        st.tuples(st.integers(1, 40), st.integers(1, 7)).map(lambda t: [t[0]] * t[1]),  # one size
    ),
    st.data(),
)
def test_derived_pids_match_the_definition(sizes: list[int], data: st.DataObject) -> None:
    order, reference = _order(sizes)
    start = data.draw(st.integers(0, len(reference)))
    stop = data.draw(st.integers(start, len(reference)))
    np.testing.assert_array_equal(order.pids(start, stop), reference[start:stop])
    assert order.pids(start, stop).dtype == np.uint32
    again = pickle.loads(pickle.dumps(order))  # pickles without its memoised bases
    np.testing.assert_array_equal(again.pids(start, stop), reference[start:stop])


def test_unshuffled_pids_are_sequential_and_ranges_are_checked() -> None:
    order = SplitOrder(0, "val", False, (4, 5), (6, 10), (50, 56))
    np.testing.assert_array_equal(order.pids(3, 9), np.arange(53, 59, dtype=np.uint32))
    with pytest.raises(IndexError, match="outside"):
        order.pids(0, 17)


def test_chunks_hold_colours_only(tmp_path: Path, records, scene: SceneInfo) -> None:
    store = write_store(tmp_path / "s", records, scene=scene, chunk_rays=64, shard_chunks=2)
    assert store.manifest["format_version"] == 3 and store.manifest["layout"]["train_order"]
    assert not any("/pid/" in rel for rel in store.files)  # no pid array in any split
    raw = store.read_chunk("train", 1)
    assert isinstance(raw, DerivedRays) and raw.rgba.shape == (64, 4)
    assert nbytes_of(raw) == raw.rgba.nbytes == 4 * 64  # what a loader's cache counts
    np.testing.assert_array_equal(raw.pid, store.split_order("train").pids(64, 128))
    part = raw.take(slice(5, 20))
    assert type(part) is RawRays
    np.testing.assert_array_equal(part.pid, raw.pid[5:20])
    np.testing.assert_array_equal(raw.take(np.array([3, 1])).pid, raw.pid[[3, 1]])
    blob = pickle.dumps(raw)  # to and from worker processes: the colours and a small order
    assert len(blob) < raw.rgba.nbytes + 2048
    np.testing.assert_array_equal(pickle.loads(blob).pid, raw.pid)
    cache: ChunkCache[RawRays] = ChunkCache(1 << 20)
    cache.put(1, raw)
    assert cache.stats().bytes == 4 * 64
    val = store.read("val", 0, store.splits["val"].n_rays)
    np.testing.assert_array_equal(
        val.pid, np.arange(store.splits["val"].n_rays) + store.splits["val"].pid_start
    )
    assert validate_store(store.url) == []


def test_rgb_without_alpha(tmp_path: Path, record_factory, scene: SceneInfo) -> None:
    images = [(8, 6, "train", 3), (8, 6, "train", 3), (5, 4, "val", 3)]
    store = write_store(tmp_path / "s", record_factory(1, images), scene=scene, chunk_rays=16)
    assert store.fields["rgba"].channels == 3 and store.rgba_channels == 3
    raw = store.read_chunk("train", 0)
    assert nbytes_of(raw) == 3 * len(raw)
    assert reference_batch(store, raw).alpha is None
    summary = store_summary(store)
    assert set(summary["split_bytes_per_ray"]["train"]) == {"rgba"}


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args))


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_copy_with_pids_keeps_the_fingerprint(
    tmp_path: Path, records, scene: SceneInfo, backend: str, capsys: pytest.CaptureFixture
) -> None:
    store = write_store(tmp_path / "s", records, scene=scene, backend=backend, chunk_rays=64, shard_chunks=2)
    other = "wds" if backend == "zarr" else "zarr"
    assert _run(["copy", store.url, str(tmp_path / "c"), "--format", other, "--with-pids"]) == 0
    copy = open_store(tmp_path / "c")
    assert copy.fingerprint == store.fingerprint and validate_store(copy.url) == []
    assert all(info.pids == "stored" for info in copy.splits.values())
    assert all("pid_crc32c" in copy.index[split] for split in copy.splits)
    if other == "zarr":
        import zarr

        native = zarr.open_array(tmp_path / "c" / "zarr", path="train/pid", mode="r")[:]
    else:
        native = np.concatenate([copy.reader.chunks.values(copy.splits["train"], i)["pid"]
                                 for i in range(copy.splits["train"].n_chunks)])  # fmt: skip
    np.testing.assert_array_equal(native, store.read("train", 0, store.splits["train"].n_rays).pid)
    for split, info in store.splits.items():
        for i in range(info.n_chunks):
            a, b = store.read_chunk(split, i), copy.read_chunk(split, i)
            assert type(b) is RawRays
            np.testing.assert_array_equal(a.pid, b.pid)
            np.testing.assert_array_equal(a.rgba, b.rgba)
    # and a copy of the copy without --with-pids keeps them stored
    again = copy_store(tmp_path / "c", tmp_path / "d", backend=backend)
    assert again.fingerprint == store.fingerprint and again.splits["train"].pids == "stored"
    # stored pids are checked on every read
    index = json.loads((tmp_path / "c" / "index.json").read_text())
    index["train"]["pid_crc32c"][0] ^= 1
    (tmp_path / "c" / "index.json").write_text(json.dumps(index))
    _resign(tmp_path / "c", "index.json")
    from raykit.errors import StoreCorruptError

    with pytest.raises(StoreCorruptError, match="fails its pid checksum"):
        open_store(tmp_path / "c").read_chunk("train", 0)


def _resign(root: Path, rel: str, **changes: object) -> None:
    from raykit.fileio import sha256_file
    from raykit.store.files import json_digest

    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"][rel] = {"size": (root / rel).stat().st_size, "sha256": sha256_file(root / rel)}
    manifest.update(changes)
    manifest.pop("manifest_digest")
    manifest["manifest_digest"] = json_digest(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_an_unknown_train_order_is_refused(tmp_path: Path, records, scene: SceneInfo) -> None:
    store = write_store(tmp_path / "s", records, scene=scene, chunk_rays=64)
    layout = {**store.manifest["layout"], "train_order": "something-else/9"}
    _resign(tmp_path / "s", "index.json", layout=layout)
    with pytest.raises(StoreVersionError, match="train order 'something-else/9'"):
        open_store(tmp_path / "s")


def test_info_shows_bytes_per_field_and_the_source_ratio(
    tmp_path: Path, record_factory, scene: SceneInfo, capsys: pytest.CaptureFixture
) -> None:
    import dataclasses

    images = [(8, 6, "train", 3), (8, 6, "train", 3), (5, 4, "val", 3)]
    records = record_factory(4, images)
    paths = []
    for i, rec in enumerate(records):  # give the records local source files
        path = tmp_path / f"im{i}.bin"
        path.write_bytes(bytes(100 + i))
        paths.append(dataclasses.replace(rec, source_path=str(path)))
    store = write_store(tmp_path / "s", paths, scene=scene, chunk_rays=16)
    summary = store_summary(store)
    assert summary["source_image_bytes"] == 100 + 101 + 102
    assert summary["store_to_source"] == pytest.approx(summary["bytes_on_disk"] / 303)
    fields = summary["bytes_per_ray_by_field"]
    assert set(fields) == {"rgba"} and fields["rgba"] > 0
    assert _run(["info", store.url]) == 0
    out = capsys.readouterr().out
    assert "rgba" in out and "store/source" in out and "pids derived" in out


def test_chunks_from_other_processes_share_one_order(tmp_path: Path, records, scene: SceneInfo) -> None:
    store = write_store(tmp_path / "s", records, scene=scene, chunk_rays=64)
    a, b = (pickle.loads(pickle.dumps(store.read_chunk("train", i))) for i in (0, 1))
    assert isinstance(a, DerivedRays) and a.order is b.order is store.split_order("train")
