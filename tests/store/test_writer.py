"""Writer: determinism across executors, resume after a crash, input checks, shuffle quality."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raykit.cameras import Camera
from raykit.errors import ConfigError, SourceError, StoreNotFoundError
from raykit.fileio import punch_hole
from raykit.loaders import image_rays
from raykit.profiling.mixing import chunk_shuffle_quality
from raykit.store import ImageRecord, SceneInfo, open_store, write_store
from raykit.store.write.tasks import write_shard_task

OPTIONS: dict[str, Any] = {"chunk_rays": 64, "shard_chunks": 2, "seed": 1}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _shard_of(rel: Path) -> tuple[str, ...]:
    """(split, shard) of a zarr shard file ``zarr/{split}/{field}/c/{shard}[/0]``, or the tar's name."""
    parts = rel.parts
    return (parts[1], parts[4]) if parts[0] == "zarr" else parts


class LoggedLoad:
    """Picklable ``load`` that logs each call to a file and fails while ``fail_flag`` exists."""

    def __init__(self, pixels: np.ndarray, name: str, log: Path, fail_flag: Path) -> None:
        self.pixels, self.name, self.log, self.fail_flag = pixels, name, log, fail_flag

    def __call__(self) -> np.ndarray:
        with open(self.log, "a") as handle:
            handle.write(self.name + "\n")
        if self.fail_flag.exists():
            raise RuntimeError(f"simulated crash loading {self.name}")
        return self.pixels


