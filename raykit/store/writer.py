"""Write a ray store from image records (converters) or from another store (``raykit copy``).

Three phases, all in ``<dst>.partial/`` beside ``dst``:

1. one task per image decodes it into ``staging/{index:06d}.px`` (raw packed RGBA; in a shuffled split
   in the image's seeded order), or into memory when every task runs in this process;
2. one task per shard reads one contiguous run of rays per image from staging, merges them in the
   split's order (train; ``raykit.store.order``) and writes the shard atomically with the chosen
   backend;
3. ``cameras.parquet``, ``index.json`` (per-chunk CRCs and, for WebDataset, member offsets) and last
   ``manifest.json`` (every file's size and SHA-256 plus the content fingerprint); staging is removed
   and ``<dst>.partial`` is renamed to ``dst``.

A rerun with the same inputs resumes: tasks whose records and checksums match are skipped. Output
bytes do not depend on the executor or the number of workers.

Length (about 510 lines): the three phases, resume, commit and ``copy_store`` share the payload
and task records; planning lives in ``plan.py``, timing in ``phases.py``, staging in ``staging.py``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from raykit.errors import ConfigError
from raykit.fileio import atomic_path, atomic_write_bytes, atomic_write_json, fsync_path
from raykit.store.backend import (
    BACKENDS,
    RGBA_CODEC,
    Backend,
    PayloadSpec,
    backend_named,
    payload_layout,
)
from raykit.store.destination import OVERWRITE_HINT, check_seed
from raykit.store.integrity import (
    CHUNK_CHECKSUM,
    chunk_checksum,
    content_fingerprint,
    file_record,
    json_digest,
)
from raykit.store.lock import holding_store_lock
from raykit.store.order import TRAIN_ORDER
from raykit.store.phases import PhaseClock, Profile
from raykit.store.plan import (
    SHUFFLED_SPLITS,
    check_options,
    field_specs,
    partial_dir,
    record_plan,
    split_infos,
)
from raykit.store.points import POINTS_FILE, SparsePoints, points_digest, points_entry, write_points
from raykit.store.schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    FieldSpec,
    ImageRecord,
    SceneInfo,
    SplitInfo,
)
from raykit.store.staging import (
    StageJob,
    StagingSource,
    StoreSource,
    bytes_record,
    record_matches,
    release_stage_memos,
    stage_image,
    write_record,
)
from raykit.store.staging_area import DiskStaging, MemoryStaging
from raykit.store.table import CameraTable, build_camera_table, order_records, write_camera_table

if TYPE_CHECKING:
    from raykit.store.reader import RayStore

__all__ = [
    "BACKENDS",
    "DEFAULT_CHUNK_RAYS",
    "DEFAULT_SHARD_CHUNKS",
    "Payload",
    "ShardJob",
    "copy_store",
    "write_shard_task",
    "write_store",
]


DEFAULT_CHUNK_RAYS = 65536
DEFAULT_SHARD_CHUNKS = 16


def _default_memory_staging() -> int:
    """4 GiB, or a quarter of this machine's memory when that is less."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 4 << 30
    return int(min(4 << 30, total // 4))


DEFAULT_MEMORY_STAGING_BYTES = _default_memory_staging()
# Part of every shard task's resume key: records of an older task result layout are redone, not reused.
_TASK_FORMAT = 3  # 3: format-3 stores (pids derived, checked apart)
Source = StagingSource | StoreSource


@dataclass(frozen=True)
class ShardJob:
    """Phase-2 task: write shard ``shard`` of split ``info`` into ``root``."""

    root: str
    backend: Backend
    info: SplitInfo
    shard: int
    fields: tuple[FieldSpec, ...]
    layout: Mapping[str, Any]
    source: Source
    key: str
    checksum: str = CHUNK_CHECKSUM  # chunk checksum kind (``chunk_checksum``)
    stored: tuple[str, ...] = ()  # the fields this split stores (format 3: no pid when derived)
    legacy: bool = False  # format <= 2: one checksum over every field; else pids are checked apart


def write_shard_task(job: ShardJob) -> dict[str, Any]:
    """Phase-2 task. Returns ``{"files": {rel: record}, "checksums": [per chunk], "members": [...]}``
    and ``"seconds"``, the time per phase (not recorded)."""
    root = Path(job.root)
    record_path = root / f"tasks/{job.info.name}-{job.shard:06d}.json"
    clock = PhaseClock()
    done = record_matches(record_path, job.key, root)
    if done is not None:
        clock.lap("resume_check")
        return {**done, "seconds": clock.seconds}
    shard_chunks = job.layout["shard_chunks"]
    first = job.shard * shard_chunks
    last = min(first + shard_chunks, job.info.n_chunks)
    start, stop = job.info.chunk_range(first)[0], job.info.chunk_range(last - 1)[1]
    stored = job.stored or tuple(spec.name for spec in job.fields)
    data = job.source.gather(job.info, start, stop, clock, pids="pid" in stored)
    data = {name: data[name] for name in stored}
    fields = {spec.name: spec for spec in job.fields}
    # Format 3: the chunk checksum covers every stored field but the pids, which (when stored) have
    # their own, so a copy with or without stored pids keeps its checksums and fingerprint.
    summed = list(stored) if job.legacy else [name for name in stored if name != "pid"]
    checksums, pid_checksums = [], []
    for c in range(first, last):
        lo, hi = (b - start for b in job.info.chunk_range(c))
        checksums.append(chunk_checksum({name: data[name][lo:hi] for name in summed}, summed, job.checksum))
        if "pid" in stored and not job.legacy:
            pid_checksums.append(chunk_checksum({"pid": data["pid"][lo:hi]}, ["pid"], job.checksum))
    result: dict[str, Any] = {"checksums": checksums}
    if pid_checksums:
        result["pid_checksums"] = pid_checksums
    clock.lap("checksum")
    spec = PayloadSpec(fields, job.layout, {job.info.name: stored})
    encoded = job.backend.encode_shard(job.info, job.shard, data, spec)
    result["index"] = encoded.index
    clock.lap("compress")
    result["files"] = {}
    for rel, payload in encoded.files.items():
        atomic_write_bytes(root / rel, payload, sync=False)  # fsynced in the background before the manifest
        clock.lap("write")
        result["files"][rel] = bytes_record(payload)  # hashed from memory, never re-read
        clock.lap("checksum")
    write_record(record_path, {"key": job.key, "result": result})
    clock.lap("write")
    return {**result, "seconds": clock.seconds}


def _run(
    fn: Callable[[Any], Any], jobs: Sequence[Any], executor: Any, progress: bool, desc: str
) -> list[Any]:
    return list(_run_iter(fn, jobs, executor, progress, desc))


def _run_iter(
    fn: Callable[[Any], Any], jobs: Sequence[Any], executor: Any, progress: bool, desc: str
) -> Iterator[Any]:
    """The results of ``fn`` over ``jobs`` in order, as they finish (with a progress bar)."""
    results: Iterable[Any] = map(fn, jobs) if executor is None else executor.map(fn, jobs)
    yield from tqdm(results, total=len(jobs), desc=desc, disable=not progress, unit="task")


def _in_process(executor: Any) -> bool:
    """True when the executor runs tasks in this process (None: serially; or a thread pool)."""
    return executor is None or isinstance(executor, concurrent.futures.ThreadPoolExecutor)


@holding_store_lock("dst")  # one writer per store (raykit.store.lock)
def write_store(
    dst: str | Path,
    records: Sequence[ImageRecord],
    *,
    scene: SceneInfo,
    backend: str = "zarr",
    chunk_rays: int = DEFAULT_CHUNK_RAYS,
    shard_chunks: int = DEFAULT_SHARD_CHUNKS,
    seed: int = 0,
    executor: concurrent.futures.Executor | None = None,
    progress: bool = False,
    materialize: str | None = None,
    source: Mapping[str, Any] | None = None,
    rgba_codec: str = RGBA_CODEC,
    zstd_level: int = 3,
    overwrite: bool = False,
    memory_staging_bytes: int = DEFAULT_MEMORY_STAGING_BYTES,
    with_pids: bool = False,
    points: SparsePoints | None = None,
) -> RayStore:
    """Write a ray store at ``dst`` from ``records`` and return it opened (a ``RayStore``).

    Args:
        records: one per image; ``load()`` must be picklable when ``executor`` is a process pool.
        scene: world frame, transform from the source frame, bounds.
        backend: ``"zarr"`` or ``"wds"``.
        chunk_rays: rays per chunk (the read unit); shard_chunks: chunks per shard (the write unit).
        seed: seed of the train split's ray permutation.
        executor: runs the per-image and per-shard tasks; None runs them in this process.
        materialize: also store origins/directions as ``"float16"`` or ``"float32"``.
        source: description of the source (format, path, ...) recorded in the manifest.
        rgba_codec: the zarr backend's codec for colours: ``"lz4"`` (blosc-lz4, fast) or ``"zstd"``
            (about two thirds the size, half the speed).
        zstd_level: zstd level of the zarr backend's ``"zstd"`` colours.
        overwrite: replace an existing store at ``dst``.
        memory_staging_bytes: when every task runs in this process (``executor`` None or a thread
            pool) and the decoded images take at most this many bytes staged (4 per pixel), they
            are staged in memory instead of in files (0: always files).
        points: sparse 3-D points in the store's world frame, stored as ``points3D.parquet``
            (``raykit.store.points``).
        with_pids: also store every split's pids (format 3 derives them from the split's order
            at read time; other readers may want them explicit).
    """
    check_options(backend, chunk_rays, shard_chunks, materialize, rgba_codec)
    check_seed(seed)
    profile = Profile()
    dst = Path(dst)
    ordered = order_records(records)
    layout = {
        "chunk_rays": chunk_rays,
        "shard_chunks": shard_chunks,
        "seed": seed,
        **payload_layout(rgba_codec, zstd_level),
        "materialize": materialize,
        "train_order": TRAIN_ORDER,
    }
    records_plan = [record_plan(r) for r in ordered]  # each image's part of the plan and its task key
    plan = {
        "format_version": FORMAT_VERSION,
        "train_order": TRAIN_ORDER,  # a .partial of a writer with another order is discarded
        "backend": backend,
        "layout": layout,
        "scene": scene.to_dict(),
        "records": records_plan,
        "source": dict(source or {}),
        "with_pids": with_pids,
    }
    if points is not None:  # only then: plans (and resume keys) of stores without points are unchanged
        plan["points"] = points_digest(points)
    plan_key = json_digest(plan)
    partial = partial_dir(dst, plan, overwrite, plan_key)
    profile.wall.lap("plan")
    staged_bytes = sum(r.camera.width * r.camera.height * 4 for r in ordered)
    memory = _in_process(executor) and staged_bytes <= memory_staging_bytes
    staging = MemoryStaging(str(partial)) if memory else DiskStaging(str(partial))
    with staging:
        stage_jobs = [
            StageJob(
                str(partial), i, r, json_digest([records_plan[i], seed]), r.split in SHUFFLED_SPLITS,
                seed, staging,
            )
            for i, r in enumerate(ordered)
        ]  # fmt: skip
        try:
            staged = _run(stage_image, stage_jobs, executor, progress, "decode images")
        finally:
            release_stage_memos()
        profile.absorb("stage", staged)
        profile.wall.lap("stage")
        channels = 4 if any(s["channels"] == 4 for s in staged) else 3
        splits = split_infos(ordered, chunk_rays, "stored" if with_pids else "derived")
        shuffled = {name for name, info in splits.items() if info.shuffled}
        alpha = [s["channels"] == 4 for s in staged]
        table = build_camera_table(ordered, alpha, [s["source_sha256"] for s in staged], shuffled)
        with atomic_path(partial / "cameras.parquet") as tmp:
            write_camera_table(table, str(tmp))
        offsets = tuple(int(v) for v in table.column("pixel_offset").to_pylist())
        profile.wall.lap("camera_table")
        # source fingerprint: every image's name, source file SHA-256, decoded shape and pixel CRC-32C
        fingerprint = json_digest(
            [[r.name, s["source_sha256"], [r.camera.height, r.camera.width, s["channels"]],
              s["pixels_crc32c"]] for r, s in zip(ordered, staged, strict=True)]
        )  # fmt: skip
        payload = Payload(
            backend_named(backend), table, scene, splits, field_specs(channels, materialize), layout,
            {**dict(source or {}), "fingerprint": fingerprint, "image_bytes": _image_bytes(ordered)},
            points=points,
        )  # fmt: skip
        sizes = tuple(r.camera.width * r.camera.height for r in ordered)
        image_channels = tuple(int(s["channels"]) for s in staged)
        # The cameras travel with the source (materialised rays need them): no task re-reads the table.
        cameras = CameraTable.from_arrow(table) if materialize else None
        gather = StagingSource(
            str(partial), offsets, sizes, image_channels, channels, materialize, staging, seed, cameras
        )
        return _write_payload_and_commit(
            partial, dst, payload, gather, plan_key, executor, progress, overwrite, profile
        )


@dataclass(frozen=True)
class Payload:
    """What phases 2 and 3 write: backend, camera table, scene, splits, fields, layout, source."""

    backend: Backend
    table: Any  # pyarrow.Table
    scene: SceneInfo
    splits: Mapping[str, SplitInfo]
    fields: tuple[FieldSpec, ...]
    layout: Mapping[str, Any]
    source: Mapping[str, Any]
    checksum: str = CHUNK_CHECKSUM  # chunk checksum kind; a copy keeps its source's
    format_version: int = FORMAT_VERSION  # a copy of a format 1 or 2 store is written as format 2
    points: SparsePoints | None = None  # sparse points, world frame (``points3D.parquet``)

    @property
    def legacy(self) -> bool:
        """Format <= 2: every pid stored, one checksum per chunk over every field."""
        return self.format_version <= 2

    def spec(self) -> PayloadSpec:
        return PayloadSpec.of({f.name: f for f in self.fields}, self.layout, self.splits)


def _image_bytes(records: Sequence[ImageRecord]) -> int | None:
    """Total bytes of the source image files when every image is a local file, else None."""
    total = 0
    for rec in records:
        if not rec.source_path or not os.path.isfile(rec.source_path):
            return None
        total += os.path.getsize(rec.source_path)
    return total


def _write_shards(
    partial: Path,
    payload: Payload,
    gather: Source,
    plan_key: str,
    executor: Any,
    progress: bool,
    profile: Profile,
) -> tuple[dict[str, Any], dict[str, dict[str, list[Any]]]]:
    """Phase 2: every shard (and zarr metadata). Returns (file records, chunk index)."""
    files: dict[str, Any] = {}
    spec = payload.spec()
    for rel in payload.backend.write_metadata(partial, payload.splits, spec):
        files[rel] = file_record(partial / rel)
    jobs = [
        ShardJob(str(partial), payload.backend, info, shard, payload.fields, payload.layout, gather,
                 f"{plan_key}:{info.name}:{shard}:{_TASK_FORMAT}", payload.checksum,
                 tuple(spec.fields_of(info.name)), payload.legacy)
        for info in payload.splits.values()
        for shard in range(-(-info.n_chunks // payload.layout["shard_chunks"]))
    ]  # fmt: skip
    profile.wall.lap("metadata")
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as syncing:
        # Shard files reach the disk while later shards are being encoded (fsync mostly waits on I/O)
        synced: list[concurrent.futures.Future[None]] = []
        results: list[dict[str, Any]] = []
        for res in _run_iter(
            write_shard_task, jobs, executor, progress, f"write {payload.backend.name} shards"
        ):
            synced += [syncing.submit(fsync_path, partial / rel) for rel in res["files"]]
            results.append(res)
        profile.wall.lap("shards")
        for future in synced:
            future.result()
        shard_dirs = {(partial / rel).parent for res in results for rel in res["files"]}
        list(syncing.map(fsync_path, sorted(shard_dirs)))
    profile.absorb("shard", results)
    profile.wall.lap("fsync")
    index: dict[str, dict[str, list[Any]]] = {name: {payload.checksum: []} for name in payload.splits}
    for job, res in zip(jobs, results, strict=True):
        entry = index[job.info.name]
        entry[payload.checksum] += res["checksums"]
        if "pid_checksums" in res:
            entry.setdefault(f"pid_{payload.checksum}", []).extend(res["pid_checksums"])
        for key, values in res["index"].items():
            entry.setdefault(key, []).extend(values)
        files.update(res["files"])
    return files, index


def _manifest(payload: Payload, files: Mapping[str, Any], index: Mapping[str, Any]) -> dict[str, Any]:
    if payload.legacy:
        split_dicts = {name: info.legacy_dict() for name, info in payload.splits.items()}
        hashed = split_dicts
    else:
        split_dicts = {name: info.to_dict() for name, info in payload.splits.items()}
        hashed = {name: info.fingerprint_dict() for name, info in payload.splits.items()}
    field_dicts = {spec.name: spec.to_dict() for spec in payload.fields}
    crcs = {k: v[payload.checksum] for k, v in index.items()}
    manifest = {
        "format": FORMAT_NAME,
        "format_version": payload.format_version,
        "raykit_version": _raykit_version(),
        "backend": payload.backend.name,
        "layout": dict(payload.layout),
        "source": dict(payload.source),
        "scene": payload.scene.to_dict(),
        "splits": split_dicts,
        "fields": field_dicts,
        "n_images": payload.table.num_rows,
        "files": dict(sorted(files.items())),
        **({"points": points_entry(payload.points)} if payload.points is not None else {}),
        "content_fingerprint": content_fingerprint(
            payload.table, payload.scene.to_dict(), hashed, field_dicts, crcs, payload.checksum
        ),
    }
    manifest["manifest_digest"] = json_digest(manifest)
    return manifest


def _write_payload_and_commit(
    partial: Path,
    dst: Path,
    payload: Payload,
    gather: Source,
    plan_key: str,
    executor: Any,
    progress: bool,
    overwrite: bool,
    profile: Profile,
) -> RayStore:
    """Phases 2 and 3: shards, ``index.json``, ``manifest.json``, then the rename to ``dst``."""
    files, index = _write_shards(partial, payload, gather, plan_key, executor, progress, profile)
    atomic_write_json(partial / "index.json", index)
    written = ["cameras.parquet", "index.json"]
    if payload.points is not None:
        with atomic_path(partial / POINTS_FILE) as tmp:
            write_points(payload.points, str(tmp))
        written.append(POINTS_FILE)
    for rel in written:
        files[rel] = file_record(partial / rel)
    atomic_write_json(partial / "manifest.json", _manifest(payload, files, index))
    profile.wall.lap("index_manifest")
    store = _commit(partial, dst, overwrite)
    profile.wall.lap("commit")
    profile.finish(dst)
    return store


def _commit(partial: Path, dst: Path, overwrite: bool) -> RayStore:
    for name in ("staging", "tasks"):
        shutil.rmtree(partial / name, ignore_errors=True)
    (partial / "plan.json").unlink(missing_ok=True)
    for path in partial.rglob(".*.tmp"):
        path.unlink()  # temporary files of writers killed mid-write (the atomic-write prefix and suffix)
    for path in partial.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # temporary files are created 0600
    if dst.exists():
        if not overwrite and (dst / "manifest.json").exists():
            raise ConfigError(f"{dst}: a store already exists there ({OVERWRITE_HINT})")
        old = dst.with_name(dst.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        dst.rename(old)
        partial.rename(dst)
        shutil.rmtree(old)
    else:
        partial.rename(dst)
    from raykit.store.reader import open_store

    return open_store(str(dst))


def _raykit_version() -> str:
    from raykit import __version__

    return __version__


@holding_store_lock("dst")
def copy_store(
    src: str | Path,
    dst: str | Path,
    *,
    backend: str,
    executor: concurrent.futures.Executor | None = None,
    progress: bool = False,
    overwrite: bool = False,
    layout: Any = None,
    with_pids: bool = False,
) -> RayStore:
    """Copy the store at ``src`` (path or URL) to ``dst`` in ``backend``; same logical content.

    The copy keeps the chunk and shard layout, the camera table, scene and source description, so its
    content fingerprint equals the source's. ``layout`` (``rays`` or ``images``; default: the
    source's) rewrites it in that layout (``raykit.store.layout_copy``). ``with_pids`` stores every
    split's pids explicitly (a format-3 store derives them); a copy of a format 1 or 2 store (which
    store them) is format 2.
    """
    from raykit.store.images_layout import store_layout
    from raykit.store.reader import open_store

    store = open_store(src)
    if store_layout(store.manifest) == "images" or (layout or "rays") != "rays":
        from raykit.store.layout_copy import copy_layout

        return copy_layout(
            src, dst, backend=backend, layout=layout or store_layout(store.manifest), executor=executor,
            progress=progress, overwrite=overwrite,
        )  # fmt: skip
    profile = Profile()
    layout = dict(store.manifest["layout"])
    check_options(backend, layout["chunk_rays"], layout["shard_chunks"], layout.get("materialize"))
    dst = Path(dst)
    version = 2 if store.manifest["format_version"] <= 2 else FORMAT_VERSION
    splits = store.splits
    if with_pids:
        splits = {name: dataclasses.replace(info, pids="stored") for name, info in splits.items()}
    plan = {"copy_of": store.fingerprint, "backend": backend, "layout": layout, "with_pids": with_pids}
    partial = partial_dir(dst, plan, overwrite)
    with atomic_path(partial / "cameras.parquet") as tmp:
        write_camera_table(store.cameras, str(tmp))
    payload = Payload(
        backend_named(backend), store.cameras, store.scene, splits, tuple(store.fields.values()),
        layout, store.manifest["source"], store.chunk_checksum, version, store.sparse_points(),
    )  # fmt: skip
    return _write_payload_and_commit(
        partial, dst, payload, StoreSource(store.url), json_digest(plan), executor, progress, overwrite,
        profile,
    )  # fmt: skip
