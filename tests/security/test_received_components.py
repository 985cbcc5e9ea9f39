"""A received store's component arrays cannot make raykit allocate what their ``.npy`` headers claim.

Each image's mask or depth map is an ``.npy`` whose header states its dtype and shape; ``np.load``
would allocate that many elements before reading. Here a header claims (10**6, 10**6) float32
(4 TB) while the store is otherwise consistent (the index's CRC-32C, the zarr chunk's CRC-32C and the
manifest's file records rewritten to match): the header check is what must catch it, in one line
naming the file, before any allocation.
"""

from __future__ import annotations

import io
import json
import resource
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from raykit.errors import StoreCorruptError
from raykit.store import add_component, open_store
from raykit.store.files import file_record
from raykit.store.validate import validate_store

from .conftest import cli, resign

pytestmark = pytest.mark.timeout(10, func_only=True)  # each case; not the shared fixtures

HUGE = (10**6, 10**6)
CHUNK = 1 << 16  # the zarr component's inner chunk (its CRC-32C follows it)


def _huge_header(length: int) -> bytes:
    """An ``.npy`` version 1.0 header of ``length`` bytes claiming a float32 array of shape HUGE."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False, "shape": HUGE})
    header = buffer.getvalue()
    assert len(header) == length  # the same length: every offset in the index stays right
    return header


def _forge(store: Path, backend: str) -> tuple[str, str]:
    """Give image 0 of ``train`` a depth map whose header claims HUGE, every checksum made to agree;
    its name and the payload file holding it."""
    add_component(store, "depth", lambda name, h, w: np.full((h, w), 2.5, np.float32))
    reader = open_store(store)
    name = reader.table.names[int(reader.split_rows("train")[0])]
    data, rel = reader.component_reader.stored("depth", reader.image_index(name))
    forged = _huge_header(128) + data[128:]
    raw = bytearray((store / rel).read_bytes())
    at = raw.find(data)
    raw[at : at + len(data)] = forged
    if backend == "zarr":  # the inner chunk's own CRC-32C (the data lies in chunk 0)
        assert at + len(data) <= CHUNK
        raw[CHUNK : CHUNK + 4] = int(google_crc32c.value(bytes(raw[:CHUNK]))).to_bytes(4, "little")
    (store / rel).write_bytes(bytes(raw))
    index_path = store / "index-depth.json"
    index = json.loads(index_path.read_text())
    index["train"]["crc32c"][0] = int(google_crc32c.value(forged))
    index_path.write_text(json.dumps(index))

    def edit(manifest: dict) -> None:
        manifest["files"][rel] = file_record(store / rel)
        manifest["files"]["index-depth.json"] = file_record(index_path)

    resign(store, edit)
    return name, rel


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_a_component_header_claiming_a_huge_shape_is_one_line(received, backend: str, capsys) -> None:
    store = received(backend)
    name, rel = _forge(store, backend)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    reader = open_store(store)
    expected = rf"{rel}: {name!r}: expected a depth of float32 \(8, 12\), got float32 \(1000000, 1000000\)"
    with pytest.raises(StoreCorruptError, match=expected) as caught:
        reader.read_component("depth", name)
    assert "\n" not in str(caught.value)
    with pytest.raises(StoreCorruptError, match=expected):  # the loaders' batched read alike
        dict(reader.read_split_components("depth", "train", range(4)))
    problems = validate_store(store)
    assert len(problems) == 1 and rel in problems[0] and "(1000000, 1000000)" in problems[0], problems
    code, lines = cli(["validate", str(store)], capsys)
    assert code == 1 and any(rel in line and "(1000000, 1000000)" in line for line in lines), lines
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing allocated