class CrashingExecutor(concurrent.futures.Executor):
    """Runs tasks inline; raises once ``limit`` shard tasks have run (a crash in phase 2)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.shards = limit, 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        if fn is write_shard_task:
            if self.shards >= self.limit:
                raise RuntimeError("simulated crash in phase 2")
            self.shards += 1
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(fn(*args, **kwargs))
        return future


def test_bytes_do_not_depend_on_executor(tmp_path: Path, records, scene: SceneInfo) -> None:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as pool:
        for backend in ("zarr", "wds"):
            write_store(tmp_path / f"serial-{backend}", records, scene=scene, backend=backend, **OPTIONS)
            write_store(
                tmp_path / f"pool-{backend}", records, scene=scene, backend=backend, executor=pool, **OPTIONS
            )
            serial, pooled = _tree(tmp_path / f"serial-{backend}"), _tree(tmp_path / f"pool-{backend}")
            assert serial.keys() == pooled.keys() and serial == pooled
            assert not (tmp_path / f"pool-{backend}.partial").exists()


def test_input_order_does_not_matter(tmp_path: Path, records, scene: SceneInfo) -> None:
    a = write_store(tmp_path / "a", records, scene=scene, **OPTIONS)
    b = write_store(tmp_path / "b", records[::-1], scene=scene, **OPTIONS)
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b") and a.fingerprint == b.fingerprint
    c = write_store(tmp_path / "c", records, scene=scene, **{**OPTIONS, "seed": 2})
    assert c.fingerprint != a.fingerprint


def test_resume_after_crash_in_phase_1(tmp_path: Path, records, scene: SceneInfo) -> None:
    # Staging in files (memory_staging_bytes=0): a rerun decodes only the images not staged yet.
    options = {**OPTIONS, "memory_staging_bytes": 0}
    log, flag = tmp_path / "log.txt", tmp_path / "fail"
    logged = [
        dataclasses.replace(r, load=LoggedLoad(r.load(), r.name, log, flag if i == 4 else tmp_path / "never"))
        for i, r in enumerate(records)
    ]
    flag.touch()
    dst = tmp_path / "store"
    with pytest.raises(RuntimeError, match="simulated crash"):
        write_store(dst, logged, scene=scene, **options)
    assert not dst.exists() and (tmp_path / "store.partial").exists()
    with pytest.raises(StoreNotFoundError, match="incomplete store"):
        open_store(dst)
    flag.unlink()
    store = write_store(dst, logged, scene=scene, **options)
    calls = log.read_text().split()
    assert sorted(calls) == sorted([r.name for r in records] + [records[4].name])
    fresh = write_store(tmp_path / "fresh", records, scene=scene, **OPTIONS)
    assert _tree(dst) == _tree(tmp_path / "fresh") and store.fingerprint == fresh.fingerprint


def test_disk_staging_is_compact_freed_by_shards_and_resumes(
    tmp_path: Path, records, scene: SceneInfo
) -> None:
    # RGB images stage 3 bytes a pixel; each finished shard frees its runs, so their staging files no
    # longer match their records and a rerun stages those images again: same bytes as a fresh write.
    dst, partial = tmp_path / "store", tmp_path / "store.partial"
    with pytest.raises(RuntimeError, match="phase 2"):
        write_store(dst, records, scene=scene, executor=CrashingExecutor(3), **OPTIONS)
    staged = sorted(p.stat().st_size for p in (partial / "staging").glob("*.px"))
    shapes = [(r.camera.width * r.camera.height, np.asarray(r.load()).shape[2]) for r in records]
    assert staged == sorted(n * c for n, c in shapes)
    log, never = tmp_path / "log.txt", tmp_path / "never"
    logged = [dataclasses.replace(r, load=LoggedLoad(r.load(), r.name, log, never)) for r in records]
    store = write_store(dst, logged, scene=scene, **OPTIONS)
    probe = tmp_path / "probe"
    probe.write_bytes(bytes(8192))
    if punch_hole(probe, 0, 4096):  # the file system frees runs: images with freed runs are decoded again
        assert log.read_text().split()
    fresh = write_store(tmp_path / "fresh", records, scene=scene, **OPTIONS)
    assert _tree(dst) == _tree(tmp_path / "fresh") and store.fingerprint == fresh.fingerprint


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_resume_after_crash_in_phase_2(tmp_path: Path, records, scene: SceneInfo, backend: str) -> None:
    dst = tmp_path / "store"
    with pytest.raises(RuntimeError, match="phase 2"):
        write_store(dst, records, scene=scene, backend=backend, executor=CrashingExecutor(3), **OPTIONS)
    partial = tmp_path / "store.partial"
    records_dir = sorted((partial / "tasks").glob("*.json"))
    assert len(records_dir) == 3
    payload = [p for p in partial.rglob("*") if p.is_file() and p.parent.name in ("c", "0", "wds")]
    payload = [p for p in payload if "zarr.json" not in p.name]
    stamps = {p.relative_to(partial): p.stat().st_mtime_ns for p in payload}
    damaged = sorted(stamps)[0]
    data = bytearray((partial / damaged).read_bytes())
    data[len(data) // 2] ^= 1
    (partial / damaged).write_bytes(bytes(data))
    write_store(dst, records, scene=scene, backend=backend, **OPTIONS)
    for rel, stamp in stamps.items():
        if _shard_of(rel) != _shard_of(damaged):
            assert (dst / rel).stat().st_mtime_ns == stamp, f"{rel} was rewritten instead of reused"
    write_store(tmp_path / "fresh", records, scene=scene, backend=backend, **OPTIONS)
    assert _tree(dst) == _tree(tmp_path / "fresh")


class CrashingThreads(concurrent.futures.ThreadPoolExecutor):
    """Two threads (staging in memory); raises once ``limit`` shard tasks were submitted."""

    def __init__(self, limit: int) -> None:
        super().__init__(2)
        self.limit, self.submitted = limit, []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        if fn is write_shard_task:
            if len(self.submitted) >= self.limit:
                concurrent.futures.wait(self.submitted)  # they finish; then the writer dies
                raise RuntimeError("simulated crash in phase 2")
            self.submitted.append(super().submit(fn, *args, **kwargs))
            return self.submitted[-1]
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_memory_staging_writes_the_same_bytes_and_resumes(
    tmp_path: Path, records, scene: SceneInfo, backend: str
) -> None:
    files = write_store(tmp_path / "files", records, scene=scene, backend=backend, memory_staging_bytes=0,
                        **OPTIONS)  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        write_store(tmp_path / "threads", records, scene=scene, backend=backend, executor=pool, **OPTIONS)
    assert _tree(tmp_path / "threads") == _tree(tmp_path / "files")
    dst = tmp_path / "store"
    with CrashingThreads(3) as crashing, pytest.raises(RuntimeError, match="phase 2"):
        write_store(dst, records, scene=scene, backend=backend, executor=crashing, **OPTIONS)
    partial = tmp_path / "store.partial"
    assert not (partial / "staging").exists() or not any((partial / "staging").glob("*.px"))
    assert len(list((partial / "tasks").glob("*.json"))) == 3  # finished shards, reused on resume
    store = write_store(dst, records, scene=scene, backend=backend, **OPTIONS)
    assert _tree(dst) == _tree(tmp_path / "files") and store.fingerprint == files.fingerprint


def test_bad_inputs(tmp_path: Path, records, scene: SceneInfo) -> None:
    with pytest.raises(ConfigError, match="unique"):
        write_store(tmp_path / "a", [records[0], records[0]], scene=scene)
    with pytest.raises(ConfigError, match="backend"):
        write_store(tmp_path / "a", records, scene=scene, backend="hdf5")
    with pytest.raises(ConfigError, match="at least one"):
        write_store(tmp_path / "a", [], scene=scene)
    for bad, message in [
        ({"split": "tr.ain"}, "split name"),
        ({"c2w": np.diag([1.0, 1.0, 2.0, 1.0])}, "orthonormal"),
        ({"c2w": np.full((4, 4), np.nan)}, "finite 4x4"),
        ({"near": 3.0, "far": 1.0}, "near < far"),
        ({"near": -1.0}, "non-negative"),
    ]:
        with pytest.raises(ConfigError, match=message):
            write_store(tmp_path / "a", [dataclasses.replace(records[0], **bad)], scene=scene)
    wrong = dataclasses.replace(records[0], load=lambda: np.zeros((3, 3, 3), np.uint8), source_path="x.png")
    with pytest.raises(SourceError, match=r"x\.png: expected uint8 pixels of shape \(12, 16, 3\|4\)"):
        write_store(tmp_path / "b", [wrong], scene=scene)
    write_store(tmp_path / "c", records[:2], scene=scene, **OPTIONS)
    with pytest.raises(ConfigError, match="already exists"):
        write_store(tmp_path / "c", records[:2], scene=scene, **OPTIONS)
    store = write_store(tmp_path / "c", records[:3], scene=scene, overwrite=True, **OPTIONS)
    assert store.splits["train"].n_images == 3
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "precious.txt").write_text("keep")
    with pytest.raises(ConfigError, match="not a raykit store"):
        write_store(tmp_path / "d", records, scene=scene)


def test_rgba_codec_choice(tmp_path: Path, records, scene: SceneInfo) -> None:
    """lz4 (the default) and zstd colours hold the same rays; the codec is in the layout and zarr.json."""
    import json

    lz4 = write_store(tmp_path / "lz4", records, scene=scene, **OPTIONS)
    zstd = write_store(tmp_path / "zstd", records, scene=scene, rgba_codec="zstd", **OPTIONS)
    assert lz4.manifest["layout"]["rgba_codec"] == "lz4" and zstd.manifest["layout"]["rgba_codec"] == "zstd"
    assert lz4.fingerprint == zstd.fingerprint  # the logical content does not depend on compression
    meta = {
        name: json.loads((tmp_path / name / "zarr/train/rgba/zarr.json").read_text())
        for name in ("lz4", "zstd")
    }
    inner = {name: [c["name"] for c in m["codecs"][0]["configuration"]["codecs"]] for name, m in meta.items()}
    assert inner == {"lz4": ["bytes", "blosc", "crc32c"], "zstd": ["bytes", "zstd", "crc32c"]}
    blosc = meta["lz4"]["codecs"][0]["configuration"]["codecs"][1]["configuration"]
    assert (blosc["cname"], blosc["shuffle"], blosc["typesize"]) == ("lz4", "noshuffle", 1)
    for split, info in lz4.splits.items():
        for i in range(info.n_chunks):
            a, b = lz4.read_chunk(split, i), zstd.read_chunk(split, i)
            np.testing.assert_array_equal(a.rgba, b.rgba)
            np.testing.assert_array_equal(a.pid, b.pid)
    with pytest.raises(ConfigError, match="rgba_codec"):
        write_store(tmp_path / "bad", records, scene=scene, rgba_codec="gzip", **OPTIONS)
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.partial").exists()


def test_serial_writer_releases_its_merge_buffers(tmp_path: Path, records, scene: SceneInfo) -> None:
    import gc

    from raykit.store.write.gather import MergeBuffers
    from raykit.store.write.staging import MemoryStaging

    def alive() -> int:
        gc.collect()
        return sum(type(o) in (MergeBuffers, MemoryStaging) for o in gc.get_objects())

    before = alive()
    write_store(tmp_path / "s", records, scene=scene, **OPTIONS)  # shuffled train: merge buffers used
    assert alive() == before  # the writer's buffers and staging went with it: nothing to free by hand


def test_source_hash_of_local_files(tmp_path: Path, records, scene: SceneInfo) -> None:
    source = tmp_path / "image.bin"
    source.write_bytes(b"pixels")
    rec = dataclasses.replace(records[0], source_path=str(source))
    store = write_store(tmp_path / "s", [rec], scene=scene, source={"format": "test"}, **OPTIONS)
    import hashlib

    assert store.table_arrow.column("source_sha256")[0].as_py() == hashlib.sha256(b"pixels").hexdigest()
    assert store.manifest["source"]["format"] == "test" and store.manifest["source"]["fingerprint"]


def test_shuffled_chunks_mix_like_iid(tmp_path: Path, record_factory, scene: SceneInfo) -> None:
    images = [(8, 8, "train", 3)] * 24 + [(8, 8, "val", 3)] * 24
    records = record_factory(1, images)
    store = write_store(tmp_path / "s", records, scene=scene, chunk_rays=128, shard_chunks=2)
    shuffled = chunk_shuffle_quality(store, "train", batch_rays=128, chunks_per_batch=2, n_batches=16)
    ordered = chunk_shuffle_quality(store, "val", batch_rays=128, chunks_per_batch=2, n_batches=16)
    assert shuffled["ratio"] > 0.9
    assert shuffled["tv_ratio"] < 1.2
    assert ordered["ratio"] < 0.5 and ordered["tv_ratio"] > 2


def test_rgb_only_store_has_three_channels(tmp_path: Path, scene: SceneInfo) -> None:
    pixels = np.arange(5 * 4 * 3, dtype=np.uint8).reshape(4, 5, 3)
    rec = ImageRecord(
        "a", "val", Camera("PINHOLE", 5, 4, (5.0, 5.0, 2.5, 2.0)), np.eye(4), None, None, "", pixels.copy
    )
    store = write_store(tmp_path / "s", [rec], scene=SceneInfo(near=0.1, far=3.0))
    batch = image_rays(store, "a")
    assert store.fields["rgba"].channels == 3 and batch.alpha is None
    np.testing.assert_array_equal(np.rint(batch.rgb.numpy() * 255).reshape(4, 5, 3), pixels)
    assert float(batch.near[0]) == pytest.approx(0.1) and float(batch.far[0]) == pytest.approx(3.0)


def test_dask_executor_gives_same_bytes(tmp_path: Path, records, scene: SceneInfo) -> None:
    distributed = pytest.importorskip("distributed")
    write_store(tmp_path / "serial", records, scene=scene, backend="wds", **OPTIONS)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        write_store(
            tmp_path / "dask",
            records,
            scene=scene,
            backend="wds",
            executor=client.get_executor(),
            progress=True,
            **OPTIONS,
        )
    assert _tree(tmp_path / "serial") == _tree(tmp_path / "dask")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    images=st.lists(
        st.tuples(
            st.integers(1, 9),
            st.integers(1, 7),
            st.sampled_from(["train", "val", "x-1"]),
            st.sampled_from([3, 4]),
        ),
        min_size=1,
        max_size=5,
    ),
    chunk_rays=st.integers(1, 40),
    shard_chunks=st.integers(1, 4),
    backend=st.sampled_from(["zarr", "wds"]),
)
def test_any_layout_round_trips(
    tmp_path_factory: pytest.TempPathFactory, record_factory, images, chunk_rays, shard_chunks, backend
) -> None:
    records = record_factory(7, images)
    dst = tmp_path_factory.mktemp("prop") / "s"
    store = write_store(
        dst, records, scene=SceneInfo(), backend=backend, chunk_rays=chunk_rays, shard_chunks=shard_chunks
    )
    for rec in records:
        raw = store.image_raw(rec.name)
        pixels = rec.load()
        np.testing.assert_array_equal(raw.rgba[:, : pixels.shape[2]], pixels.reshape(-1, pixels.shape[2]))
        image = store.read_image(rec.name)
        assert image.shape == (*pixels.shape[:2], store.rgba_channels) == store.image_shape(rec.name)
        np.testing.assert_array_equal(image[..., : pixels.shape[2]], pixels)
    for split, info in store.splits.items():
        whole = store.read(split, 0, info.n_rays)
        assert np.array_equal(np.sort(whole.pid), np.arange(info.n_rays) + info.pid_start)


def test_phase_times_go_to_the_recording_block_of_their_own_thread(
    tmp_path: Path, record_factory, scene: SceneInfo
) -> None:
    """Two writes in two threads, one recording: only its own write lands there, and the writer's
    logger keeps its level."""
    import logging
    import threading

    from raykit.recorder import recording

    level = logging.getLogger("raykit.store.write").level
    records = record_factory(2, [(8, 8, "train", 3)] * 4)
    other = threading.Thread(target=write_store, args=(tmp_path / "b", records), kwargs={"scene": scene})
    with recording() as recorder:
        assert logging.getLogger("raykit.store.write").level == level
        other.start()
        other.join()
        assert recorder.seconds == {}
        write_store(tmp_path / "a", records, scene=scene, chunk_rays=64)
    phases = dict(recorder.seconds)
    assert {"plan", "stage", "shards", "commit"} <= set(phases["write"])
    assert set(phases) == {"write", "write.stage", "write.shard"}
    write_store(tmp_path / "c", records, scene=scene)
    assert recorder.seconds == phases and open_store(tmp_path / "b").fingerprint
