"""Writer fast paths against their slow twins: the on-the-fly train order, the zarr shard encoder."""

from __future__ import annotations

import concurrent.futures
import itertools
import os
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raykit.store import SceneInfo, open_store, write_store
from raykit.store.backends import zarr as zarr_backend
from raykit.store.backends import zarr_format
from raykit.store.backends.zarr_format import document_bytes
from raykit.store.order import (
    base_permutation,
    image_order,
    image_rotation,
    merge_counts,
    merge_into,
    reference_split_pids,
)
from raykit.store.schema import FieldSpec, SplitInfo
from raykit.store.spec import StoreSpec


def reference_merge_counts(sizes: tuple[int, ...], k: int) -> list[int]:
    keys = sorted((Fraction(2 * r + 1, 2 * n), i) for i, n in enumerate(sizes) for r in range(n))
    counts = [0] * len(sizes)
    for _, i in keys[:k]:
        counts[i] += 1
    return counts


# -- zarr itself, the oracle of the zarr backend's writer: its metadata documents and shard files -------


def zarr_codec(codec: Mapping[str, Any]) -> Any:
    """The zarr codec object of a ``field_codec`` entry (``zarr.codecs.ZstdCodec`` or ``BloscCodec``)."""
    from zarr.codecs import BloscCodec, ZstdCodec

    cfg = codec["configuration"]
    return ZstdCodec(**cfg) if codec["name"] == "zstd" else BloscCodec(**cfg)


def _array_kwargs(field: FieldSpec, info: SplitInfo, spec: StoreSpec) -> dict[str, Any]:
    from zarr.codecs import Crc32cCodec

    n_rays, chunk_rays = info.n_rays, info.chunk_rays
    shard_rays = chunk_rays * spec.shard_chunks
    tail = (field.channels,) if field.channels else ()
    return {
        "shape": (n_rays, *tail),
        "dtype": field.dtype,
        "chunks": (chunk_rays, *tail),
        "shards": (shard_rays, *tail),
        "compressors": [zarr_codec(zarr_format.field_codec(field, spec)), Crc32cCodec()],
        "fill_value": 0,
        "attributes": {"raykit_field": field.name},
    }


def reference_metadata_documents(
    splits: Mapping[str, SplitInfo], fields: Mapping[str, FieldSpec], spec: StoreSpec
) -> dict[str, bytes]:
    """Twin of ``zarr.metadata_documents`` (as ``document_bytes``): zarr builds the hierarchy in a
    ``MemoryStore``; its files' bytes."""
    import zarr

    mem = zarr.storage.MemoryStore()
    group = zarr.create_group(mem, attributes=zarr_format.ZARR_ROOT["attributes"])
    for split, info in splits.items():
        sub = group.create_group(split)
        for field in info.stored_fields(fields).values():
            sub.create_array(field.name, **_array_kwargs(field, info, spec))
    return {key: buffer.to_bytes() for key, buffer in mem._store_dict.items()}


def reference_encode_shard(
    values: np.ndarray, field: FieldSpec, info: SplitInfo, shard: int, spec: StoreSpec
) -> bytes:
    """Slow twin of ``zarr.encode_shard_pieces`` (joined): write the values into an in-memory zarr array,
    take the shard."""
    import zarr

    start = shard * info.chunk_rays * spec.shard_chunks
    mem = zarr.storage.MemoryStore()
    # Write every chunk, even all-zero ones, so that every shard file exists and reads are checked.
    array = zarr.create_array(mem, **_array_kwargs(field, info, spec), config={"write_empty_chunks": True})
    array[start : start + len(values)] = values
    key = zarr_format.shard_file(info.name, field, shard).split(f"/{field.name}/", 1)[1]
    encoded: bytes = mem._store_dict[key].to_bytes()
    return encoded


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6))
def test_merge_counts_match_the_merge(sizes: list[int]) -> None:
    total = sum(sizes)
    previous = [0] * len(sizes)
    for k in range(total + 1):
        counts = merge_counts(tuple(sizes), k)
        assert counts == reference_merge_counts(tuple(sizes), k)
        assert sum(counts) == k and all(a >= b for a, b in zip(counts, previous, strict=True))
        bound = [1.5 + 1.5 * len(sizes) * n / total for n in sizes]  # ties are broken by image index
        assert all(abs(c - k * n / total) < b for c, n, b in zip(counts, sizes, bound, strict=True))
        if len(set(sizes)) == 1:
            assert max(counts) - min(counts) <= 1
        previous = counts


