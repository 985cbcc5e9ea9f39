"""Per-image components (masks, depth maps) and per-frame metadata: the built-in scene written as a
nerfstudio capture (``raykit.testing.write_nerfstudio``) converted in both layouts and backends, read
back against its source files transformed by the reference twin; adding a component later; integrity."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raykit.cli import main
from raykit.converters import convert
from raykit.errors import ConfigError, SourceError, StoreCorruptError
from raykit.image_geometry import downscale_depth, downscale_mask
from raykit.imagedecode import downscale_nearest, reference_downscale_nearest
from raykit.store import ComponentInfo, add_component, copy_store, open_store, validate_store
from raykit.testing import render_scene, write_nerfstudio

LAYOUTS = [("rays", "zarr"), ("rays", "wds"), ("images", "zarr"), ("images", "wds")]


@pytest.fixture(scope="module")
def scene():
    return render_scene("tiny", seed=3)


@pytest.fixture(scope="module")
def capture(scene, tmp_path_factory) -> Path:
    return write_nerfstudio(scene, tmp_path_factory.mktemp("ns") / "cap")


def _sources(capture: Path, name: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """The source mask (uint8), depth (float32 metres) and frame entry of image ``name``."""
    meta = json.loads((capture / "transforms.json").read_text())
    frame = next(f for f in meta["frames"] if f["file_path"] == name)
    mask = np.asarray(Image.open(capture / frame["mask_path"]))
    raw = np.asarray(Image.open(capture / frame["depth_file_path"])).astype(np.float32)
    return mask, raw * np.float32(meta["depth_unit_scale_factor"]), frame


@pytest.mark.parametrize("h,w", [(7, 9), (12, 12), (13, 5)])
@pytest.mark.parametrize("factor", [1, 2, 3, 4])
def test_downscale_nearest_matches_its_twin(h: int, w: int, factor: int) -> None:
    values = np.random.default_rng(h * w + factor).random((h, w)).astype(np.float32)
    np.testing.assert_array_equal(
        downscale_depth(values, factor), reference_downscale_nearest(values, factor)
    )
    mask = (values * 255).astype(np.uint8)
    np.testing.assert_array_equal(downscale_mask(mask, factor), reference_downscale_nearest(mask, factor))
    assert downscale_mask(mask, factor).shape == (h // factor, w // factor)
    size = ((2 * h + factor) // (2 * factor), (2 * w + factor) // (2 * factor))  # mipnerf360's
    np.testing.assert_array_equal(
        downscale_nearest(mask, factor, size), reference_downscale_nearest(mask, factor, size)
    )
    # level k takes the pixel under each k x k block's centre; depths are never blended
    assert set(np.unique(downscale_depth(values, factor))) <= set(np.unique(values))


@pytest.mark.parametrize("layout,backend", LAYOUTS)
def test_round_trip_equals_sources(capture: Path, tmp_path: Path, layout: str, backend: str) -> None:
    store = convert(capture, tmp_path / "s", layout=layout, backend=backend, progress=False)
    assert set(store.components) == {"mask", "depth"}
    mask_info, depth_info = store.components["mask"], store.components["depth"]
    assert (mask_info.dtype, depth_info.dtype, depth_info.unit, depth_info.scale) == (
        "bit",
        "float32",
        "m",
        1e-3,
    )
    for name in store.table.names:
        mask, depth, frame = _sources(capture, name)
        np.testing.assert_array_equal(store.read_component("mask", name), np.where(mask > 0, 255, 0))
        np.testing.assert_array_equal(store.read_component("depth", name), depth)
        for k in (2, 3):  # the loaders' levels: read_image's size, nearest sample
            got = store.read_component("mask", name, downscale=k)
            assert got.shape == store.read_image(name, downscale=k).shape[:2]
            np.testing.assert_array_equal(got, reference_downscale_nearest(np.where(mask > 0, 255, 0), k))
            want = reference_downscale_nearest(depth, k)
            np.testing.assert_array_equal(store.read_component("depth", name, downscale=k), want)
        kept = {k: frame[k] for k in ("exposure_time", "timestamp", "sensor")}
        assert store.frame_metadata(name) == kept  # unknown per-frame keys are kept
    _check_batched_reads(store)
    assert validate_store(store.url) == []
    assert store.store_fingerprint != store.fingerprint


def _check_batched_reads(store) -> None:
    """``read_split_components`` (runs of images read at once, in any order asked, a subset) gives
    what ``read_component`` gives image by image; ``read_blobs`` likewise, with one read per file in
    one run and each blob's range read alone when no two may share a read."""
    from raykit.store.backends import backend_named, component_blobs, read_blob, read_blobs

    calls: list[tuple[str, int, int]] = []

    def read(rel: str, start: int, stop: int) -> bytes:
        calls.append((rel, start, stop))
        return store.storage.read_range(rel, start, stop)

    backend = backend_named(store.backend)
    for split in store.splits:
        rows = store.split_rows(split)
        for component in ("mask", "depth"):
            wanted = list(range(len(rows)))[::-1][::2]  # every other image, asked backwards
            got = dict(store.read_split_components(component, split, wanted))
            assert list(got) == sorted(wanted)
            for i, array in got.items():
                np.testing.assert_array_equal(
                    array, store.read_component(component, store.table.names[rows[i]])
                )
            entry, blobs = store.component_reader._index(component)[split], component_blobs(component)
            calls.clear()

            every = range(len(rows))
            ranged, url = store.storage.read_range, store.url
            alone = [bytes(b"".join(read_blob(backend, blobs, ranged, url, split, entry, i))) for i in every]
            args = (backend, blobs, read, store.url, split, entry, every)
            assert [bytes(b"".join(p)) for _, p in read_blobs(*args)] == alone
            assert len(calls) == len({rel for rel, _, _ in calls})  # one run: each file read once
            calls.clear()
            assert [bytes(b"".join(p)) for _, p in read_blobs(*args, span=1, gap=0)] == alone
            # nothing merged: each blob range read at most once, as is (a range inside another: not at all)
            ranges = {r for i in every for r in backend.blob_ranges(blobs, split, entry, i)}
            assert set(calls) <= ranges and len(calls) == len(set(calls))
            assert all(any(c[0] == r[0] and c[1] <= r[1] and r[2] <= c[2] for c in calls) for r in ranges)


