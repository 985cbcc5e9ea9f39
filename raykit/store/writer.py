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
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from raykit.errors import ConfigError
from raykit.fileio import atomic_path, atomic_write_json, fsync_path
from raykit.store import wds_backend, zarr_backend
from raykit.store.destination import OVERWRITE_HINT, check_destination, check_seed, prepare_partial
from raykit.store.integrity import (
    CHUNK_CHECKSUM,
    chunk_checksum,
    content_fingerprint,
    file_record,
    json_digest,
)
from raykit.store.lock import holding_store_lock
from raykit.store.order import TRAIN_ORDER
from raykit.store.schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    FieldSpec,
    ImageRecord,
    SceneInfo,
    SplitInfo,
)
from raykit.store.staging import (
    PhaseClock,
    StageJob,
    StagingSource,
    StoreSource,
    bytes_record,
    record_matches,
    release_buffers,
    stage_image,
    stage_in_memory,
    write_record,
    write_unsynced,
)
from raykit.store.table import build_camera_table, order_records, write_camera_table

__all__ = [
    "BACKENDS",
    "DEFAULT_CHUNK_RAYS",
    "DEFAULT_SHARD_CHUNKS",
    "Payload",
    "ShardJob",
    "copy_store",
    "format_phases",
    "recording_phases",
    "write_shard_task",
    "write_store",
]

_log = logging.getLogger(__name__)
BACKENDS = ("zarr", "wds")
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
SHUFFLED_SPLITS = frozenset({"train"})
Source = StagingSource | StoreSource


@dataclass(frozen=True)
class ShardJob:
    """Phase-2 task: write shard ``shard`` of split ``info`` into ``root``."""

    root: str
    backend: str
    info: SplitInfo
    shard: int
    fields: tuple[FieldSpec, ...]
    layout: Mapping[str, Any]
    source: Source
    key: str
    checksum: str = CHUNK_CHECKSUM  # chunk checksum kind (``chunk_checksum``)


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
    data = job.source.gather(job.info, start, stop, clock)
    order = [spec.name for spec in job.fields]
    chunks = []
    for c in range(first, last):
        lo, hi = (b - start for b in job.info.chunk_range(c))
        chunks.append({name: data[name][lo:hi] for name in order})
    result: dict[str, Any] = {"checksums": [chunk_checksum(ch, order, job.checksum) for ch in chunks]}
    clock.lap("checksum")
    encoded: Mapping[str, bytes | list[bytes]]
    if job.backend == "zarr":
        fields = {spec.name: spec for spec in job.fields}
        encoded = zarr_backend.encode_shards(job.info, job.shard, data, fields, job.layout)
    else:
        encoded, result["members"] = wds_backend.encode_shard(job.info.name, job.shard, first, chunks)
    clock.lap("compress")
    result["files"] = {}
    for rel, payload in encoded.items():
        write_unsynced(root / rel, payload)  # atomic; the writer fsyncs it before the manifest
        clock.lap("write")
        result["files"][rel] = bytes_record(payload)  # hashed from memory, never re-read
        clock.lap("checksum")
    write_record(record_path, {"key": job.key, "result": result})
    clock.lap("write")
    return {**result, "seconds": clock.seconds}


class _Profile:
    """Where a write's time went: wall seconds of the calling process per phase (laps), and the
    tasks' own seconds per phase summed over all tasks (whichever worker ran them).

    Logged at DEBUG level on ``raykit.store.writer`` with ``extra={"raykit_phases": ...}``.
    """

    def __init__(self) -> None:
        self.wall = PhaseClock()
        self.tasks: dict[str, dict[str, float]] = {}

    def absorb(self, kind: str, results: list[dict[str, Any]]) -> None:
        totals = self.tasks.setdefault(kind, {})
        for res in results:
            for phase, seconds in res.pop("seconds", {}).items():
                totals[phase] = totals.get(phase, 0.0) + seconds

    def log(self, dst: Path) -> None:
        phases = {"wall": self.wall.seconds, "tasks": self.tasks}
        _log.debug("wrote %s: %s", dst, json.dumps(phases), extra={"raykit_phases": phases})


