"""The store contract: written once, run against every backend (and with materialised rays)."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from raykit.cameras import pixels_to_rays
from raykit.errors import RaykitError, StoreCorruptError, StoreNotFoundError, StoreVersionError
from raykit.loaders import image_rays, reference_batch
from raykit.store import ImageRecord, RayRangeError, SceneInfo, open_store, write_store
from raykit.store.backends import BACKENDS, backend_named
from raykit.store.reader import RayStore
from raykit.store.summary import store_summary
from raykit.store.validate import validate_store
from raykit.store.write import copy_store

CHUNK_RAYS = 64
SHARD_CHUNKS = 2


def _all_rays(store: RayStore, split: str):
    info = store.splits[split]
    return [store.read_chunk(split, i) for i in range(info.n_chunks)]


def _expected_rgba(records: list[ImageRecord], store: RayStore, pid: np.ndarray) -> np.ndarray:
    image, pixel = store.decode_pids(pid)
    by_name = {r.name: r.load() for r in records}
    out = np.full((len(pid), 4), 255, dtype=np.uint8)
    for k, (i, (x, y)) in enumerate(zip(image, pixel, strict=True)):
        px = by_name[store.table.names[i]][y, x]
        out[k, : len(px)] = px
    return out


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


class StoreContract:
    """Behaviour every backend must have; subclasses set ``backend`` and ``materialize`` and say where
    the backend keeps its bytes (``payload_kinds``, ``data_offset``) and how its own library reads
    them (``native_split``). A new backend is one such subclass (with a mixin like ``ZarrNative``)."""

    backend = ""
    materialize: str | None = None

    def payload_kinds(self, store: RayStore) -> dict[str, str]:
        """One payload file per kind (e.g. rgba shard, pid shard, tar) -> its relative path."""
        raise NotImplementedError

    def data_offset(self, store: RayStore, rel: str) -> int:
        """A byte offset inside ray data of payload file ``rel`` (not headers or padding)."""
        raise NotImplementedError

    def split_of(self, rel: str) -> str:
        """The split whose rays payload file ``rel`` holds."""
        raise NotImplementedError

    def test_backend_implements_the_interface(self, store_dir: Path) -> None:
        store = open_store(store_dir)
        backend = backend_named(self.backend)
        assert backend.name == self.backend and pickle.loads(pickle.dumps(backend)) == backend
        for split, info in store.splits.items():
            for index in range(info.n_chunks):
                files = store.chunk_files(split, index)
                assert files and set(files) <= set(store.files)

    @pytest.fixture(scope="class")
    @classmethod
    def store_dir(cls, tmp_path_factory: pytest.TempPathFactory, records, scene: SceneInfo) -> Path:
        dst = tmp_path_factory.mktemp(cls.backend) / "store"
        write_store(
            dst,
            records,
            scene=scene,
            backend=cls.backend,
            chunk_rays=CHUNK_RAYS,
            shard_chunks=SHARD_CHUNKS,
            seed=3,
            materialize=cls.materialize,
        )
        return dst

    @pytest.fixture()
    def scratch(self, store_dir: Path, tmp_path: Path) -> Path:
        dst = tmp_path / "store"
        shutil.copytree(store_dir, dst)
        return dst

    def test_metadata(self, store_dir: Path, records, scene: SceneInfo) -> None:
        store = open_store(store_dir, verify=True)
        assert store.backend == self.backend
        assert list(store.splits) == ["train", "val", "test"]
        assert store.splits["train"].shuffled and not store.splits["val"].shuffled
        np.testing.assert_array_equal(store.world_from_source, scene.matrix())
        assert store.scene == scene
        by_name = {r.name: r for r in records}
        assert store.table_arrow.num_rows == len(records)
        for row in store.table_arrow.to_pylist():
            rec = by_name[row["name"]]
            assert row["split"] == rec.split and row["near"] == rec.near and row["far"] == rec.far
            np.testing.assert_array_equal(np.reshape(row["c2w"], (4, 4)), rec.c2w)
            assert tuple(row["params"]) == rec.camera.params and row["width"] == rec.camera.width
        for split, info in store.splits.items():
            assert store.images(split) == sorted(r.name for r in records if r.split == split)
            assert info.n_rays == sum(
                by_name[n].camera.width * by_name[n].camera.height for n in store.images(split)
            )

    def test_round_trip_every_field(self, store_dir: Path, records) -> None:
        store = open_store(store_dir)
        for split, info in store.splits.items():
            chunks = _all_rays(store, split)
            assert [len(c) for c in chunks[:-1]] == [CHUNK_RAYS] * (info.n_chunks - 1)
            pid = np.concatenate([c.pid for c in chunks])
            assert np.array_equal(np.sort(pid), np.arange(info.n_rays) + info.pid_start)
            assert info.shuffled != np.array_equal(pid, np.sort(pid))
            rgba = np.concatenate([c.rgba for c in chunks])
            np.testing.assert_array_equal(rgba, _expected_rgba(records, store, pid))
            if self.materialize:
                batch = reference_batch(store, chunks[0])
                tol = 2e-3 if self.materialize == "float16" else 1e-6
                for name in ("origins", "directions"):
                    stored = torch.from_numpy(chunks[0].extra[name].astype(np.float32))
                    torch.testing.assert_close(stored, getattr(batch, name), atol=tol * 4, rtol=0)

    def test_random_access(self, store_dir: Path) -> None:
        store = open_store(store_dir)
        rng = np.random.default_rng(0)
        for split, info in store.splits.items():
            whole = store.read(split, 0, info.n_rays)
            for _ in range(5):
                start, stop = sorted(rng.integers(0, info.n_rays + 1, 2).tolist())
                part = store.read(split, start, stop)
                np.testing.assert_array_equal(part.pid, whole.pid[start:stop])
                np.testing.assert_array_equal(part.rgba, whole.rgba[start:stop])
            for i in rng.permutation(info.n_chunks)[:3].tolist():
                lo, hi = info.chunk_range(i)
                np.testing.assert_array_equal(store.read_chunk(split, i).pid, whole.pid[lo:hi])

    def test_full_image_reads(self, store_dir: Path, records) -> None:
        store = open_store(store_dir)
        for rec in records:
            batch = image_rays(store, rec.name, device="cpu")
            pixels = rec.load()
            h, w = pixels.shape[:2]
            ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
            expected_pixel = np.stack([xs.ravel(), ys.ravel()], 1)
            np.testing.assert_array_equal(batch.pixel.numpy(), expected_pixel)
            assert torch.all(batch.image == store.image_index(rec.name))
            got = np.rint(batch.rgb.numpy() * 255).astype(np.uint8).reshape(h, w, 3)
            np.testing.assert_array_equal(got, pixels[..., :3])
            alpha = np.rint(batch.alpha.numpy() * 255).astype(np.uint8).reshape(h, w)
            np.testing.assert_array_equal(alpha, pixels[..., 3] if pixels.shape[2] == 4 else 255)
            o, d, z = pixels_to_rays(rec.camera, torch.from_numpy(rec.c2w), torch.from_numpy(expected_pixel))
            torch.testing.assert_close(batch.origins, o.float(), atol=1e-5, rtol=0)
            torch.testing.assert_close(batch.directions, d.float(), atol=1e-5, rtol=0)
            torch.testing.assert_close(batch.z_scale, z.float(), atol=1e-5, rtol=0)
            assert torch.all(batch.near == rec.near) and torch.all(batch.far == rec.far)

    def test_out_of_range(self, store_dir: Path) -> None:
        store = open_store(store_dir)
        info = store.splits["val"]
        with pytest.raises(RayRangeError, match="chunk"):
            store.read_chunk("val", info.n_chunks)
        with pytest.raises(IndexError):
            store.read_chunk("val", -1)
        with pytest.raises(RayRangeError, match="outside"):
            store.read("val", 0, info.n_rays + 1)
        with pytest.raises(RayRangeError, match="split"):
            store.read_chunk("nope", 0)
        with pytest.raises(RayRangeError, match="image"):
            image_rays(store, "nope")
        assert len(store.read("val", 3, 3)) == 0

    def test_corrupt_payload_files_are_named(self, scratch: Path) -> None:
        kinds = self.payload_kinds(open_store(scratch))
        assert kinds
        for rel in kinds.values():
            _flip_byte(scratch / rel, self.data_offset(open_store(scratch), rel))
        store = open_store(scratch)
        for rel in kinds.values():
            split = self.split_of(rel)
            with pytest.raises(StoreCorruptError) as info:
                for i in range(store.splits[split].n_chunks):
                    store.read_chunk(split, i)
            assert split in str(info.value)
        problems = validate_store(scratch)
        for rel in kinds.values():
            assert any(rel in p and "checksum" in p for p in problems), (rel, problems)

    @pytest.mark.parametrize("rel", ["cameras.parquet", "index.json"])
    def test_corrupt_metadata_is_named(self, scratch: Path, rel: str) -> None:
        _flip_byte(scratch / rel, (scratch / rel).stat().st_size // 2)
        with pytest.raises(StoreCorruptError, match=re.escape(rel)):
            open_store(scratch)
        assert validate_store(scratch) and rel in validate_store(scratch)[0]

    def test_any_flipped_manifest_byte_is_refused(self, scratch: Path) -> None:
        path = scratch / "manifest.json"
        original = path.read_bytes()
        for offset in np.random.default_rng(0).choice(len(original), 40, replace=False).tolist():
            _flip_byte(path, offset)
            with pytest.raises(RaykitError):
                open_store(scratch)
            path.write_bytes(original)
        assert open_store(scratch).fingerprint

    def test_truncated_shard(self, scratch: Path) -> None:
        rel = next(iter(self.payload_kinds(open_store(scratch)).values()))
        path = scratch / rel
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        store = open_store(scratch)
        split = self.split_of(rel)
        with pytest.raises(StoreCorruptError, match=re.escape(rel)):
            for i in range(store.splits[split].n_chunks):
                store.read_chunk(split, i)

    def test_missing_file(self, scratch: Path) -> None:
        rel = next(iter(self.payload_kinds(open_store(scratch)).values()))
        (scratch / rel).unlink()
        store = open_store(scratch)
        split = self.split_of(rel)
        with pytest.raises(StoreNotFoundError, match=re.escape(rel)):
            for i in range(store.splits[split].n_chunks):
                store.read_chunk(split, i)
        assert any(rel in p for p in validate_store(scratch))

    def test_newer_version_and_no_manifest(self, scratch: Path) -> None:
        manifest = json.loads((scratch / "manifest.json").read_text())
        manifest["format_version"] += 1
        (scratch / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(StoreVersionError, match="newer"):
            open_store(scratch)
        (scratch / "manifest.json").unlink()
        with pytest.raises(StoreNotFoundError, match=r"not a raykit store \(no manifest.json\)"):
            open_store(scratch)
        with pytest.raises(StoreNotFoundError, match="not a raykit store"):
            open_store(scratch / "cameras.parquet")
        with pytest.raises(StoreNotFoundError, match="no such store"):
            open_store(scratch / "nowhere")
        partial = scratch.with_name("other.partial")
        partial.mkdir()
        with pytest.raises(StoreNotFoundError, match="incomplete store"):
            open_store(partial)

    def test_validate_clean(self, store_dir: Path) -> None:
        assert validate_store(store_dir) == []

    def test_pickles_as_its_location(self, store_dir: Path) -> None:
        store = open_store(store_dir)
        clone = pickle.loads(pickle.dumps(store))
        assert clone.url == store.url and clone.fingerprint == store.fingerprint
        np.testing.assert_array_equal(clone.read_chunk("train", 1).pid, store.read_chunk("train", 1).pid)

    def test_read_over_http(self, store_dir: Path, http_root, tmp_path: Path) -> None:
        root, url = http_root
        name = f"{self.backend}-{self.materialize}"
        shutil.copytree(store_dir, root / name, dirs_exist_ok=True)
        local, remote = open_store(store_dir), open_store(f"{url}/{name}", verify=True)
        assert remote.fingerprint == local.fingerprint
        for split, info in local.splits.items():
            for i in range(info.n_chunks):
                a, b = local.read_chunk(split, i), remote.read_chunk(split, i)
                np.testing.assert_array_equal(a.pid, b.pid)
                np.testing.assert_array_equal(a.rgba, b.rgba)
        name0 = local.images("val")[0]
        torch.testing.assert_close(image_rays(remote, name0).rgb, image_rays(local, name0).rgb)
        assert store_summary(remote)["n_rays"] == store_summary(local)["n_rays"]
        assert validate_store(remote.url) == []
        copied = copy_store(remote.url, tmp_path / "copied", backend=self.backend)
        assert copied.fingerprint == local.fingerprint
        (root / name / "index.json").unlink()
        with pytest.raises(StoreNotFoundError, match=r"index\.json"):
            open_store(f"{url}/{name}")

    def test_copy_to_other_backend_gives_identical_batches(self, store_dir: Path, tmp_path: Path) -> None:
        other = next(name for name in BACKENDS if name != self.backend)
        copy = copy_store(store_dir, tmp_path / "copy", backend=other)
        store = open_store(store_dir)
        assert copy.backend == other and copy.fingerprint == store.fingerprint
        assert validate_store(copy.url) == []
        for split, info in store.splits.items():
            for i in range(info.n_chunks):
                a, b = (
                    reference_batch(store, store.read_chunk(split, i)),
                    reference_batch(copy, copy.read_chunk(split, i)),
                )
                for name in ("origins", "directions", "rgb", "alpha", "image", "pixel", "near", "far"):
                    assert torch.equal(getattr(a, name), getattr(b, name)), name

    def native_split(self, store_dir: Path, split: str) -> dict[str, np.ndarray]:
        """Every field of ``split`` in stored order, read with the backend's own library (not raykit)."""
        raise NotImplementedError

    def test_native_reader_sees_the_same_rays(self, store_dir: Path) -> None:
        store = open_store(store_dir)
        for split, info in store.splits.items():
            native = self.native_split(store_dir, split)
            whole = store.read(split, 0, info.n_rays)
            if info.pids == "stored":
                np.testing.assert_array_equal(native["pid"], whole.pid)
            else:  # format 3: colours only; the pids follow from the split's order
                assert "pid" not in native
                np.testing.assert_array_equal(store.split_order(split).pids(0, info.n_rays), whole.pid)
            np.testing.assert_array_equal(native["rgba"], whole.rgba)
            for name, values in whole.extra.items():
                np.testing.assert_array_equal(native[name], values)