@pytest.mark.parametrize("h,w", [(1, 1), (7, 9), (13, 64), (300, 301)])
def test_stored_size_is_the_encoded_size(h: int, w: int) -> None:
    """The writer plans a split's shards from ``stored_size`` before encoding: it is the length of
    ``encode_component``'s bytes for every dtype and width (a bit mask's rows round up to bytes)."""
    from raykit.store.components import encode_component, stored_size

    values = np.random.default_rng(h * w).random((h, w)).astype(np.float32)
    for name, dtype in (("mask", "bit"), ("mask", "uint8"), ("depth", "float16"), ("depth", "float32")):
        info = ComponentInfo(name, dtype)
        data = encode_component(info, (values * 255).astype(np.uint8) if name == "mask" else values, "x")
        assert stored_size(info, h, w) == len(data)


def _npy_bytes(values: np.ndarray, version: tuple[int, int] = (1, 0)) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, values, version=version, allow_pickle=False)
    return buffer.getvalue()


def test_decode_component_checks_the_header_before_loading() -> None:
    """raykit's own ``.npy`` (read without parsing), a version 2.0 header and Fortran order (parsed) give
    np.load's values; a header of another dtype or shape, a bad magic or a wrong length: one line."""
    from raykit.store.components import decode_component, encode_component

    rng = np.random.default_rng(5)
    depth = rng.random((7, 9)).astype(np.float32)
    mask = rng.integers(0, 2, (7, 9)).astype(np.uint8)
    infos = {
        "depth": ComponentInfo("depth", "float32"),
        "half": ComponentInfo("depth", "float16"),
        "mask": ComponentInfo("mask", "uint8"),
        "bits": ComponentInfo("mask", "bit"),
    }
    for key, values in (("depth", depth), ("half", depth), ("mask", mask * 200), ("bits", mask)):
        info = infos[key]
        data = encode_component(info, values, "x")
        stored = np.load(io.BytesIO(data))
        want = decode_component(info, data, 7, 9, "x")
        if key == "bits":
            np.testing.assert_array_equal(want, np.where(mask > 0, 255, 0))
        else:
            np.testing.assert_array_equal(want, stored.astype(want.dtype))
        assert want.flags.writeable and want.dtype == (np.uint8 if info.name == "mask" else np.float32)
        for other in (_npy_bytes(stored, (2, 0)), _npy_bytes(np.asfortranarray(stored))):
            np.testing.assert_array_equal(decode_component(info, other, 7, 9, "x"), want)
    info = infos["depth"]
    bad = {
        "got float64 (7, 9)": _npy_bytes(depth.astype(np.float64)),
        "got float32 (9, 7)": _npy_bytes(depth.T.copy()),
        "unreadable depth array": b"not an npy file at all" * 8,
        "array of 248 bytes, expected 252": encode_component(info, depth, "x")[:-4],
    }
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f4", "fortran_order": False, "shape": (10**6, 10**6)}
    )
    bad["got float32 (1000000, 1000000)"] = buffer.getvalue() + depth.tobytes()
    for words, data in bad.items():
        with pytest.raises(StoreCorruptError, match=r"^store/x\.npy: .*" + re.escape(words)) as caught:
            decode_component(info, data, 7, 9, "store/x.npy")
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "layout,backend,factor,rule", [("rays", "wds", 2, "exact"), ("images", "zarr", 5, "mipnerf360")]
)
def test_convert_time_downscale(capture: Path, tmp_path: Path, layout, backend, factor, rule) -> None:
    store = convert(
        capture, tmp_path / "s", layout=layout, backend=backend, downscale=factor, downscale_rule=rule,
        mask_dtype="uint8", depth_dtype="float16", progress=False,
    )  # fmt: skip
    for name in store.table.names:
        mask, depth, _ = _sources(capture, name)
        h, w = store.image_shape(name)[:2]
        size = None if rule == "exact" else (h, w)
        got = store.read_component("mask", name)
        assert got.shape == (h, w)
        np.testing.assert_array_equal(got, reference_downscale_nearest(mask, factor, size))
        want = reference_downscale_nearest(depth, factor, size).astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(store.read_component("depth", name), want)