class _PhaseHandler(logging.Handler):
    def __init__(self, found: dict[str, Any]) -> None:
        super().__init__(logging.DEBUG)
        self.found = found

    def emit(self, record: logging.LogRecord) -> None:
        phases = getattr(record, "raykit_phases", None)
        if phases is not None:
            self.found.clear()
            self.found.update(phases)


@contextlib.contextmanager
def recording_phases() -> Iterator[dict[str, Any]]:
    """Inside, the last store write's phase times land in the yielded dict:
    ``{"wall": {phase: s}, "tasks": {"stage" | "shard": {phase: s}}}`` (``_Profile``).

    ``wall`` is the writing process's wall time per step (``stage`` and ``shards`` cover the tasks);
    ``tasks`` sums each task's own time per phase over all tasks, whichever thread or worker ran it.
    """
    found: dict[str, Any] = {}
    handler = _PhaseHandler(found)
    level = _log.level
    _log.addHandler(handler)
    _log.setLevel(logging.DEBUG)
    try:
        yield found
    finally:
        _log.removeHandler(handler)
        _log.setLevel(level)


def format_phases(phases: Mapping[str, Any], seconds: float | None = None) -> list[str]:
    """Human lines for ``recording_phases``' dict: wall time per step, then task time per phase."""
    wall, tasks = phases.get("wall", {}), phases.get("tasks", {})
    lines = ["wall s   " + "  ".join(f"{k} {v:.2f}" for k, v in wall.items())]
    for kind, label in (("stage", "decode tasks"), ("shard", "shard tasks")):
        if tasks.get(kind):
            total = sum(tasks[kind].values())
            parts = "  ".join(f"{k} {v:.2f}" for k, v in sorted(tasks[kind].items(), key=lambda kv: -kv[1]))
            lines.append(f"{label} (summed over workers, {total:.2f} s): {parts}")
    if seconds is not None:
        outside = seconds - sum(wall.values())
        lines.append(
            f"total {seconds:.2f} s, of which outside the writer (parsing, probing, start-up) {outside:.2f} s"
        )
    return lines


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


def _check_options(
    backend: str, chunk_rays: int, shard_chunks: int, materialize: str | None, rgba_codec: str = "zstd"
) -> None:
    if rgba_codec not in zarr_backend.RGBA_CODECS:
        raise ConfigError(f"rgba_codec: expected one of {zarr_backend.RGBA_CODECS}, got {rgba_codec!r}")
    if backend not in BACKENDS:
        raise ConfigError(f"store backend: expected one of {BACKENDS}, got {backend!r}")
    if chunk_rays < 1 or shard_chunks < 1:
        raise ConfigError(f"expected chunk_rays >= 1 and shard_chunks >= 1, got {chunk_rays}, {shard_chunks}")
    if materialize not in (None, "float16", "float32"):
        raise ConfigError(f"materialize: expected None, 'float16' or 'float32', got {materialize!r}")


def _partial_dir(dst: Path, plan: Mapping[str, Any], overwrite: bool) -> Path:
    check_destination(dst, overwrite)
    return prepare_partial(dst, plan, json_digest(plan))


def _record_plan(rec: ImageRecord) -> dict[str, Any]:
    cam = rec.camera
    return {
        "name": rec.name,
        "split": rec.split,
        "camera": [cam.model, cam.width, cam.height, list(cam.params), cam.camera_id],
        "c2w": np.asarray(rec.c2w, dtype=np.float64).reshape(16).tolist(),
        "near": rec.near,
        "far": rec.far,
        "source_path": rec.source_path,
        "source_sha256": rec.source_sha256,
    }


def _fields(channels: int, materialize: str | None) -> tuple[FieldSpec, ...]:
    specs = [FieldSpec("rgba", "uint8", channels), FieldSpec("pid", "uint32", 0)]
    if materialize:
        specs += [FieldSpec("origins", materialize, 3), FieldSpec("directions", materialize, 3)]
    return tuple(specs)


