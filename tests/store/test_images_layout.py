"""The images layout: pass-through, lossless re-encoding, native readers, copies, validation, HTTP."""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raykit.conventions import opencv_to_opengl_c2w
from raykit.converters import convert
from raykit.converters.images import decode_image
from raykit.errors import SourceError
from raykit.store import open_store, write_store
from raykit.store.validate import validate_store
from raykit.store.writer import copy_store


def _photo(seed: int, h: int, w: int) -> np.ndarray:
    """A smooth, photo-like RGB image (compresses like a photo, unlike noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    base = np.stack([np.sin(6 * x + seed), np.cos(5 * y - seed), np.sin(4 * (x + y))], axis=-1)
    return np.clip(127 + 100 * base + rng.normal(0, 6, (h, w, 3)), 0, 255).astype(np.uint8)


def _capture(root: Path, n: int = 6, size: tuple[int, int] = (40, 30), rgba_png: bool = True) -> Path:
    """An instant-ngp capture of JPEGs and PNGs (one RGBA PNG when ``rgba_png``)."""
    w, h = size
    frames = []
    for i in range(n):
        pixels = _photo(i, h, w)
        ext = "jpg" if i % 2 == 0 else "png"
        if rgba_png and i == 1:
            pixels = np.concatenate([pixels, np.full((h, w, 1), 200, np.uint8)], axis=-1)
        path = root / "images" / f"f_{i}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path, quality=90) if ext == "jpg" else Image.fromarray(pixels).save(path)
        c2w = np.eye(4)
        c2w[:3, 3] = [0.3 * i, 0.1, 4.0]
        matrix = opencv_to_opengl_c2w(c2w).tolist()
        frames.append({"file_path": f"images/f_{i}.{ext}", "transform_matrix": matrix})
    meta = {"fl_x": 30.0, "fl_y": 30.0, "cx": w / 2, "cy": h / 2, "w": w, "h": h, "frames": frames}
    (root / "transforms.json").write_text(json.dumps(meta))
    return root


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _capture(tmp_path_factory.mktemp("capture"))


@pytest.fixture(scope="module", params=["zarr", "wds"])
def images_store(request: pytest.FixtureRequest, capture: Path, tmp_path_factory: pytest.TempPathFactory):
    dst = tmp_path_factory.mktemp("stores") / f"img-{request.param}"
    return convert(capture, dst, backend=request.param, layout="images", split="every:3", near=0.1, far=9.0)


def test_passthrough_keeps_source_bytes(images_store, capture: Path) -> None:
    store = images_store
    sources = {p.name: p for p in (capture / "images").iterdir()}
    assert all(s == "images" for s in (store.layout(k) for k in store.splits))
    for split in store.splits:
        entry = store.index[split]
        assert all(entry["passthrough"])
        for local, name in enumerate(store.images(split)):
            path = sources[Path(name).name if Path(name).name in sources else Path(name).name + ".jpg"]
            data = store.payload.image_bytes(split, local)
            assert hashlib.sha256(data).hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()
            decoded = decode_image(path)
            served = store.read_image(name)
            assert np.array_equal(served[..., : decoded.shape[2]], decoded)
    payload = store.manifest["files"]
    stored = sum(v["size"] for k, v in payload.items() if k.startswith(("zarr/", "wds/")))
    source_bytes = sum(p.stat().st_size for p in sources.values())
    layout = store.manifest["layout"]
    per_split = layout["image_chunk_bytes"] + 20 * layout["image_shard_chunks"] + 4  # padding, index, crcs
    assert stored <= source_bytes + 6 * 2048 + 3 * per_split  # tar headers and json / zarr chunk padding


def test_rays_view_equals_ray_layout(images_store, capture: Path, tmp_path: Path) -> None:
    rays = convert(capture, tmp_path / "rays", split="every:3", near=0.1, far=9.0)
    assert rays.manifest["source"]["fingerprint"] == images_store.manifest["source"]["fingerprint"]
    for name in rays.images("test"):
        assert np.array_equal(rays.read_image(name), images_store.read_image(name))
        a, b = rays.image_raw(name), images_store.image_raw(name)
        assert np.array_equal(a.rgba, b.rgba) and np.array_equal(a.pid, b.pid)
    n = images_store.splits["train"].n_rays
    raw = images_store.read("train", 5, n - 3)
    assert np.array_equal(np.sort(raw.pid), np.arange(5, n - 3) + images_store.splits["train"].pid_start)


def test_reencoded_when_downscaled(capture: Path, tmp_path: Path) -> None:
    store = convert(capture, tmp_path / "s", layout="images", downscale=2, near=0.1, far=9.0)
    rays = convert(capture, tmp_path / "r", downscale=2, near=0.1, far=9.0)
    for split in store.splits:
        assert not any(store.index[split]["passthrough"])
        assert set(store.index[split]["image_format"]) == {"webp"}
        for name in store.images(split):
            assert np.array_equal(store.read_image(name), rays.read_image(name))


def test_truncated_jpeg_fails_conversion(tmp_path: Path) -> None:
    cap = _capture(tmp_path / "cap", n=3)
    path = cap / "images" / "f_2.jpg"
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(SourceError, match=r"f_2\.jpg"):
        convert(cap, tmp_path / "s", layout="images", near=0.1, far=9.0)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_bytes_independent_of_workers(backend: str, records, scene, tmp_path: Path) -> None:
    serial = write_store(tmp_path / "a", records, scene=scene, layout="images", backend=backend)
    with concurrent.futures.ProcessPoolExecutor(2) as pool:
        parallel = write_store(
            tmp_path / "b", records, scene=scene, layout="images", backend=backend, executor=pool
        )
    assert serial.fingerprint == parallel.fingerprint
    for rel in serial.files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    for rec in records:
        assert np.array_equal(serial.read_image(rec.name)[..., : rec.load().shape[2]], rec.load())


def test_resume_reuses_encoded_images(records, scene, tmp_path: Path, monkeypatch) -> None:
    import dataclasses
    import functools

    import raykit.store.images_writer as iw

    bad = list(records)
    bad[-1] = dataclasses.replace(bad[-1], load=functools.partial(np.zeros, (2, 2, 3), np.uint8))
    with concurrent.futures.ProcessPoolExecutor(2) as pool, pytest.raises(SourceError, match="shape"):
        write_store(tmp_path / "s", bad, scene=scene, layout="images", executor=pool)
    staged = sorted((tmp_path / "s.partial" / "staging").glob("*.img"))
    assert len(staged) == len(records) - 1
    calls = []
    real = iw.encode_for_store
    monkeypatch.setattr(iw, "encode_for_store", lambda *a: calls.append(a) or real(*a))
    store = write_store(tmp_path / "s", records, scene=scene, layout="images")
    assert len(calls) == 1 and validate_store(store.url) == []
    assert (
        store.fingerprint
        == write_store(tmp_path / "fresh", records, scene=scene, layout="images").fingerprint
    )


def test_plain_zarr_reader_slices_images(tmp_path: Path, capture: Path) -> None:
    import zarr

    store = convert(capture, tmp_path / "z", layout="images", split="all", near=0.1, far=9.0)
    group = zarr.open_group(str(tmp_path / "z" / "zarr" / "train"), mode="r")
    offsets = group["image_offsets"][:]
    names = group.attrs["image_names"]
    for i, name in enumerate(names):
        data = group["images"][offsets[i] : offsets[i + 1]].tobytes()
        assert data == store.payload.image_bytes("train", i)
        pixels = np.asarray(Image.open(io.BytesIO(data)))
        assert np.array_equal(store.read_image(name)[..., : pixels.shape[2]], pixels)


def test_webdataset_reads_samples(tmp_path: Path, capture: Path) -> None:
    import webdataset as wds

    store = convert(capture, tmp_path / "w", backend="wds", layout="images", split="all", near=0.1, far=9.0)
    urls = sorted(str(p) for p in (tmp_path / "w" / "wds").glob("train-*.tar"))
    samples = list(wds.WebDataset(urls, shardshuffle=False).decode("rgb8"))
    assert len(samples) == store.splits["train"].n_images
    for sample in samples:
        record = sample["json"]
        image = next(sample[k] for k in ("jpg", "png", "webp") if k in sample)
        assert image.shape == (record["camera"]["height"], record["camera"]["width"], 3)
        assert np.array_equal(image, store.read_image(record["name"])[..., :3])
        assert np.allclose(record["c2w"], store.table.c2w[record["index"]])


def test_copies_between_layouts_and_backends(images_store, tmp_path: Path) -> None:
    other = "wds" if images_store.backend == "zarr" else "zarr"
    same = copy_store(images_store.url, tmp_path / "same", backend=other)
    assert same.fingerprint == images_store.fingerprint
    rays = copy_store(images_store.url, tmp_path / "rays", backend="zarr", layout="rays")
    back = copy_store(rays.url, tmp_path / "back", backend=images_store.backend, layout="images")
    fingerprints = {s.manifest["source"]["fingerprint"] for s in (images_store, same, rays, back)}
    assert len(fingerprints) == 1
    assert rays.splits["train"].shuffled and validate_store(rays.url) == []
    for name in images_store.images("train"):
        for copy in (same, rays, back):
            assert np.array_equal(copy.read_image(name), images_store.read_image(name))


def test_validate_finds_flipped_image_byte(images_store, tmp_path: Path) -> None:
    import shutil

    assert validate_store(images_store.url) == validate_store(images_store.url, deep=True) == []
    dst = tmp_path / "bad"
    shutil.copytree(images_store.url, dst)
    rel = images_store.payload.files_of("train", 0)[0]
    offset = int(images_store.index["train"].get("image_member", [0])[0]) + 100
    data = bytearray((dst / rel).read_bytes())
    data[offset] ^= 0xFF
    (dst / rel).write_bytes(bytes(data))
    for deep in (False, True):
        problems = validate_store(dst, deep=deep)
        assert problems and any(rel in p for p in problems)
    with pytest.raises(Exception, match="checksum"):
        open_store(dst).read_image(images_store.images("train")[0])


def test_http_reads_images(images_store, http_root) -> None:
    import shutil

    root, base = http_root
    name = f"http-{images_store.backend}"
    shutil.copytree(images_store.url, root / name)
    remote = open_store(f"{base}/{name}")
    for img in images_store.images("train"):
        assert np.array_equal(remote.read_image(img), images_store.read_image(img))
    assert remote.fingerprint == images_store.fingerprint


def test_validate_checks_each_image_header_size(images_store) -> None:
    """Without decoding, validate reads each stored image's size from its header: an image whose
    header disagrees with the camera table is reported (the table is altered in memory here)."""
    from raykit.store.images_check import check_images_split
    from raykit.store.reader import open_store

    store = open_store(images_store.url)
    assert check_images_split(store, "train", set()) == []
    row = int(store.split_rows("train")[0])
    width = store.table.width.copy()
    width[row] += 1
    object.__setattr__(store.table, "width", width)
    problems = check_images_split(store, "train", set(), threads=2)
    assert len(problems) == 1 and f"expected {width[row]}x" in problems[0]
