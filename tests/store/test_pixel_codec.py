"""raykit's pixel file (``--image-codec lz4`` / ``raw``): exact round trips whatever the strides,
resolution levels by the area rule, and every corrupt or truncated file refused in one line naming
where it was read from."""

from __future__ import annotations

import functools
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from raykit.errors import StoreCorruptError
from raykit.imagedecode import downscale_area
from raykit.store import open_store, validate_store
from raykit.store.image_codec import PIXEL_CODECS, decode_stored, encode_for_store, header_size, image_format


def _pixels(h: int, w: int, channels: int, seed: int = 0) -> np.ndarray:
    """Smooth rows (the up filter's case) with noise and every byte value somewhere."""
    rng = np.random.default_rng(seed)
    ramp = (np.arange(h)[:, None, None] * 7 + np.arange(w)[None, :, None] * 3 + np.arange(channels)) % 256
    noise = rng.integers(0, 256, (h, w, channels)) * (rng.random((h, w, 1)) < 0.2)
    return ((ramp + noise) % 256).astype(np.uint8)


@pytest.mark.parametrize("codec", sorted(PIXEL_CODECS))
@pytest.mark.parametrize("channels", [3, 4])
def test_round_trip_is_exact(codec: str, channels: int) -> None:
    wide = _pixels(9, 14, channels)
    for pixels in (wide, wide[:, 1:12], wide[::2], wide[:1, :1]):  # strided views and a 1x1 image
        stored = encode_for_store(None, pixels, codec)
        assert (stored.ext, stored.passthrough, image_format(stored.data)) == ("rkpx", False, "rkpx")
        assert header_size(stored.data) == (pixels.shape[1], pixels.shape[0])
        decoded = decode_stored(stored.data, channels, "x")
        assert decoded.dtype == np.uint8 and decoded.flags.c_contiguous and decoded.flags.writeable
        np.testing.assert_array_equal(decoded, pixels)
    stored = encode_for_store(None, wide, codec)
    np.testing.assert_array_equal(decode_stored(stored.data, channels, "x", 2), downscale_area(wide, 2))
    if channels == 3:  # an RGB frame read as RGBA gets alpha 255, as the other codecs' do
        rgba = decode_stored(stored.data, 4, "x")
        np.testing.assert_array_equal(rgba[..., :3], wide)
        assert (rgba[..., 3] == 255).all()


def test_lz4_compresses_smooth_frames() -> None:
    smooth = np.broadcast_to(np.arange(64, dtype=np.uint8)[None, :, None], (64, 64, 3))
    assert len(encode_for_store(None, smooth, "lz4").data) < smooth.nbytes / 10
    assert len(encode_for_store(None, smooth, "raw").data) == 16 + smooth.nbytes


@pytest.mark.parametrize("codec", sorted(PIXEL_CODECS))
def test_corrupt_files_are_refused_in_one_line(codec: str) -> None:
    data = encode_for_store(None, _pixels(6, 5, 3), codec).data
    header = bytearray(data[:16])
    bad_version, bad_channels, bad_codec = bytearray(header), bytearray(header), bytearray(header)
    bad_version[4], bad_channels[7], bad_codec[5] = 2, 2, 7
    huge = bytearray(header)
    huge[8:16] = struct.pack("<II", 1 << 20, 1 << 20)
    cases = {
        "truncated": data[:-3],
        "one byte longer": data + b"\0",
        "header only": bytes(header[:10]),
        "version": bytes(bad_version) + data[16:],
        "channels": bytes(bad_channels) + data[16:],
        "compression": bytes(bad_codec) + data[16:],
        "too large": bytes(huge) + data[16:],
    }
    for case, corrupt in cases.items():
        with pytest.raises(StoreCorruptError, match=r"^store\.zarr/c/0 \(image 'a'\): stored image") as info:
            decode_stored(corrupt, 3, "store.zarr/c/0 (image 'a')")
        assert "\n" not in str(info.value), case


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_a_store_of_pixel_files_reads_validates_and_names_a_damaged_file(
    records: list, scene: object, tmp_path: Path, backend: str
) -> None:
    from raykit.store import write_store

    dst = tmp_path / "px.zarr"
    store = write_store(dst, records, scene=scene, layout="images", image_codec="lz4", backend=backend)
    assert validate_store(dst, deep=True) == []
    assert {f for split in store.splits for f in store.index[split]["image_format"]} == {"rkpx"}
    for name in store.table.names:
        pixels = np.asarray(next(r for r in records if r.name == name).load())
        np.testing.assert_array_equal(store.read_image(name)[..., : pixels.shape[2]], pixels)
    rel = store.image_files("train", 0)[0]
    blob = bytearray((dst / rel).read_bytes())
    start = 0 if backend == "zarr" else int(store.index["train"]["image_member"][0])  # the image's bytes
    blob[start + 20] ^= 0xFF  # within the first image's pixel file
    (dst / rel).write_bytes(bytes(blob))
    problems = validate_store(dst)
    assert problems and all("\n" not in p and rel in p for p in problems)
    with pytest.raises(StoreCorruptError, match=rel):
        open_store(dst).read_split_image("train", 0)


class _Frame:
    """A ``load()`` that declares its pixels' channels before decoding, as video frames do."""

    def __init__(self, pixels: np.ndarray) -> None:
        self.pixels, self.channels = pixels, pixels.shape[2]

    def __call__(self) -> np.ndarray:
        return self.pixels


def test_raw_frames_are_written_as_a_pipeline_byte_for_byte(scene: object, tmp_path: Path) -> None:
    """Raw frames whose loader declares their channels are written as one pipeline (each shard as
    soon as its frames are encoded, each frame dropped once its last shard is written): the same
    files as when every image is encoded first, here over two 64 MiB shards with a frame across them
    (and a one-shard split), read back exactly."""
    from raykit.cameras import Camera
    from raykit.store import ImageRecord, write_store
    from raykit.store.write.images import _known_sizes

    base = np.random.default_rng(3).integers(0, 256, (3400, 3400, 3), dtype=np.uint8)  # 34.7 MB
    frames = [base, np.roll(base, 1, axis=1), base[:9, :7]]
    splits = ["train", "train", "test"]
    written = {}
    for kind, load in [("pipelined", _Frame), ("encoded first", lambda px: functools.partial(np.array, px))]:
        records = []
        for i, (pixels, split) in enumerate(zip(frames, splits, strict=True)):
            h, w = pixels.shape[:2]
            camera = Camera("PINHOLE", w, h, (w, w, w / 2, h / 2), camera_id=i + 1)
            records.append(
                ImageRecord(f"f{i}", split, camera, np.eye(4), 0.5, 4.0, f"mem://{i}", load(pixels))
            )
        assert (_known_sizes(records, "raw") is not None) == (kind == "pipelined")
        dst = tmp_path / kind.replace(" ", "_")
        with ThreadPoolExecutor(2) as pool:
            store = write_store(dst, records, scene=scene, layout="images", image_codec="raw", executor=pool)
        written[kind] = (dict(store.files), (dst / "index.json").read_bytes())
    assert len([f for f in written["pipelined"][0] if f.startswith("zarr/train/images/c/")]) == 2
    assert written["pipelined"] == written["encoded first"]
    store = open_store(tmp_path / "pipelined")
    for i, pixels in enumerate(frames):
        np.testing.assert_array_equal(store.read_image(f"f{i}"), pixels)