def _split_infos(records: Sequence[ImageRecord], chunk_rays: int) -> dict[str, SplitInfo]:
    infos: dict[str, SplitInfo] = {}
    pid = 0
    for rec in records:
        n = rec.camera.width * rec.camera.height
        old = infos.get(rec.split)
        if old is None:
            infos[rec.split] = SplitInfo(rec.split, n, 1, chunk_rays, rec.split in SHUFFLED_SPLITS, pid)
        else:
            infos[rec.split] = SplitInfo(
                rec.split, old.n_rays + n, old.n_images + 1, chunk_rays, old.shuffled, old.pid_start
            )
        pid += n
    return infos


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
    rgba_codec: str = zarr_backend.RGBA_CODEC,
    zstd_level: int = 3,
    overwrite: bool = False,
    memory_staging_bytes: int = DEFAULT_MEMORY_STAGING_BYTES,
) -> Any:
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
    """
    _check_options(backend, chunk_rays, shard_chunks, materialize, rgba_codec)
    check_seed(seed)
    profile = _Profile()
    dst = Path(dst)
    ordered = order_records(records)
    layout = {
        "chunk_rays": chunk_rays,
        "shard_chunks": shard_chunks,
        "seed": seed,
        "rgba_codec": rgba_codec,
        "zstd_level": zstd_level,
        "blosc_cname": zarr_backend.BLOSC_CNAME,
        "blosc_clevel": zarr_backend.BLOSC_CLEVEL,
        "blosc_shuffle": zarr_backend.BLOSC_SHUFFLE,
        "materialize": materialize,
    }
    plan = {
        "format_version": FORMAT_VERSION,
        "train_order": TRAIN_ORDER,  # a .partial of a writer with another order is discarded
        "backend": backend,
        "layout": layout,
        "scene": scene.to_dict(),
        "records": [_record_plan(r) for r in ordered],
        "source": dict(source or {}),
    }
    partial = _partial_dir(dst, plan, overwrite)
    profile.wall.lap("plan")
    staged_bytes = sum(r.camera.width * r.camera.height * 4 for r in ordered)
    memory = _in_process(executor) and staged_bytes <= memory_staging_bytes
    with stage_in_memory(partial) if memory else contextlib.nullcontext():
        stage_jobs = [
            StageJob(
                str(partial), i, r, json_digest([_record_plan(r), seed]), r.split in SHUFFLED_SPLITS,
                seed, memory,
            )
            for i, r in enumerate(ordered)
        ]  # fmt: skip
        staged = _run(stage_image, stage_jobs, executor, progress, "decode images")
        profile.absorb("stage", staged)
        profile.wall.lap("stage")
        channels = 4 if any(s["channels"] == 4 for s in staged) else 3
        splits = _split_infos(ordered, chunk_rays)
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
            backend, table, scene, splits, _fields(channels, materialize), layout,
            {**dict(source or {}), "fingerprint": fingerprint},
        )  # fmt: skip
        sizes = tuple(r.camera.width * r.camera.height for r in ordered)
        image_channels = tuple(int(s["channels"]) for s in staged)
        gather = StagingSource(
            str(partial), offsets, sizes, image_channels, channels, materialize, memory, seed
        )
        return _write_payload_and_commit(
            partial, dst, payload, gather, json_digest(plan), executor, progress, overwrite, profile
        )


@dataclass(frozen=True)
class Payload:
    """What phases 2 and 3 write: backend, camera table, scene, splits, fields, layout, source."""

    backend: str
    table: Any  # pyarrow.Table
    scene: SceneInfo
    splits: Mapping[str, SplitInfo]
    fields: tuple[FieldSpec, ...]
    layout: Mapping[str, Any]
    source: Mapping[str, Any]
    checksum: str = CHUNK_CHECKSUM  # chunk checksum kind; a copy keeps its source's


def _write_shards(
    partial: Path,
    payload: Payload,
    gather: Source,
    plan_key: str,
    executor: Any,
    progress: bool,
    profile: _Profile,
) -> tuple[dict[str, Any], dict[str, dict[str, list[Any]]]]:
    """Phase 2: every shard (and zarr metadata). Returns (file records, chunk index)."""
    files: dict[str, Any] = {}
    if payload.backend == "zarr":
        specs = {spec.name: spec for spec in payload.fields}
        for rel in zarr_backend.write_metadata(partial, payload.splits, specs, payload.layout):
            files[rel] = file_record(partial / rel)
    jobs = [
        ShardJob(str(partial), payload.backend, info, shard, payload.fields, payload.layout, gather,
                 f"{plan_key}:{info.name}:{shard}", payload.checksum)
        for info in payload.splits.values()
        for shard in range(-(-info.n_chunks // payload.layout["shard_chunks"]))
    ]  # fmt: skip
    profile.wall.lap("zarr_metadata")
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as syncing:
        # Shard files reach the disk while later shards are being encoded (fsync mostly waits on I/O)
        synced: list[concurrent.futures.Future[None]] = []
        results: list[dict[str, Any]] = []
        try:
            for res in _run_iter(
                write_shard_task, jobs, executor, progress, f"write {payload.backend} shards"
            ):
                synced += [syncing.submit(fsync_path, partial / rel) for rel in res["files"]]
                results.append(res)
        finally:
            release_buffers()  # tasks run serially in this thread kept their merge buffers here
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
        if payload.backend == "wds":
            entry.setdefault("shard", []).extend([job.shard] * len(res["checksums"]))
            entry.setdefault("members", []).extend(res["members"])
        files.update(res["files"])
    return files, index


def _manifest(payload: Payload, files: Mapping[str, Any], index: Mapping[str, Any]) -> dict[str, Any]:
    split_dicts = {name: info.to_dict() for name, info in payload.splits.items()}
    field_dicts = {spec.name: spec.to_dict() for spec in payload.fields}
    crcs = {k: v[payload.checksum] for k, v in index.items()}
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "raykit_version": _raykit_version(),
        "backend": payload.backend,
        "layout": dict(payload.layout),
        "source": dict(payload.source),
        "scene": payload.scene.to_dict(),
        "splits": split_dicts,
        "fields": field_dicts,
        "n_images": payload.table.num_rows,
        "files": dict(sorted(files.items())),
        "content_fingerprint": content_fingerprint(
            payload.table, payload.scene.to_dict(), split_dicts, field_dicts, crcs, payload.checksum
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
    profile: _Profile,
) -> Any:
    """Phases 2 and 3: shards, ``index.json``, ``manifest.json``, then the rename to ``dst``."""
    files, index = _write_shards(partial, payload, gather, plan_key, executor, progress, profile)
    atomic_write_json(partial / "index.json", index)
    for rel in ("cameras.parquet", "index.json"):
        files[rel] = file_record(partial / rel)
    atomic_write_json(partial / "manifest.json", _manifest(payload, files, index))
    profile.wall.lap("index_manifest")
    store = _commit(partial, dst, overwrite)
    profile.wall.lap("commit")
    profile.log(dst)
    return store


def _commit(partial: Path, dst: Path, overwrite: bool) -> Any:
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
) -> Any:
    """Copy the store at ``src`` (path or URL) to ``dst`` in ``backend``; same logical content.

    The copy keeps the chunk and shard layout, the camera table, scene and source description, so its
    content fingerprint equals the source's.
    """
    from raykit.store.reader import open_store

    profile = _Profile()
    store = open_store(src)
    layout = dict(store.manifest["layout"])
    _check_options(backend, layout["chunk_rays"], layout["shard_chunks"], layout.get("materialize"))
    dst = Path(dst)
    plan = {"copy_of": store.fingerprint, "backend": backend, "layout": layout}
    partial = _partial_dir(dst, plan, overwrite)
    with atomic_path(partial / "cameras.parquet") as tmp:
        write_camera_table(store.cameras, str(tmp))
    payload = Payload(
        backend, store.cameras, store.scene, store.splits, tuple(store.fields.values()), layout,
        store.manifest["source"], store.chunk_checksum,
    )  # fmt: skip
    return _write_payload_and_commit(
        partial, dst, payload, StoreSource(store.url), json_digest(plan), executor, progress, overwrite,
        profile,
    )  # fmt: skip