class ZarrNative:
    def payload_kinds(self, store: RayStore) -> dict[str, str]:
        kinds: dict[str, str] = {}
        for rel in store.files:
            if rel.startswith("zarr/") and not rel.endswith("zarr.json"):
                kinds.setdefault(rel.split("/")[2], rel)
        return kinds

    def data_offset(self, store: RayStore, rel: str) -> int:
        return int(store.files[rel]["size"]) // 3

    def split_of(self, rel: str) -> str:
        return rel.split("/")[1]

    def native_split(self, store_dir: Path, split: str) -> dict[str, np.ndarray]:
        import zarr

        group = zarr.open_group(store_dir / "zarr", mode="r")
        return {name: np.asarray(array[:]) for name, array in group[split].arrays()}


class WebDatasetNative:
    def payload_kinds(self, store: RayStore) -> dict[str, str]:
        return {"tar": next(rel for rel in store.files if rel.startswith("wds/"))}

    def split_of(self, rel: str) -> str:
        return rel.split("/")[1].rsplit("-", 1)[0]

    def data_offset(self, store: RayStore, rel: str) -> int:
        split = self.split_of(rel)
        index = store.index[split]
        chunk = next(i for i, s in enumerate(index["shard"]) if rel.endswith(f"-{s:06d}.tar"))
        offset, size = index["members"][chunk]["rgba"]
        return int(offset + size - 7)

    def native_split(self, store_dir: Path, split: str) -> dict[str, np.ndarray]:
        import webdataset

        urls = [str(p) for p in sorted((store_dir / "wds").glob(f"{split}-*.tar"))]
        samples = list(webdataset.WebDataset(urls, shardshuffle=False).decode())
        keys = [s["__key__"] for s in samples]
        assert keys == [f"{split}_{i:08d}" for i in range(len(samples))]
        fields = [k.removesuffix(".npy") for k in samples[0] if k.endswith(".npy")]
        return {f: np.concatenate([s[f + ".npy"] for s in samples]) for f in fields}


