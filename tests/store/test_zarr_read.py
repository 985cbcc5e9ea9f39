"""The direct read of local zarr shards against zarr's own read path (its twin)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.errors import StoreCorruptError
from raykit.store import SceneInfo, open_store, write_store
from raykit.store.backends import zarr as zarr_read
from raykit.store.backends import zarr_format
from raykit.store.schema import ImageRecord


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, records: list[ImageRecord], scene: SceneInfo) -> Any:
    # Small chunks and shards: several shards, a short last chunk and unstored chunks in the last shard.
    path = tmp_path_factory.mktemp("zread") / "store"
    # with stored pids: a multi-byte field (bit-shuffled blosc) beside the colours
    return write_store(
        path, records, scene=scene, backend="zarr", chunk_rays=96, shard_chunks=3, with_pids=True
    )


def test_direct_reads_equal_zarr_reads(store: Any) -> None:
    reader = store.reader.chunks
    assert isinstance(reader, zarr_read.ZarrReader)
    for info in store.splits.values():
        assert info.n_rays % info.chunk_rays, "the fixture should have a short last chunk"
        for index in range(info.n_chunks):
            fast = reader.values(info, index)
            slow = reader.values(info, index, fast=False)
            assert fast.keys() == slow.keys()
            for name in fast:
                assert fast[name].flags.writeable
                np.testing.assert_array_equal(fast[name], slow[name])
                assert fast[name].dtype == slow[name].dtype


def test_only_raykits_own_layout_takes_the_direct_path(store: Any) -> None:
    meta = json.loads((Path(store.url.removeprefix("file://")) / "zarr/train/pid/zarr.json").read_text())
    assert zarr_format.direct_shard_codec(meta) is not None
    other = json.loads(json.dumps(meta))
    other["codecs"][0]["configuration"]["index_location"] = "start"
    assert zarr_format.direct_shard_codec(other) is None
    other = json.loads(json.dumps(meta))
    other["codecs"][0]["configuration"]["codecs"][1] = {"name": "gzip", "configuration": {"level": 1}}
    assert zarr_format.direct_shard_codec(other) is None
    assert zarr_format.direct_shard_codec({"codecs": [{"name": "bytes"}]}) is None


def _copy(store: Any, dst: Path) -> Path:
    import shutil

    shutil.copytree(Path(store.url.removeprefix("file://")), dst)
    return dst


@pytest.mark.parametrize("where", ["chunk", "index"])
def test_damaged_shards_are_named(store: Any, tmp_path: Path, where: str) -> None:
    root = _copy(store, tmp_path / "copy")
    shard = root / "zarr/train/pid/c/0"
    data = bytearray(shard.read_bytes())
    data[3 if where == "chunk" else len(data) - 10] ^= 0xFF
    shard.write_bytes(bytes(data))
    damaged = open_store(root)
    info = damaged.splits["train"]
    with pytest.raises(StoreCorruptError, match=r"zarr/train/pid/c/0.*(crc32c|shard index)"):
        damaged.reader.chunks.values(info, 0)
