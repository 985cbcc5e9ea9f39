"""The images layout: pass-through, lossless re-encoding, native readers, copies, validation, HTTP."""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raykit.conventions import opencv_to_opengl_c2w
from raykit.converters import convert
from raykit.converters.images import decode_image
from raykit.errors import SourceError, StoreCorruptError
from raykit.store import open_store, write_store
from raykit.store.backends import join_parts
from raykit.store.validate import validate_store
from raykit.store.write import copy_store


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
            data = join_parts(store.reader.image_parts(split, local))
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

    import raykit.store.write.images as iw

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
        assert data == join_parts(store.reader.image_parts("train", i))
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
    rel = images_store.reader.image_files("train", 0)[0]
    offset = int(images_store.index["train"].get("image_member", [0])[0]) + 100
    data = bytearray((dst / rel).read_bytes())
    data[offset] ^= 0xFF
    (dst / rel).write_bytes(bytes(data))
    for deep in (False, True):
        problems = validate_store(dst, deep=deep)
        assert problems and any(rel in p for p in problems)
    with pytest.raises(StoreCorruptError, match="fails its checksum"):
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
    from raykit.store.blobcheck import images_check
    from raykit.store.reader import open_store

    store = open_store(images_store.url)

    def problems() -> list[str]:
        check = images_check(store, "train")
        found = [check.check_file(rel) for rel in check.files]
        assert all(problem is None for problem, _ in found)
        return [p for _, image_problems in found for p in image_problems] + check.check_rest(set())

    assert problems() == []
    row = int(store.split_rows("train")[0])
    width = store.table.width.copy()
    width[row] += 1
    object.__setattr__(store.table, "width", width)
    found = problems()
    assert len(found) == 1 and f"expected {width[row]}x" in found[0]


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_validate_checks_each_image_crc_within_and_across_files(
    capture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Validate reads each file once and checks each stored image's CRC-32C from those bytes, for an
    image held whole in a file and for one spanning two (tiny shards here). An image altered after its
    CRC was recorded, in a file whose manifest SHA-256 was rewritten to match (as a writer bug would
    leave it), is reported by name; nothing else is."""
    import raykit.store.write.images as images_writer
    from raykit.store.files import json_digest

    monkeypatch.setattr(images_writer, "DEFAULT_IMAGE_CHUNK_BYTES", 4096)
    monkeypatch.setattr(images_writer, "DEFAULT_IMAGE_SHARD_CHUNKS", 1)
    store = convert(
        capture, tmp_path / "s", backend=backend, layout="images", split="every:3", near=0.1, far=9.0
    )
    assert validate_store(store.url) == []
    n = len(store.split_rows("train"))
    spans = [len(store.image_files("train", i)) for i in range(n)]
    if backend == "zarr":
        assert max(spans) > 1 and min(spans) == 1, spans
    cases = [spans.index(1)] + ([spans.index(max(spans))] if max(spans) > 1 else [])
    for local in cases:
        dst = tmp_path / f"bad{local}"
        shutil.copytree(store.url, dst)
        rel = store.image_files("train", local)[-1]
        entry = store.index["train"]
        if backend == "zarr":  # the image's last byte, in the last file it spans
            layout = store.manifest["layout"]
            size, per = layout["image_chunk_bytes"], layout["image_shard_chunks"]
            last = int(entry["image_offset"][local + 1]) - 1
            chunk = last // size
            offset = (chunk % per) * (size + 4) + last % size
        else:
            offset = int(entry["image_member"][local]) + int(entry["image_bytes"][local]) - 1
        data = bytearray((dst / rel).read_bytes())
        data[offset] ^= 0xFF
        if backend == "zarr":  # the inner chunk's own CRC-32C follows its body: keep it consistent
            import google_crc32c

            start = (chunk % per) * (size + 4)
            crc = google_crc32c.value(bytes(data[start : start + size]))
            data[start + size : start + size + 4] = crc.to_bytes(4, "little")
        (dst / rel).write_bytes(bytes(data))
        manifest = json.loads((dst / "manifest.json").read_text())
        manifest["files"][rel]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
        del manifest["manifest_digest"]
        manifest["manifest_digest"] = json_digest(manifest)
        (dst / "manifest.json").write_text(json.dumps(manifest))
        problems = validate_store(dst)
        assert len(problems) == 1, problems
        assert "fails its checksum" in problems[0] and f"image {local} " in problems[0], problems


def test_header_size_beyond_the_first_bytes() -> None:
    """An image whose header ends past ``HEADER_BYTES`` (a 100 KB ICC profile before the frame header)
    has its size read from the whole image; an image cut inside its header is reported unreadable."""
    from raykit.store.blobcheck import HEADER_BYTES, _head, _header_size

    buf = io.BytesIO()
    Image.new("RGB", (37, 23), (10, 200, 30)).save(buf, "JPEG", icc_profile=bytes(100_000))
    data = buf.getvalue()
    parts = [np.frombuffer(data[:5000], np.uint8), data[5000:]]  # pieces, as a zarr split reads them
    head = _head(parts, HEADER_BYTES)
    assert head == data[:HEADER_BYTES]
    with pytest.raises(OSError):
        Image.open(io.BytesIO(head))  # the first bytes alone do not reach the frame header
    assert _header_size(head, parts) == (37, 23)
    with pytest.raises(OSError):
        _header_size(head, [data[:HEADER_BYTES]])


def test_header_size_matches_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct JPEG/PNG header reader gives Pillow's size (its reference twin) for every kind of
    file a capture holds, without Pillow for every JPEG and PNG; for first bytes cut inside the
    header it defers to Pillow, which fails."""
    import raykit.store.image_codec as image_codec
    from raykit.store.image_codec import header_size, header_size_reference

    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (29, 41, 3), dtype=np.uint8)
    cases = []
    for mode in ("RGB", "L", "CMYK", "RGBA", "P", "I;16"):
        if mode == "I;16":
            image = Image.fromarray(rgb[..., 0].astype(np.uint16) * 257)
        else:
            image = Image.fromarray(rgb).convert(mode)
        for fmt, kwargs in [
            ("JPEG", {}),
            ("JPEG", {"progressive": True}),
            ("JPEG", {"subsampling": 0, "exif": Image.Exif().tobytes(), "icc_profile": bytes(70_000)}),
            ("PNG", {}),
            ("WEBP", {"lossless": True}),
        ]:
            unsupported = {"JPEG": ("RGBA", "P", "I;16"), "PNG": ("CMYK",), "WEBP": ("CMYK", "I;16")}
            if mode in unsupported[fmt]:
                continue
            buf = io.BytesIO()
            image.save(buf, fmt, **kwargs)
            cases.append(buf.getvalue())
    data = Path(__file__).resolve().parents[1] / "data"
    photos = [p for p in sorted(data.rglob("*")) if p.suffix.lower() in (".jpg", ".jpeg", ".png")]
    assert len(photos) == 12  # tests/data: 10 camera JPEGs and 2 RGBA PNGs
    cases += [p.read_bytes() for p in photos]
    assert len(cases) >= 20
    expected = [header_size_reference(data) for data in cases]
    assert [header_size(data) for data in cases] == expected
    monkeypatch.setattr(image_codec, "header_size_reference", None)  # the direct reader alone
    direct = [(data, size) for data, size in zip(cases, expected, strict=True) if data[:4] != b"RIFF"]
    assert len(direct) >= 20 and all(header_size(data) == size for data, size in direct)
    monkeypatch.undo()
    for data in cases[:3]:  # a JPEG cut inside its header
        with pytest.raises(OSError):
            header_size(data[:40])


def test_validate_reports_a_corrupt_camera_table_of_an_images_store(images_store, tmp_path: Path) -> None:
    """A flipped byte in ``cameras.parquet`` of an images store is reported, one line naming the file
    (its checksum), and validate returns instead of raising: the images are checked from the table."""
    dst = tmp_path / "bad-table"
    shutil.copytree(images_store.url, dst)
    data = bytearray((dst / "cameras.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (dst / "cameras.parquet").write_bytes(bytes(data))
    problems = validate_store(dst)
    assert problems and all("cameras.parquet" in p for p in problems), problems