class TestZarr(ZarrNative, StoreContract):
    backend = "zarr"


class TestWebDataset(WebDatasetNative, StoreContract):
    backend = "wds"


class TestZarrMaterialized(ZarrNative, StoreContract):
    backend = "zarr"
    materialize = "float16"


class TestWebDatasetMaterialized(WebDatasetNative, StoreContract):
    backend = "wds"
    materialize = "float32"


def test_range_errors_are_raykit_and_index_errors(tmp_path: Path, records, scene: SceneInfo) -> None:
    """A read outside the store raises an error a caller can catch as ``RaykitError`` or ``IndexError``."""
    store = write_store(
        tmp_path / "s", records, scene=scene, chunk_rays=CHUNK_RAYS, shard_chunks=SHARD_CHUNKS
    )
    for read in (lambda: store.read_chunk("train", 10**6), lambda: store.read("nope", 0, 1),
                 lambda: store.image_index("no-such-image")):  # fmt: skip
        with pytest.raises(RaykitError):
            read()
        with pytest.raises(IndexError, match=str(tmp_path)):
            read()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_on_cuda_match_cpu(tmp_path: Path, records, scene: SceneInfo) -> None:
    store = write_store(
        tmp_path / "s", records, scene=scene, chunk_rays=CHUNK_RAYS, shard_chunks=SHARD_CHUNKS
    )
    raw = store.read_chunk("train", 0)
    cpu, gpu = reference_batch(store, raw, "cpu"), reference_batch(store, raw, "cuda")
    assert gpu.origins.is_cuda and gpu.rgb.is_cuda
    for name in ("origins", "directions", "rgb", "alpha", "image", "pixel", "near", "far", "z_scale"):
        torch.testing.assert_close(getattr(gpu, name).cpu(), getattr(cpu, name), atol=1e-5, rtol=1e-5)
    name = store.images("val")[0]
    torch.testing.assert_close(
        image_rays(store, name, "cuda").directions.cpu(), image_rays(store, name).directions
    )