def test_image_orders_are_rotations_of_a_shared_permutation() -> None:
    base = base_permutation(3, "train", 50)
    assert sorted(base.tolist()) == list(range(50)) and not base.flags.writeable
    orders = [image_order(3, "train", i, 50) for i in range(6)]
    for i, order in enumerate(orders):
        s = image_rotation(3, "train", i, 50)
        assert order.tolist() == [int(base[(r + s) % 50]) for r in range(50)]
    assert len({o.tobytes() for o in orders}) > 1  # the rotations differ
    assert not np.array_equal(base_permutation(3, "val", 50), base)


def _merge(runs: list[np.ndarray], sizes: list[int], lo: list[int], start: int, stop: int) -> np.ndarray:
    """The merge of one shard's ``runs`` (image ``i``'s values for ranks ``lo[i]`` on)."""
    hi = [a + len(run) for run, a in zip(runs, lo, strict=True)]

    def fill(i: int, out: np.ndarray) -> None:
        out[...] = runs[i]

    return merge_into(fill, runs[0].dtype, sizes, lo, hi, start, stop)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=5), st.data())
def test_merge_into_matches_the_merge(sizes: list[int], data: st.DataObject) -> None:
    # Runs hold (image, rank) codes, so the merge is checked value by value against sorted keys.
    total = sum(sizes)
    start = data.draw(st.integers(0, total))
    stop = data.draw(st.integers(start, total))
    lo, hi = merge_counts(tuple(sizes), start), merge_counts(tuple(sizes), stop)
    runs = [np.arange(a, b, dtype=np.int64) + 1000 * i for i, (a, b) in enumerate(zip(lo, hi, strict=True))]
    keys = sorted((Fraction(2 * r + 1, 2 * n), i, r) for i, n in enumerate(sizes) for r in range(n))
    expected = [1000 * i + r for _, i, r in keys[start:stop]]
    assert _merge(runs, sizes, lo, start, stop).tolist() == expected
    if len(sizes) > 1 and len(set(sizes)) > 1:  # the round-robin fast path agrees with sorting
        equal = [max(sizes)] * len(sizes)
        lo, hi = merge_counts(tuple(equal), start), merge_counts(tuple(equal), stop)
        runs = [np.arange(a, b) + 1000 * i for i, (a, b) in enumerate(zip(lo, hi, strict=True))]
        keys = sorted((Fraction(2 * r + 1, 2 * n), i, r) for i, n in enumerate(equal) for r in range(n))
        assert _merge(runs, equal, lo, start, stop).tolist() == [1000 * i + r for _, i, r in keys[start:stop]]


def test_chunks_hold_each_image_share(tmp_path: Path, record_factory, scene: SceneInfo) -> None:
    images = [(16, 16, "train", 3)] * 8 + [(8, 8, "train", 3)] * 4
    store = write_store(tmp_path / "s", record_factory(2, images), scene=scene, chunk_rays=96, shard_chunks=4)
    info = store.splits["train"]
    share = store.table.n_pixels[: info.n_images] / info.n_rays
    for c in range(info.n_chunks - 1):  # the last chunk is short
        image = store.decode_pids(store.read_chunk("train", c).pid)[0]
        counts = np.bincount(image, minlength=info.n_images)
        assert np.all(np.abs(counts - share * info.chunk_rays) < 4), counts


def test_shard_gathers_match_the_definition(tmp_path: Path, record_factory, scene: SceneInfo) -> None:
    images = [(8, 8, "train", 3), (5, 7, "train", 4), (9, 3, "train", 3), (6, 6, "val", 3)]
    for chunk_rays, shard_chunks in [(16, 2), (7, 3), (200, 1)]:
        store = write_store(
            tmp_path / f"s{chunk_rays}", record_factory(3, images), scene=scene, seed=5,
            chunk_rays=chunk_rays, shard_chunks=shard_chunks,
        )  # fmt: skip
        info = store.splits["train"]
        pids = np.concatenate([store.read_chunk("train", c).pid for c in range(info.n_chunks)])
        rows = [
            i for i, split in enumerate(store.table_arrow.column("split").to_pylist()) if split == "train"
        ]
        sizes = tuple(store.table_arrow.column("n_pixels").to_pylist()[i] for i in rows)
        offsets = list(itertools.accumulate((0, *sizes[:-1])))
        expected = reference_split_pids(5, "train", rows, sizes, offsets)
        np.testing.assert_array_equal(pids, expected)
        assert np.array_equal(np.sort(pids), np.arange(info.n_rays))


