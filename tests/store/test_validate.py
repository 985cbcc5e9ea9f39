"""``validate_store`` finds semantic problems even when every checksum has been recomputed to match."""

from __future__ import annotations

import io
import json
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

from raykit.fileio import sha256_file
from raykit.store import SceneInfo, open_store, write_store
from raykit.store.backends import npy_bytes
from raykit.store.files import json_digest
from raykit.store.validate import validate_store


def _rewrite_chunk(root: Path, split: str, chunk: int, values: dict[str, np.ndarray]) -> None:
    """Overwrite a wds chunk's members in place, then re-sign index, file records and manifest."""
    store = open_store(root)
    index = json.loads((root / "index.json").read_text())
    rel = f"wds/{split}-{index[split]['shard'][chunk]:06d}.tar"
    data = bytearray((root / rel).read_bytes())
    for name, array in values.items():
        offset, size = index[split]["members"][chunk][name]
        blob = npy_bytes(array)
        assert len(blob) == size
        data[offset : offset + size] = blob
    (root / rel).write_bytes(bytes(data))
    fields = {**_members(root, index, split, chunk), **values}
    crc = 0
    for name in store.fields:
        if name != "pid":  # format 3: pids stored (``with_pids``) have their own checksum
            crc = google_crc32c.extend(crc, np.ascontiguousarray(fields[name]).tobytes())
    index[split]["crc32c"][chunk] = crc
    index[split]["pid_crc32c"][chunk] = google_crc32c.value(np.ascontiguousarray(fields["pid"]).tobytes())
    (root / "index.json").write_text(json.dumps(index))
    manifest = json.loads((root / "manifest.json").read_text())
    for path in (rel, "index.json"):
        manifest["files"][path] = {"size": (root / path).stat().st_size, "sha256": sha256_file(root / path)}
    manifest.pop("manifest_digest")
    manifest["manifest_digest"] = json_digest(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def _members(root: Path, index: dict, split: str, chunk: int) -> dict[str, np.ndarray]:
    rel = f"wds/{split}-{index[split]['shard'][chunk]:06d}.tar"
    data = (root / rel).read_bytes()
    out = {}
    for name, (offset, size) in index[split]["members"][chunk].items():
        out[name] = np.load(io.BytesIO(data[offset : offset + size]))
    return out


@pytest.fixture()
def wds_store(tmp_path: Path, records, scene: SceneInfo) -> Path:
    # with stored pids, so that the tests can write wrong ones (format 3 derives them otherwise)
    write_store(
        tmp_path / "s", records, scene=scene, backend="wds", chunk_rays=64, shard_chunks=2, with_pids=True
    )
    assert validate_store(tmp_path / "s") == []
    return tmp_path / "s"


def test_duplicated_pixel_is_reported(wds_store: Path) -> None:
    store = open_store(wds_store)
    pid = store.read_chunk("train", 0).pid.copy()
    image, _ = store.decode_pids(pid)
    j = int(np.flatnonzero(image == image[0])[1])  # a ray of the same image (same alpha rule)
    pid[j] = pid[0]
    _rewrite_chunk(wds_store, "train", 0, {"pid": pid})
    assert validate_store(wds_store) == []  # consistent hashes: only decoding shows it
    problems = validate_store(wds_store, deep=True)
    assert problems == [f"{open_store(wds_store).url}: split 'train': 1 pixels missing, 1 duplicated"]


def test_eval_rays_out_of_order_are_reported(wds_store: Path) -> None:
    pid = open_store(wds_store).read_chunk("val", 0).pid.copy()
    pid[[0, 1]] = pid[[1, 0]]
    _rewrite_chunk(wds_store, "val", 0, {"pid": pid})
    assert validate_store(wds_store) == []  # consistent hashes: only decoding shows it
    problems = validate_store(wds_store, deep=True)
    assert len(problems) == 1 and "row-major" in problems[0] and "'val' chunk 0" in problems[0]


def test_alpha_of_rgb_image_is_reported(wds_store: Path) -> None:
    store = open_store(wds_store)
    raw = store.read_chunk("val", 0)
    image, _ = store.decode_pids(raw.pid)
    assert not store.table.has_alpha[image].all()
    rgba = raw.rgba.copy()
    rgba[~store.table.has_alpha[image], 3] = 7
    _rewrite_chunk(wds_store, "val", 0, {"rgba": rgba})
    assert validate_store(wds_store) == []  # consistent hashes: only decoding shows it
    problems = validate_store(wds_store, deep=True)
    assert len(problems) == 1 and "alpha != 255" in problems[0]


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_missing_shard_is_listed_once(tmp_path: Path, records, scene: SceneInfo, backend: str) -> None:
    root = tmp_path / "s"
    write_store(root, records, scene=scene, backend=backend, chunk_rays=64, shard_chunks=2)
    payload = sorted(p for p in (root / backend).rglob("*") if p.is_file() and "zarr.json" not in p.name)
    lost = next(p for p in payload if "train" in p.as_posix())
    lost.unlink()
    problems = validate_store(root)
    assert len(problems) == 1 and problems[0].endswith(f"{lost.relative_to(root).as_posix()}: file missing")


def test_local_paths_with_url_syntax_are_local(tmp_path: Path, records, scene: SceneInfo) -> None:
    """``::`` (an fsspec chain) and ``#`` in a local path: written and opened as the local folder."""
    for backend in ("zarr", "wds"):
        root = tmp_path / "out" / f"a::b#{backend}.store"
        store = write_store(root, records, scene=scene, backend=backend, chunk_rays=64)
        assert store.url == str(root.resolve())
        assert validate_store(root) == []
        assert open_store(root).read_chunk("train", 0).pid.size == 64


def test_writer_and_validate_share_one_pose_check(tmp_path: Path, records, scene: SceneInfo) -> None:
    """A pose the writer accepts validates (one tolerance: a rotation 5e-5 off orthonormal passes
    both), and a bad one gets one line from the one check (``raykit.store.table.record_problems``)."""
    import dataclasses

    from raykit.errors import ConfigError
    from raykit.store.table import record_problems

    nearly = np.array(records[0].c2w, dtype=np.float64)
    nearly[:3, :3] *= 1 + 5e-5
    store = write_store(tmp_path / "a", [dataclasses.replace(records[0], c2w=nearly)], scene=scene)
    assert validate_store(store.url) == []
    mirrored = nearly @ np.diag([1.0, 1.0, -1.0, 1.0])
    message = f"image {records[0].name!r}: expected c2w with an orthonormal right-handed rotation"
    with pytest.raises(ConfigError, match=message):
        write_store(tmp_path / "b", [dataclasses.replace(records[0], c2w=mirrored)], scene=scene)
    unknown = np.full(1, np.nan)
    assert record_problems([records[0].name], mirrored[None], unknown, unknown) == [message]