def _digests(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _raykit(
    argv: list[str], child: bool, capsys: pytest.CaptureFixture[str]
) -> subprocess.CompletedProcess[str]:
    """``raykit ARGV`` in a child (the real entry point: no traceback, one line) or, to spare a child's
    start (torch's import), through ``raykit.cli.main`` in this process."""
    if child:
        return subprocess.run([sys.executable, "-m", "raykit", *argv], capture_output=True, text=True)
    capsys.readouterr()
    status = main(argv)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, status, out, err)


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_add_component_writes_only_the_component(
    scene, tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    plain = write_nerfstudio(scene, tmp_path / "plain", masks=False, depth=False, metadata=False)
    full = write_nerfstudio(scene, tmp_path / "full", depth_format="npy")
    store = convert(plain, tmp_path / "s", layout="images", backend=backend, progress=False)
    assert store.components == {} and store.store_fingerprint == store.fingerprint
    before = _digests(tmp_path / "s")
    cli, child = ["add-component", str(tmp_path / "s")], backend == "zarr"  # wds: in this process
    done = _raykit([*cli, "masks", str(full / "masks")], child, capsys)
    assert done.returncode == 0, done.stderr
    done = _raykit([*cli, "depth", str(full / "depth"), "--depth-scale", "0.001"], child, capsys)
    assert done.returncode == 0, done.stderr
    after = _digests(tmp_path / "s")
    changed = [rel for rel, data in before.items() if after[rel] != data]
    assert changed == ["manifest.json"]  # pixels, camera table, index: byte for byte
    added = open_store(tmp_path / "s")
    assert added.fingerprint == store.fingerprint  # the pixel (content) fingerprint
    assert added.store_fingerprint not in (store.fingerprint, store.store_fingerprint)
    assert added.components["depth"].unit == "m"
    for name in added.table.names:
        stem = Path(name).stem
        src = np.asarray(Image.open(full / "masks" / f"{stem}.png"))
        np.testing.assert_array_equal(added.read_component("mask", name), np.where(src > 0, 255, 0))
        want = np.load(full / "depth" / f"{stem}.npy") * np.float32(1e-3)
        np.testing.assert_array_equal(added.read_component("depth", name), want)
    assert validate_store(added.url) == []
    info = _raykit(["info", str(tmp_path / "s")], child, capsys)
    assert (
        "component   mask: bit, 12 images" in info.stdout
        and "component   depth: float32, unit m" in info.stdout
    )
    with pytest.raises(ConfigError, match="has a mask component already"):
        add_component(tmp_path / "s", "mask", lambda name, h, w: np.zeros((h, w), np.uint8))


def test_add_component_bad_folder_is_one_line_and_changes_nothing(
    scene, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = write_nerfstudio(scene, tmp_path / "plain", masks=False, depth=False, metadata=False)
    full = write_nerfstudio(scene, tmp_path / "full", depth=False)
    convert(plain, tmp_path / "s", layout="images", progress=False)
    before = _digests(tmp_path / "s")
    cli = ["add-component", str(tmp_path / "s"), "masks", str(full / "masks")]
    (full / "masks" / "train_r_1.png").unlink()
    Image.fromarray(np.zeros((10, 10), np.uint8)).save(full / "masks" / "train_r_2.png")
    outside = tmp_path / "outside.png"
    Image.fromarray(np.zeros((48, 48), np.uint8)).save(outside)
    for step in ("missing", "size", "link"):
        if step == "size":
            Image.fromarray(np.zeros((48, 48), np.uint8)).save(full / "masks" / "train_r_1.png")
        if step == "link":
            Image.fromarray(np.zeros((48, 48), np.uint8)).save(full / "masks" / "train_r_2.png")
            (full / "masks" / "train_r_3.png").unlink()
            (full / "masks" / "train_r_3.png").symlink_to(outside)
        done = _raykit(cli, step == "missing", capsys)  # the first in a child, the others in this process
        assert done.returncode == 2, (step, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, lines
        assert {"missing": "train_r_1", "size": "train_r_2.png", "link": "train_r_3.png"}[step] in lines[0]
        assert _digests(tmp_path / "s") == before
    (full / "masks" / "train_r_3.png").unlink()  # sound headers, a truncated last mask: fails when decoded
    Image.fromarray(np.zeros((48, 48), np.uint8)).save(full / "masks" / "train_r_3.png")
    last = full / "masks" / "val_r_1.png" if (full / "masks" / "val_r_1.png").exists() else None
    last = last or sorted((full / "masks").glob("test_*.png"))[-1]
    last.write_bytes(last.read_bytes()[:40])  # its header whole, its data cut short
    listing = sorted(p for p in (tmp_path / "s").rglob("*"))
    done = _raykit(cli, False, capsys)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert last.name in done.stderr
    assert sorted(p for p in (tmp_path / "s").rglob("*")) == listing  # no stray component file
    assert _digests(tmp_path / "s") == before


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_flipped_component_byte_is_caught(capture: Path, tmp_path: Path, backend: str) -> None:
    store = convert(capture, tmp_path / "s", layout="rays", backend=backend, progress=False)
    name = store.table.names[0]
    data, where = store.component_reader.stored("mask", store.image_index(name))
    path = tmp_path / "s" / where
    raw = bytearray(path.read_bytes())
    offset = raw.find(data) + len(data) - 1  # the image's last stored byte
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))
    problems = validate_store(tmp_path / "s")
    assert any(where in p and "checksum" in p for p in problems), problems
    with pytest.raises(StoreCorruptError, match="fails its checksum"):
        open_store(tmp_path / "s").read_component("mask", name)


def test_validate_checks_each_array_against_the_index(capture: Path, tmp_path: Path) -> None:
    """An index whose CRC-32C disagrees with the bytes (every file's record consistent): one line."""
    from raykit.store.files import file_record, json_digest

    store = convert(capture, tmp_path / "s", layout="images", backend="zarr", progress=False)
    index_path = tmp_path / "s" / "index-depth.json"
    index = json.loads(index_path.read_text())
    index["test"]["crc32c"][0] ^= 1
    index_path.write_text(json.dumps(index))
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["files"]["index-depth.json"] = file_record(index_path)
    del manifest["manifest_digest"]
    manifest["manifest_digest"] = json_digest(manifest)
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    problems = validate_store(tmp_path / "s")
    name = store.table.names[int(store.split_rows("test")[0])]
    assert len(problems) == 1 and "depth of image 0 of split 'test' fails its checksum" in problems[0], (
        problems
    )
    with pytest.raises(StoreCorruptError):
        open_store(tmp_path / "s").read_component("depth", name)


def test_bad_mask_or_depth_file_is_one_line(capture: Path, tmp_path: Path) -> None:
    cap = tmp_path / "cap"
    shutil.copytree(capture, cap)
    meta = json.loads((cap / "transforms.json").read_text())
    frames = meta["frames"]
    (cap / frames[1]["mask_path"]).unlink()
    Image.fromarray(np.zeros((20, 30), np.uint16)).save(cap / frames[2]["depth_file_path"])
    cli = [sys.executable, "-m", "raykit", "convert", str(cap), str(tmp_path / "s"), "--no-progress"]
    done = subprocess.run(cli, capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in done.stderr, lines
    assert frames[1]["mask_path"] in lines[0] and "not found" in lines[0]
    assert frames[2]["depth_file_path"] in lines[1] and "30x20" in lines[1] and "48x48" in lines[1]
    assert not (tmp_path / "s").exists() and not (tmp_path / "s.partial").exists()
    shutil.copy(capture / frames[1]["mask_path"], cap / frames[1]["mask_path"])
    Image.fromarray(np.zeros((48, 48), np.uint16)).save(cap / frames[2]["depth_file_path"])
    truncated = cap / frames[4]["mask_path"]
    truncated.write_bytes(truncated.read_bytes()[:40])  # fails only when decoded, in the writer
    with pytest.raises(SourceError) as caught:
        convert(cap, tmp_path / "s", progress=False)
    assert len(caught.value.problems) == 1 and frames[4]["mask_path"] in caught.value.problems[0]
    assert not (tmp_path / "s").exists() and not (tmp_path / "s.partial").exists()
    shutil.copy(capture / frames[4]["mask_path"], truncated)
    del frames[3]["mask_path"]  # masks on some frames only: one line
    (cap / "transforms.json").write_text(json.dumps(meta))
    with pytest.raises(SourceError) as caught:
        convert(cap, tmp_path / "s", progress=False)
    assert any("frames have a mask_path" in p for p in caught.value.problems)


def test_copy_keeps_components(capture: Path, tmp_path: Path) -> None:
    store = convert(capture, tmp_path / "s", layout="images", backend="zarr", progress=False)
    for backend, layout in (("wds", "images"), ("zarr", "rays"), ("wds", "rays")):
        copy = copy_store(store.url, tmp_path / f"{backend}-{layout}", backend=backend, layout=layout)
        assert {k: v.fingerprint for k, v in copy.components.items()} == {
            k: v.fingerprint for k, v in store.components.items()
        }
        name = store.table.names[-1]
        np.testing.assert_array_equal(copy.read_component("depth", name), store.read_component("depth", name))
        assert copy.frame_metadata(name) == store.frame_metadata(name)
        same_pixels = copy.fingerprint == store.fingerprint  # images to images keeps it; to rays, not
        assert (copy.store_fingerprint == store.store_fingerprint) == same_pixels


def test_read_over_http(capture: Path, tmp_path: Path, http_root) -> None:
    root, url = http_root
    store = convert(capture, root / "comp-wds", layout="rays", backend="wds", progress=False)
    remote = open_store(f"{url}/comp-wds")
    name = store.table.names[0]
    np.testing.assert_array_equal(remote.read_component("mask", name), store.read_component("mask", name))
    assert remote.frame_metadata(name) == store.frame_metadata(name)


def test_component_info_checks_its_fields() -> None:
    assert ComponentInfo("mask").dtype == "bit" and ComponentInfo("depth").dtype == "float32"
    for bad in ({"name": "normal"}, {"name": "mask", "dtype": "float16"}, {"name": "mask", "unit": "m"}):
        with pytest.raises(ConfigError):
            ComponentInfo(**bad)
