"""Chunk checksums: CRC-32C in format 2, zlib CRC-32 in format-1 stores, which still read and copy."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from raykit.errors import StoreCorruptError
from raykit.fileio import sha256_file
from raykit.store import ImageRecord, SceneInfo, open_store, write_store
from raykit.store.integrity import chunk_checksum, content_fingerprint, json_digest
from raykit.store.validate import validate_store
from raykit.store.writer import copy_store


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


def _downgrade_to_format_1(root: Path) -> None:
    """Rewrite a fresh store's index and manifest as raykit wrote them in format 1 (zlib CRC-32)."""
    store = open_store(root)
    index = json.loads((root / "index.json").read_text())
    crcs = {}
    for split, info in store.splits.items():
        chunks = [store.read_chunk(split, i) for i in range(info.n_chunks)]
        crcs[split] = [chunk_checksum({"rgba": c.rgba, "pid": c.pid, **c.extra}, list(store.fields), "crc32")
                       for c in chunks]  # fmt: skip
        index[split]["crc32"] = crcs[split]
        del index[split]["crc32c"]
    (root / "index.json").write_text(json.dumps(index))
    manifest = store.manifest
    fingerprint = content_fingerprint(
        store.cameras, manifest["scene"], manifest["splits"], manifest["fields"], crcs, "crc32"
    )
    _resign_manifest(root, ("index.json",), format_version=1, content_fingerprint=fingerprint)


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_format_1_store_reads_checks_and_copies(
    tmp_path: Path, records: list[ImageRecord], scene: SceneInfo, backend: str
) -> None:
    fresh = write_store(tmp_path / "v2", records, scene=scene, backend=backend, chunk_rays=64, shard_chunks=2)
    assert fresh.chunk_checksum == "crc32c" and fresh.manifest["format_version"] == 2
    old = tmp_path / "v1"
    write_store(old, records, scene=scene, backend=backend, chunk_rays=64, shard_chunks=2)
    _downgrade_to_format_1(old)
    store = open_store(old)
    assert store.chunk_checksum == "crc32" and validate_store(str(old)) == []
    for split, info in store.splits.items():
        for i in range(info.n_chunks):
            a, b = store.read_chunk(split, i), fresh.read_chunk(split, i)
            np.testing.assert_array_equal(a.rgba, b.rgba)
            np.testing.assert_array_equal(a.pid, b.pid)
    # a copy keeps the source's checksum kind, so the fingerprints agree
    other = "wds" if backend == "zarr" else "zarr"
    copy = copy_store(old, tmp_path / "copy", backend=other)
    assert copy.chunk_checksum == "crc32" and copy.fingerprint == store.fingerprint
    assert copy.fingerprint != fresh.fingerprint
    # a format-1 checksum still catches a wrong chunk
    index = json.loads((old / "index.json").read_text())
    index["train"]["crc32"][0] ^= 1
    (old / "index.json").write_text(json.dumps(index))
    _resign_manifest(old, ("index.json",))
    with pytest.raises(StoreCorruptError, match="expected crc32 "):
        open_store(old).read_chunk("train", 0)
