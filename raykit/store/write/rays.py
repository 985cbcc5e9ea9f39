"""The rays payload writer (``StoreSpec.kind == "rays"``), called by ``raykit.store.write_store``.

Its phases in ``<dst>.partial/`` (decode images into staging, one task per shard, commit) and how a
rerun resumes are docs/format.md's "Commit protocol". Planning lives in ``plan.py``, timing in
``phases.py``, the tasks in ``staging.py``, the shard phase and the commit in ``commit.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raykit.fileio import atomic_write_bytes
from raykit.store.backends import Backend, PayloadSpec, backend_named
from raykit.store.files import CHUNK_CHECKSUM, chunk_checksum, file_record, json_digest, local_files_bytes
from raykit.store.order import TRAIN_ORDER
from raykit.store.phases import PhaseClock, Profile
from raykit.store.schema import FORMAT_VERSION, SplitInfo
from raykit.store.spec import StoreSpec
from raykit.store.table import CameraTable, write_camera_table
from raykit.store.write.commit import (
    StoreContent,
    commit,
    in_process,
    open_partial,
    run_tasks,
    staged_content,
    write_shards,
)
from raykit.store.write.job import SHUFFLED_SPLITS, WriteRequest, record_plan, split_infos
from raykit.store.write.staging import (
    DiskStaging,
    MemoryStaging,
    StageJob,
    StagingSource,
    StoreSource,
    base_indices,
    bytes_record,
    finish_task,
    record_matches,
    stage_image,
)

if TYPE_CHECKING:
    from raykit.store.reader import RayStore

__all__ = ["ShardJob", "copy_rays", "write_rays", "write_shard_task"]


# Part of every shard task's resume key: records of an older task result layout are redone, not reused.
_TASK_FORMAT = 4  # 3: format-3 stores (pids derived, checked apart); 4: checksums in "index"


Source = StagingSource | StoreSource


@dataclass(frozen=True)
class ShardJob:
    """Phase-2 task: write shard ``shard`` of split ``info`` into ``root``."""

    root: str
    backend: Backend
    info: SplitInfo
    shard: int
    spec: PayloadSpec  # the store's fields, layout and the fields each split stores
    source: Source
    key: str


def write_shard_task(job: ShardJob) -> dict[str, Any]:
    """Phase-2 task. Returns ``{"files": {rel: record}, "index": {key: [per chunk]}}`` (the chunk
    checksums and the backend's entries) and ``"seconds"``, the time per phase (not recorded)."""
    root = Path(job.root)
    record_path = root / f"tasks/{job.info.name}-{job.shard:06d}.json"
    clock = PhaseClock()
    if (done := record_matches(record_path, job.key, root, clock)) is not None:
        return done
    first, last = _job_chunks(job)
    start, stop = _job_rays(job)
    stored = tuple(job.spec.fields_of(job.info.name))
    data = job.source.gather(job.info, start, stop, clock, pids="pid" in stored)
    data = {name: data[name] for name in stored}
    # The chunk checksum covers every stored field but the pids, which (when stored) have their own,
    # so a copy with or without stored pids keeps its checksums and fingerprint.
    summed = [name for name in stored if name != "pid"]
    pid_key = f"pid_{CHUNK_CHECKSUM}"
    index: dict[str, list[Any]] = {CHUNK_CHECKSUM: [], **({pid_key: []} if "pid" in stored else {})}
    for c in range(first, last):
        lo, hi = (b - start for b in job.info.chunk_range(c))
        chunk = {name: data[name][lo:hi] for name in stored}
        index[CHUNK_CHECKSUM].append(chunk_checksum(chunk, summed, CHUNK_CHECKSUM))
        if "pid" in stored:
            index[pid_key].append(chunk_checksum(chunk, ["pid"], CHUNK_CHECKSUM))
    clock.lap("checksum")
    encoded = job.backend.encode_shard(job.info, job.shard, data, job.spec)
    result: dict[str, Any] = {"index": {**index, **encoded.index}}
    clock.lap("compress")
    result["files"] = {}
    for rel, payload in encoded.files.items():
        atomic_write_bytes(root / rel, payload, sync=False)  # fsynced in the background before the manifest
        clock.lap("write")
        result["files"][rel] = bytes_record(payload)  # hashed from memory, never re-read
        clock.lap("checksum")
    return finish_task(record_path, job.key, result, clock)


def write_rays(request: WriteRequest) -> RayStore:
    """Write a rays-layout store (the caller holds ``request.dst``'s writer lock): stage every
    image, write the shards, commit; returns it opened."""
    opts, ordered = request.spec, request.records
    profile = Profile()
    layout = opts.replace(train_order=TRAIN_ORDER)
    records_plan = [record_plan(r) for r in ordered]  # each image's part of the plan and its task key
    plan = {
        "format_version": FORMAT_VERSION,
        "train_order": TRAIN_ORDER,  # a .partial of a writer with another order is discarded
        "backend": opts.backend,
        "layout": layout.to_dict(),
        "scene": request.scene.to_dict(),
        "records": records_plan,
        "source": dict(request.source),
        "with_pids": opts.with_pids,
    }
    partial, plan_key = open_partial(request, plan)
    profile.wall.lap("plan")
    staged_bytes = sum(r.camera.width * r.camera.height * 4 for r in ordered)
    memory = in_process(request.executor) and staged_bytes <= opts.memory_staging_bytes
    staging = MemoryStaging(str(partial)) if memory else DiskStaging(str(partial))
    with staging:
        keys = [json_digest([entry, opts.seed]) for entry in records_plan]
        stage_jobs = [
            StageJob(str(partial), i, r, keys[i], staging, r.split in SHUFFLED_SPLITS, opts.seed)
            for i, r in enumerate(ordered)
        ]
        try:
            staged = list(run_tasks(stage_image, stage_jobs, request, "decode images"))
        finally:
            base_indices.cache_clear()  # the stage tasks' memoised index arrays
        profile.absorb("stage", staged)
        profile.wall.lap("stage")
        content, gather = _staged_content(request, partial, layout, staged, staging, profile)
        files, index = _write_shards(partial, content, gather, plan_key, request, profile)
        return commit(partial, request, content, files, index, profile)


def _staged_content(
    request: WriteRequest,
    partial: Path,
    layout: StoreSpec,
    staged: Sequence[Mapping[str, Any]],
    staging: MemoryStaging | DiskStaging,
    profile: Profile,
) -> tuple[StoreContent, StagingSource]:
    """The camera table (written), the store's content and the source of the staged rays."""
    opts, ordered = request.spec, request.records
    splits = split_infos(ordered, opts.chunk_rays, "stored" if opts.with_pids else "derived")
    image_bytes = local_files_bytes([r.source_path for r in ordered])
    content = staged_content(request, partial, layout, splits, staged, profile, image_bytes=image_bytes)
    table, channels = content.table, content.spec().fields["rgba"].channels
    offsets = tuple(int(v) for v in table.column("pixel_offset").to_pylist())
    sizes = tuple(r.camera.width * r.camera.height for r in ordered)
    image_channels = tuple(int(s["channels"]) for s in staged)
    # The cameras travel with the source (materialised rays need them): no task re-reads the table.
    cameras = CameraTable.from_arrow(table) if opts.materialize else None
    gather = StagingSource(
        str(partial), offsets, sizes, image_channels, channels, opts.materialize, staging, opts.seed, cameras
    )
    return content, gather


def _write_shards(
    partial: Path,
    content: StoreContent,
    gather: Source,
    plan_key: str,
    request: WriteRequest,
    profile: Profile,
) -> tuple[dict[str, Any], dict[str, dict[str, list[Any]]]]:
    """Phase 2: every shard (and the backend's metadata). Returns (file records, chunk index)."""
    files = {
        rel: file_record(partial / rel)
        for rel in content.backend.write_metadata(partial, content.splits, content.spec())
    }
    spec, per = content.spec(), content.layout.shard_chunks
    jobs = [
        ShardJob(
            str(partial), content.backend, info, s, spec, gather, f"{plan_key}:{info.name}:{s}:{_TASK_FORMAT}"
        )
        for info in content.splits.values()
        for s in range(-(-info.n_chunks // per))
    ]
    profile.wall.lap("metadata")
    index: dict[str, dict[str, list[Any]]] = {name: {CHUNK_CHECKSUM: []} for name in content.splits}
    write_shards(
        write_shard_task, jobs, [job.info.name for job in jobs], request, partial, profile, files, index,
        _Release(jobs),
    )  # fmt: skip
    return files, index


class _Release:
    """Frees the staged rows of the shards written so far, a few times a split (``release(k)``: jobs
    ``[0, k)`` are done; their runs are never read again). Each image's run since the last release is
    one hole in its staging file, so a release is one call per image, and the holes are large enough to
    free whole blocks: the staging shrinks as the store grows (peak disk about one copy of the rays)."""

    def __init__(self, jobs: Sequence[ShardJob], per_split: int = 8) -> None:
        self.jobs, self.released = jobs, 0
        self.step = max(1, -(-len(jobs) // max(1, per_split * len({job.info.name for job in jobs}))))

    def __call__(self, done: int) -> None:
        if done - self.released < self.step and done < len(self.jobs):
            return
        finished = self.jobs[self.released : done]
        for name in dict.fromkeys(job.info.name for job in finished):  # a split's jobs: in shard order
            mine = [job for job in finished if job.info.name == name]
            mine[0].source.release(mine[0].info, _job_rays(mine[0])[0], _job_rays(mine[-1])[1])
        self.released = done


def _job_chunks(job: ShardJob) -> tuple[int, int]:
    """``[first, last)``: the chunks of the job's shard."""
    first = job.shard * job.spec.layout.shard_chunks
    return first, min(first + job.spec.layout.shard_chunks, job.info.n_chunks)


def _job_rays(job: ShardJob) -> tuple[int, int]:
    """``[start, stop)``: the rays of the job's shard."""
    first, last = _job_chunks(job)
    return job.info.chunk_range(first)[0], job.info.chunk_range(last - 1)[1]


def copy_rays(store: RayStore, request: WriteRequest, with_pids: bool) -> RayStore:
    """A rays-layout copy of a rays-layout store, shard by shard from its chunks (the caller holds
    the destination's writer lock; ``raykit.store.write.copy_store``)."""
    profile = Profile()
    layout = options = request.spec  # the source's, in the destination's backend
    splits = store.splits
    if with_pids:
        splits = {name: dataclasses.replace(info, pids="stored") for name, info in splits.items()}
    plan = {
        "copy_of": store.fingerprint,
        "backend": options.backend,
        "layout": layout.to_dict(),
        "with_pids": with_pids,
    }
    if store.legacy:  # format 1 or 2, copied as the current format (its pids stored, checksums anew)
        plan["upgrade_to"] = FORMAT_VERSION
    partial, plan_key = open_partial(request, plan)
    write_camera_table(store.cameras, partial)
    backend = backend_named(options.backend)
    source = store.manifest["source"]
    fields = tuple(store.fields.values())
    content = StoreContent(
        backend, layout, source, store.scene, splits, fields, store.cameras, request.points
    )
    files, index = _write_shards(partial, content, StoreSource(store.url), plan_key, request, profile)
    return commit(partial, request, content, files, index, profile)
