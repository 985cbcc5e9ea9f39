"""Chunk checksums: CRC-32C in formats 2 and 3, zlib CRC-32 in format-1 stores; format 1 and 2 stores
(built here from fresh ones: ``downgrade``) still read, validate and copy."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest

from raykit.errors import StoreCorruptError
from raykit.fileio import sha256_file
from raykit.store import ImageRecord, SceneInfo, open_store, write_store
from raykit.store.files import chunk_checksum, content_fingerprint, json_digest
from raykit.store.schema import DerivedRays
from raykit.store.validate import validate_store
from raykit.store.write import copy_store


def test_chunk_checksum_is_one_stream_over_the_fields() -> None:
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (37, 4), dtype=np.uint8)
    values = {"rgba": rgba, "pid": rng.permutation(37).astype(np.uint32)}
    stream = values["rgba"].tobytes() + values["pid"].tobytes()
    assert chunk_checksum(values, ["rgba", "pid"]) == google_crc32c.value(stream)
    assert chunk_checksum(values, ["rgba", "pid"], "crc32") == zlib.crc32(stream)
    strided = {"rgba": np.asfortranarray(values["rgba"]), "pid": values["pid"][::-1][::-1]}
    assert chunk_checksum(strided, ["rgba", "pid"]) == google_crc32c.value(stream)
    with pytest.raises(ValueError, match="crc32"):
        chunk_checksum(values, ["rgba"], "md5")


def _resign_manifest(root: Path, files: tuple[str, ...], **changes: object) -> None:
    """After editing a store by hand: refresh the records of ``files``, apply ``changes`` to the
    manifest, recompute its digest."""
    manifest = json.loads((root / "manifest.json").read_text())
    for rel in files:
        manifest["files"][rel] = {"size": (root / rel).stat().st_size, "sha256": sha256_file(root / rel)}
    manifest.update(changes)
    manifest.pop("manifest_digest")
    manifest["manifest_digest"] = json_digest(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def downgrade(root: Path, version: int) -> None:
    """Rewrite a fresh store written ``with_pids`` as raykit wrote it in format ``version`` (1 or 2):
    every pid stored, one checksum per chunk over every field (format 1: zlib CRC-32, index key
    ``crc32``), split records without ``pids``/``layout``, no ``train_order`` in the layout."""
    store = open_store(root)
    assert all(info.pids == "stored" for info in store.splits.values())
    kind = "crc32" if version == 1 else "crc32c"
    index = json.loads((root / "index.json").read_text())
    crcs = {}
    for split, info in store.splits.items():
        chunks = [store.read_chunk(split, i) for i in range(info.n_chunks)]
        crcs[split] = [chunk_checksum({"rgba": c.rgba, "pid": c.pid, **c.extra}, list(store.fields), kind)
                       for c in chunks]  # fmt: skip
        index[split].pop("crc32c")
        index[split].pop("pid_crc32c")
        index[split][kind] = crcs[split]
    (root / "index.json").write_text(json.dumps(index))
    manifest = store.manifest
    splits = {name: info.legacy_dict() for name, info in store.splits.items()}
    layout = {k: v for k, v in manifest["layout"].items() if k != "train_order"}
    fingerprint = content_fingerprint(
        store.table_arrow, manifest["scene"], splits, manifest["fields"], crcs, kind
    )
    _resign_manifest(
        root, ("index.json",), format_version=version, content_fingerprint=fingerprint, splits=splits,
        layout=layout,
    )  # fmt: skip


@pytest.mark.parametrize(("backend", "version"), [("zarr", 1), ("wds", 1), ("zarr", 2), ("wds", 2)])
def test_older_format_stores_read_check_and_copy(
    tmp_path: Path, records: list[ImageRecord], scene: SceneInfo, backend: str, version: int
) -> None:
    kw: dict[str, Any] = {"scene": scene, "backend": backend, "chunk_rays": 64, "shard_chunks": 2}
    fresh = write_store(tmp_path / "v3", records, **kw)
    assert fresh.reader.checksum_kind == "crc32c" and fresh.manifest["format_version"] == 3
    assert all(info.pids == "derived" for info in fresh.splits.values())
    old = tmp_path / f"v{version}"
    write_store(old, records, with_pids=True, **kw)
    downgrade(old, version)
    store = open_store(old)
    kind = "crc32" if version == 1 else "crc32c"
    assert store.legacy and store.reader.checksum_kind == kind and validate_store(str(old)) == []
    for split, info in store.splits.items():
        for i in range(info.n_chunks):
            a, b = store.read_chunk(split, i), fresh.read_chunk(split, i)
            assert not isinstance(a, DerivedRays) and isinstance(b, DerivedRays)
            np.testing.assert_array_equal(a.rgba, b.rgba)
            np.testing.assert_array_equal(a.pid, b.pid)
    # a copy is written in the current format (pids stored, checksums anew): its fingerprint is that
    # of the same content written today, in every backend
    copies = [
        copy_store(old, tmp_path / f"copy-{to}-{with_pids}", backend=to, with_pids=with_pids)
        for to in ("zarr", "wds")
        for with_pids in (False, True)
    ]
    for copy in copies:
        assert copy.reader.checksum_kind == "crc32c" and copy.manifest["format_version"] == 3
        assert not copy.legacy and {info.pids for info in copy.splits.values()} == {"stored"}
        assert copy.fingerprint == copies[0].fingerprint and validate_store(copy.url) == []
        np.testing.assert_array_equal(copy.read("train", 0, 50).pid, fresh.read("train", 0, 50).pid)
    assert copies[0].fingerprint == fresh.fingerprint != store.fingerprint  # as if written today
    # an older format's checksum still catches a wrong chunk
    index = json.loads((old / "index.json").read_text())
    index["train"][kind][0] ^= 1
    (old / "index.json").write_text(json.dumps(index))
    _resign_manifest(old, ("index.json",))
    with pytest.raises(StoreCorruptError, match=f"expected {kind} "):
        open_store(old).read_chunk("train", 0)