def test_train_rays_carry_their_pixels(tmp_path: Path, records, scene: SceneInfo) -> None:
    store = open_store(write_store(tmp_path / "s", records, scene=scene, chunk_rays=32, shard_chunks=3).url)
    info = store.splits["train"]
    raw = store.read("train", 0, info.n_rays)
    image, pixel = store.decode_pids(raw.pid)
    for rec_index, rec in enumerate(sorted(records, key=lambda r: (r.split != "train", r.name))):
        if rec.split != "train":
            continue
        pixels = rec.load()
        mine = image == rec_index
        got = raw.rgba[mine][:, : pixels.shape[2]]
        np.testing.assert_array_equal(got, pixels[pixel[mine, 1], pixel[mine, 0]])


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 40),  # chunk_rays
    st.integers(1, 4),  # shard_chunks
    st.integers(1, 300),  # n_rays
    st.sampled_from([("rgba", "uint8", 4), ("rgba", "uint8", 3), ("pid", "uint32", 0), ("o", "float16", 3)]),
    st.integers(1, 9),  # zstd / blosc level
    st.sampled_from([("lz4", "bitshuffle"), ("zstd", "shuffle"), ("lz4", "noshuffle")]),
    st.sampled_from([None, "lz4", "zstd"]),  # rgba codec (None: a layout from before the choice)
)
def test_shard_encoder_matches_zarr(chunk_rays, shard_chunks, n_rays, field, level, blosc, rgba) -> None:
    spec = FieldSpec(*field)
    info = SplitInfo("train", n_rays, 1, chunk_rays, True, 0)
    record = {
        "chunk_rays": chunk_rays,
        "shard_chunks": shard_chunks,
        "zstd_level": level,
        "blosc_clevel": level,
    }
    if rgba is not None:
        record["rgba_codec"] = rgba
    record.update(blosc_cname=blosc[0], blosc_shuffle=blosc[1])
    store_spec = StoreSpec.from_dict(record)
    values = np.random.default_rng(n_rays).integers(0, 200, spec.shape(n_rays)).astype(spec.dtype)
    shard_rays = chunk_rays * shard_chunks
    for shard in range(-(-n_rays // shard_rays)):
        part = values[shard * shard_rays : (shard + 1) * shard_rays]
        fast = b"".join(zarr_backend.encode_shard_pieces(part, spec, info, store_spec))
        assert fast == reference_encode_shard(part, spec, info, shard, store_spec)


def test_damaged_staging_file_is_redone(tmp_path: Path, records, scene: SceneInfo) -> None:
    from raykit.store.write.tasks import write_shard_task

    class CrashAfterStaging(concurrent.futures.Executor):
        def map(self, fn, *iterables, **kwargs):  # type: ignore[no-untyped-def, override]
            if fn is write_shard_task:
                raise RuntimeError("simulated crash before phase 2")
            return map(fn, *iterables)

    dst = tmp_path / "store"
    with pytest.raises(RuntimeError, match="phase 2"):
        write_store(dst, records, scene=scene, executor=CrashAfterStaging(), chunk_rays=32, shard_chunks=2)
    staged = sorted((tmp_path / "store.partial" / "staging").glob("*.px"))
    data = bytearray(staged[0].read_bytes())
    data[len(data) // 2] ^= 1
    staged[0].write_bytes(bytes(data))
    write_store(dst, records, scene=scene, chunk_rays=32, shard_chunks=2)
    write_store(tmp_path / "fresh", records, scene=scene, chunk_rays=32, shard_chunks=2)
    tree = {p.relative_to(dst): p.read_bytes() for p in dst.rglob("*") if p.is_file()}
    fresh = {
        p.relative_to(tmp_path / "fresh"): p.read_bytes()
        for p in (tmp_path / "fresh").rglob("*")
        if p.is_file()
    }
    assert tree == fresh


@settings(max_examples=20, deadline=None)
@given(
    st.integers(1, 10**9),  # n_rays
    st.integers(1, 1 << 17),  # chunk_rays
    st.integers(1, 64),  # shard_chunks
    st.sampled_from([None, "lz4", "zstd"]),  # rgba codec
    st.sampled_from([("lz4", 5, "bitshuffle"), ("zstd", 4, "shuffle"), ("lz4", 1, "noshuffle")]),
    st.integers(1, 9),  # zstd level
)
def test_zarr_metadata_matches_zarr(n_rays, chunk_rays, shard_chunks, rgba, blosc, level) -> None:
    record: dict[str, Any] = {"chunk_rays": chunk_rays, "shard_chunks": shard_chunks, "zstd_level": level}
    record.update(blosc_cname=blosc[0], blosc_clevel=blosc[1], blosc_shuffle=blosc[2])
    if rgba is not None:
        record["rgba_codec"] = rgba
    splits = {"train": SplitInfo("train", n_rays, 3, chunk_rays, True, 0),
              "val": SplitInfo("val", 7, 1, chunk_rays, False, n_rays)}  # fmt: skip
    specs = [FieldSpec("rgba", "uint8", 4), FieldSpec("pid", "uint32", 0), FieldSpec("origins", "float16", 3),
             FieldSpec("directions", "float32", 3)]  # fmt: skip
    fields = {spec.name: spec for spec in specs}
    spec = StoreSpec.from_dict(record)
    ours = zarr_backend.metadata_documents(splits, fields, spec)
    theirs = reference_metadata_documents(splits, fields, spec)
    assert {key: document_bytes(doc) for key, doc in ours.items()} == theirs


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 30), st.data())
def test_merge_counts_of_equal_sizes_are_a_round_robin(images: int, n: int, data: st.DataObject) -> None:
    # the fast path for images of one size against the general (rational) merge of unequal sizes' code
    sizes = (n,) * images
    for k in {0, images * n, *data.draw(st.lists(st.integers(0, images * n), max_size=8))}:
        assert merge_counts(sizes, k) == reference_merge_counts(sizes, k)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 640])
