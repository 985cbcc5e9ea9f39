"""The rays payload writer (``StoreSpec.kind == "rays"``), called by ``raykit.store.write_store``, and
the chunk-by-chunk copy of a rays store (``copy_rays``).

Its phases in ``<dst>.partial/`` (decode images into staging, one task per shard, commit) and how a
rerun resumes are docs/format.md's "Commit protocol". The stage task and the gather of a shard's
rays live in ``staging.py``; the plan, the shard task and phase and the commit in ``commit.py``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raykit.store.backends import Backend, backend_named
from raykit.store.files import CHUNK_CHECKSUM, chunk_checksum, json_digest, local_files_bytes, write_files
from raykit.store.order import TRAIN_ORDER
from raykit.store.schema import FORMAT_VERSION, FieldSpec, SplitInfo
from raykit.store.spec import StoreSpec
from raykit.store.table import CameraTable, write_camera_table
from raykit.store.write.commit import (
    SHUFFLED_SPLITS,
    Partial,
    PayloadWrite,
    commit,
    open_partial,
    open_write,
    staged_payload,
    write_shards,
)
from raykit.store.write.gather import StagingSource
from raykit.store.write.staging import (
    ImageJob,
    base_indices,
    stage_image,
    staging_area,
)
from raykit.store.write.tasks import PhaseClock, ShardJob

if TYPE_CHECKING:
    import numpy as np

    from raykit.store.reader import RayStore

__all__ = ["copy_rays", "encode_ray_shard", "shard_rays", "write_rays"]


# Part of every shard task's resume key: records of an older task result layout are redone, not reused.
_TASK_FORMAT = 4  # 3: format-3 stores (pids derived, checked apart); 4: checksums in "index"


@dataclasses.dataclass(frozen=True)
class CopySource:
    """Rays gathered from another committed store (``raykit copy``)."""

    url: str

    def gather(
        self, info: SplitInfo, start: int, stop: int, clock: PhaseClock | None = None, pids: bool = True
    ) -> dict[str, np.ndarray]:
        from raykit.store.reader import open_store

        raw = open_store(self.url).read(info.name, start, stop)
        if clock is not None:
            clock.lap("gather")
        return {"rgba": raw.rgba, **({"pid": raw.pid} if pids else {}), **raw.extra}

    def release(self, info: SplitInfo, start: int, stop: int) -> None:
        """Nothing: the source store stays as it is."""


Source = StagingSource | CopySource


def shard_rays(info: SplitInfo, spec: StoreSpec, shard: int) -> tuple[range, int, int]:
    """The chunks of shard ``shard`` of split ``info`` and its rays ``[start, stop)``."""
    first = shard * spec.shard_chunks
    chunks = range(first, min(first + spec.shard_chunks, info.n_chunks))
    return chunks, info.chunk_range(chunks[0])[0], info.chunk_range(chunks[-1])[1]


def encode_ray_shard(
    backend: Backend,
    info: SplitInfo,
    shard: int,
    fields: Mapping[str, FieldSpec],
    spec: StoreSpec,
    source: Source,
    clock: PhaseClock,
) -> tuple[dict[str, bytes | list[bytes]], dict[str, list[Any]]]:
    """A ``ShardJob``'s ``encode``: shard ``shard`` of split ``info`` (its stored ``fields``) from
    ``source``'s rays, its files and ``index.json`` entries (the chunk checksums and the backend's)."""
    chunks, start, stop = shard_rays(info, spec, shard)
    stored = tuple(fields)
    data = source.gather(info, start, stop, clock, pids="pid" in stored)
    data = {name: data[name] for name in stored}
    # The chunk checksum covers every stored field but the pids, which (when stored) have their own,
    # so a copy with or without stored pids keeps its checksums and fingerprint.
    summed = [name for name in stored if name != "pid"]
    pid_key = f"pid_{CHUNK_CHECKSUM}"
    index: dict[str, list[Any]] = {CHUNK_CHECKSUM: [], **({pid_key: []} if "pid" in stored else {})}
    for c in chunks:
        lo, hi = (b - start for b in info.chunk_range(c))
        chunk = {name: data[name][lo:hi] for name in stored}
        index[CHUNK_CHECKSUM].append(chunk_checksum(chunk, summed, CHUNK_CHECKSUM))
        if "pid" in stored:
            index[pid_key].append(chunk_checksum(chunk, ["pid"], CHUNK_CHECKSUM))
    clock.lap("checksum")
    files, entries = backend.encode_shard(info, shard, data, fields, spec)
    clock.lap("compress")
    return files, {**index, **entries}


def write_rays(job: PayloadWrite, spec: StoreSpec) -> RayStore:
    """Write a rays-layout store of ``job``: stage every image, write the shards, commit; returns it
    opened."""
    spec = spec.replace(train_order=TRAIN_ORDER)
    w, records_plan = open_write(job, spec)
    records, executor = job.records, job.executor
    w.profile.lap("plan")
    staged_bytes = sum(r.camera.width * r.camera.height * 4 for r in records)
    partial = str(w.root)
    staging = staging_area(partial, executor, staged_bytes <= spec.memory_staging_bytes)
    with contextlib.closing(staging):
        keys = [json_digest([entry, spec.seed]) for entry in records_plan]
        stage_jobs = [
            ImageJob(partial, i, r, keys[i], staging, r.split in SHUFFLED_SPLITS, spec.seed)
            for i, r in enumerate(records)
        ]
        try:
            staged = list(w.run(stage_image, stage_jobs, "decode images"))
        finally:
            base_indices.cache_clear()  # the stage tasks' memoised index arrays
        splits, table, fields, fingerprint = staged_payload(w, records, staged)
        image_bytes = local_files_bytes([r.source_path for r in records])
        source = {**job.source, "fingerprint": fingerprint, "image_bytes": image_bytes}
        gather = StagingSource(
            partial,
            tuple(int(v) for v in table.column("pixel_offset").to_pylist()),
            tuple(r.camera.width * r.camera.height for r in records),
            tuple(int(s["channels"]) for s in staged),
            fields["rgba"].channels,
            spec.materialize,
            staging,
            spec.seed,
            # the cameras travel with the source (materialised rays need them): no task re-reads the table
            CameraTable.from_arrow(table) if spec.materialize else None,
        )
        _write_shards(w, splits, fields, gather)
        return commit(w, source, job.scene, splits, fields, table, job.extras())


def _write_shards(
    w: Partial, splits: Mapping[str, SplitInfo], fields: Mapping[str, FieldSpec], gather: Source
) -> None:
    """Phase 2 of the write ``w``: every shard of ``gather``'s rays, and the backend's metadata."""
    spec, backend = w.spec, backend_named(w.spec.backend)
    write_files(w.root, backend.rays_metadata(splits, fields, spec), w.files)
    shards = [(info, s) for info in splits.values() for s in range(-(-info.n_chunks // spec.shard_chunks))]
    jobs = [
        ShardJob(
            str(w.root),
            info.name,
            s,
            f"{w.key}:{info.name}:{s}:{_TASK_FORMAT}",
            functools.partial(encode_ray_shard, backend, info, s, info.stored_fields(fields), spec, gather),
        )
        for info, s in shards
    ]
    w.profile.lap("metadata")
    # Frees the staged rows of the shards written so far, a few times a split (``release(k)``: jobs
    # ``[0, k)`` are done; their runs are never read again). Each image's run since the last release is
    # one hole in its staging file, so a release is one call per image, and the holes are large enough
    # to free whole blocks: the staging shrinks as the store grows (peak disk about one copy of the rays).
    step = max(1, -(-len(jobs) // max(1, 8 * len(splits))))
    released = 0

    def release(done: int) -> None:
        nonlocal released
        if done - released < step and done < len(jobs):
            return
        finished = shards[released:done]
        for name in dict.fromkeys(info.name for info, _ in finished):  # a split's shards: in order
            mine, info = [s for i, s in finished if i.name == name], splits[name]
            gather.release(info, shard_rays(info, spec, mine[0])[1], shard_rays(info, spec, mine[-1])[2])
        released = done

    write_shards(w, jobs, release)


def copy_rays(
    store: RayStore,
    dst: Path,
    spec: StoreSpec,
    *,
    executor: concurrent.futures.Executor | None,
    progress: bool,
    overwrite: bool,
    with_pids: bool,
    extras_from: RayStore | None = None,
) -> RayStore:
    """A rays-layout copy of a rays-layout ``store`` written as ``spec`` (the source's, in the
    destination's backend), shard by shard from its chunks (the caller holds the destination's
    writer lock; ``raykit.store.write.copy_store``)."""
    splits = store.splits
    if with_pids:
        splits = {name: dataclasses.replace(info, pids="stored") for name, info in splits.items()}
    plan = {
        "copy_of": store.fingerprint,
        "backend": spec.backend,
        "layout": spec.to_dict(),
        "with_pids": with_pids,
    }
    if store.legacy:  # format 1 or 2, copied as the current format (its pids stored, checksums anew)
        plan["upgrade_to"] = FORMAT_VERSION
    points = store.sparse_points()
    w = open_partial(dst, plan, spec, points, executor=executor, progress=progress, overwrite=overwrite)
    write_camera_table(store.table_arrow, w.root)
    _write_shards(w, splits, store.fields, CopySource(store.url))
    source, table = store.manifest["source"], store.table_arrow
    return commit(w, source, store.scene, splits, store.fields, table, ((), (), extras_from))