@pytest.mark.parametrize("channels", [3, 4])
def test_packed_pixels_match_their_twins(n: int, channels: int) -> None:
    from raykit.store.write.staging import pack_rgba, pack_rgba_reference, unpack_rgb, unpack_rgb_reference

    rng = np.random.default_rng(n * channels)
    image = rng.integers(0, 256, (n, channels), dtype=np.uint8)
    image.flags.writeable = False  # decoders hand out read-only arrays
    packed = pack_rgba(image)
    np.testing.assert_array_equal(packed, pack_rgba_reference(image))
    assert packed.dtype == np.uint32 and packed.shape == (n,)
    if channels == 3:
        assert np.all(packed.view(np.uint8).reshape(n, 4)[:, 3] == 255)
    out = np.full(n, 7, dtype=np.uint32)
    assert pack_rgba(image, out=out) is out
    np.testing.assert_array_equal(out, packed)
    # a strided view (every other pixel of a wider image) packs the same as its copy
    wide = rng.integers(0, 256, (2 * n, channels), dtype=np.uint8)
    np.testing.assert_array_equal(pack_rgba(wide[::2]), pack_rgba_reference(np.ascontiguousarray(wide[::2])))
    words = rng.integers(0, 2**32, n, dtype=np.uint32)
    np.testing.assert_array_equal(unpack_rgb(words), unpack_rgb_reference(words))
    np.testing.assert_array_equal(unpack_rgb(packed), image[:, :3])
    assert pack_rgba(np.zeros((0, channels), np.uint8)).shape == (0,)
    assert unpack_rgb(words[:0]).shape == (0, 3)


def test_writer_drops_the_stage_index_memos(tmp_path: Path, records, scene: SceneInfo) -> None:
    from raykit.store.write import staging

    held = staging.base_indices(0, "train", 10)
    assert staging.base_indices(0, "train", 10) is held  # memoised
    write_store(tmp_path / "s", records, scene=scene, chunk_rays=32, shard_chunks=3)
    assert staging.base_indices(0, "train", 10) is not held  # dropped by the writer, made anew
    base = staging.base_indices(3, "train", 50)  # the memo is base_n as intp, read-only
    assert base.dtype == np.intp and not base.flags.writeable
    np.testing.assert_array_equal(base, base_permutation(3, "train", 50))


def test_crc32c_combine_equals_the_crc_of_the_joined_bytes() -> None:
    import google_crc32c

    from raykit.store.write.staging import crc32c_combine

    rng = np.random.default_rng(5)
    for n1, n2 in [(0, 0), (16, 0), (0, 9), (16, 4096 * 3 + 5), (1, 1), (1000, 77)]:
        a, b = rng.integers(0, 256, n1, np.uint8).tobytes(), rng.integers(0, 256, n2, np.uint8).tobytes()
        assert crc32c_combine(google_crc32c.value(a), google_crc32c.value(b), n2) == google_crc32c.value(
            a + b
        )


def test_a_shard_written_past_the_page_cache_has_its_bytes(tmp_path: Path) -> None:
    """``write_uncached``: its aligned prefix direct where the file system takes it (here, and on a
    tmpfs that refuses ``O_DIRECT``: written plainly), the rest after it; unaligned data plainly."""
    from raykit.store.write.tasks import ALIGN, write_uncached

    raw = np.random.default_rng(6).integers(0, 256, 3 * ALIGN + 100 + ALIGN, np.uint8)
    aligned = raw[-raw.ctypes.data % ALIGN :][: 3 * ALIGN + 100]
    folders = [tmp_path] + ([Path("/dev/shm")] if Path("/dev/shm").is_dir() else [])
    for folder in folders:
        for name, data in [("aligned", aligned), ("unaligned", raw[1 : 2 * ALIGN + 1])]:
            path = folder / f"raykit-test-{os.getpid()}-{name}"
            try:
                write_uncached(path, data.data)
                assert path.read_bytes() == data.tobytes()
            finally:
                path.unlink(missing_ok=True)
