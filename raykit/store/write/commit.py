"""What every payload writer shares, whatever the layout: a write in progress (``Partial``), its plan
and the partial directory the plan keys (``open_write``, ``open_partial``), what staging decides
(``staged_payload``: splits, camera table, fields), the shard phase (``write_shards``, its tasks:
``raykit.store.write.tasks``) and the last phase (``commit``: ``index.json``, the points, the manifest,
the rename to ``dst``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from raykit.errors import ConfigError
from raykit.fileio import atomic_write_json, fsync_path, replace_dir
from raykit.store.components import ComponentInfo
from raykit.store.files import (
    CHUNK_CHECKSUM,
    OVERWRITE_HINT,
    check_destination,
    content_fingerprint,
    file_record,
    json_digest,
    prepare_partial,
)
from raykit.store.points import POINTS_FILE, SparsePoints, points_digest, points_entry
from raykit.store.schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    FieldSpec,
    ImageRecord,
    SceneInfo,
    SplitInfo,
)
from raykit.store.spec import RAYS_LAYOUT, StoreSpec, holds_images
from raykit.store.table import build_camera_table, write_camera_table, write_parquet
from raykit.store.write.components import write_extras
from raykit.store.write.tasks import PhaseClock, ShardJob, TaskRunner, task_runner, write_shard_task
from raykit.version import __version__

if TYPE_CHECKING:
    from raykit.store.reader import RayStore

__all__ = [
    "SHUFFLED_SPLITS",
    "Partial",
    "PayloadWrite",
    "commit",
    "commit_store",
    "open_partial",
    "open_write",
    "record_plan",
    "split_infos",
    "staged_payload",
    "write_shards",
]


SHUFFLED_SPLITS = frozenset({"train"})


# -- the plan ------------------------------------------------------------------------------------
def record_plan(rec: ImageRecord) -> dict[str, Any]:
    """The JSON of an image record that keys its staging task and the whole write's plan."""
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


def split_infos(
    records: Sequence[ImageRecord], chunk_rays: int, pids: str = "derived", layout: str = RAYS_LAYOUT
) -> dict[str, SplitInfo]:
    """Every split's rays, images and first pid, from records in table order; ``pids``: whether the
    splits' pids are ``"derived"`` from their order at read time (format 3) or ``"stored"``; an
    ``IMAGES_LAYOUT`` split is never shuffled (its loaders shuffle)."""
    infos: dict[str, SplitInfo] = {}
    pid = 0
    for rec in records:
        n = rec.camera.width * rec.camera.height
        old = infos.get(rec.split)
        if old is None:
            shuffled = rec.split in SHUFFLED_SPLITS and not holds_images(layout)
            infos[rec.split] = SplitInfo(rec.split, n, 1, chunk_rays, shuffled, pid, pids, layout)
        else:
            infos[rec.split] = dataclasses.replace(old, n_rays=old.n_rays + n, n_images=old.n_images + 1)
        pid += n
    return infos


@dataclass
class Partial:
    """One write in progress, from its plan to its commit: the store ``dst`` written as ``spec`` in
    ``root`` (``<dst>.partial``, kept for a rerun while its plan's ``key`` matches), replacing a store
    there only with ``overwrite``, with the sparse ``points``; its tasks run by ``run`` and timed by
    ``profile``; the records of the files written so far (``files``: relative path -> record) and the
    ``index.json`` entries (``index``: split -> key -> values)."""

    dst: Path
    root: Path
    key: str
    spec: StoreSpec
    overwrite: bool
    points: SparsePoints | None
    run: TaskRunner
    profile: PhaseClock
    files: dict[str, Any] = dataclasses.field(default_factory=dict)
    index: dict[str, dict[str, list[Any]]] = dataclasses.field(default_factory=dict)


def open_partial(
    dst: Path,
    plan: dict[str, Any],
    spec: StoreSpec,
    points: SparsePoints | None,
    *,
    executor: concurrent.futures.Executor | None,
    progress: bool,
    overwrite: bool,
) -> Partial:
    """The write of ``plan`` as ``spec`` in ``<dst>.partial``: the folder kept when its ``plan.json``
    matches (resume), replaced otherwise; refuses to replace a store (unless ``overwrite``) or a
    non-store directory (``raykit.store.files``). The ``points`` join the plan (only then: plans,
    and resume keys, of stores without points are unchanged)."""
    profile = PhaseClock()
    if points is not None:
        plan["points"] = points_digest(points)
    key = json_digest(plan)
    check_destination(dst, overwrite)
    root = prepare_partial(dst, plan, key)
    return Partial(dst, root, key, spec, overwrite, points, task_runner(executor, progress), profile)


@dataclass(frozen=True)
class PayloadWrite:
    """A write of ``records`` (in table order) at ``dst`` from ``source`` (its description), the caller
    holding its writer lock: what every layout's payload writer takes (``write_rays``,
    ``write_images``); ``components`` and ``extras_from`` go to ``write_extras``."""

    dst: Path
    records: Sequence[ImageRecord]
    scene: SceneInfo
    source: Mapping[str, Any]
    points: SparsePoints | None
    executor: concurrent.futures.Executor | None
    progress: bool
    overwrite: bool
    components: Sequence[ComponentInfo] = ()
    extras_from: RayStore | None = None

    def extras(self) -> tuple[Sequence[ImageRecord], Sequence[ComponentInfo], RayStore | None]:
        """``commit``'s ``extras``: the records, their components and the store they are copied from."""
        return self.records, self.components, self.extras_from


def open_write(job: PayloadWrite, spec: StoreSpec) -> tuple[Partial, list[dict[str, Any]]]:
    """``open_partial`` for ``job`` as ``spec``, and each record's part of the plan (``record_plan``:
    it keys the record's task)."""
    records_plan = [record_plan(r) for r in job.records]
    plan = {
        "format_version": FORMAT_VERSION,
        "backend": spec.backend,
        "layout": spec.to_dict(),  # the kind, codecs and train order: a .partial of another is discarded
        "with_pids": spec.with_pids,
        "scene": job.scene.to_dict(),
        "records": records_plan,
        "source": dict(job.source),
    }
    tasks: dict[str, Any] = {"executor": job.executor, "progress": job.progress, "overwrite": job.overwrite}
    return open_partial(job.dst, plan, spec, job.points, **tasks), records_plan


def staged_payload(
    w: Partial, records: Sequence[ImageRecord], staged: list[dict[str, Any]]
) -> tuple[dict[str, SplitInfo], pa.Table, dict[str, FieldSpec], str]:
    """What the stage tasks' results ``staged`` (per record: channels, source SHA-256, pixel CRC)
    decide for the write ``w``: its splits, its camera table (written), its stored fields in order
    (rgba, pid, and origins/directions when materialised) and the source fingerprint."""
    spec = w.spec
    w.profile.absorb("stage", staged)
    w.profile.lap("stage")
    splits = split_infos(records, spec.chunk_rays, "stored" if spec.with_pids else "derived", spec.kind)
    alpha = [s["channels"] == 4 for s in staged]
    shuffled = {name for name, info in splits.items() if info.shuffled}
    table = build_camera_table(records, alpha, [s["source_sha256"] for s in staged], shuffled)
    write_camera_table(table, w.root)
    w.profile.lap("camera_table")
    fields = [FieldSpec("rgba", "uint8", 4 if any(alpha) else 3), FieldSpec("pid", "uint32", 0)]
    if spec.materialize:
        fields += [FieldSpec("origins", spec.materialize, 3), FieldSpec("directions", spec.materialize, 3)]
    # the source fingerprint: every image's name, source file SHA-256, decoded shape and pixel CRC-32C
    fingerprint = json_digest(
        [
            [r.name, s["source_sha256"], [r.camera.height, r.camera.width, s["channels"]], s["pixels_crc32c"]]
            for r, s in zip(records, staged, strict=True)
        ]
    )
    return splits, table, {f.name: f for f in fields}, fingerprint


# -- the shard phase ------------------------------------------------------------------------------
def write_shards(
    w: Partial,
    jobs: Sequence[ShardJob],
    done: Callable[[int], None] | None = None,
    ran: Iterable[dict[str, Any]] | None = None,
) -> None:
    """The shard phase of either layout: run ``write_shard_task`` over ``jobs`` (or take their results
    from ``ran``, in order: a pipeline running them), fsync their files,
    and add each result's file records (``"files"``) to ``w.files`` and its ``index.json`` entries
    (``"index"``: key -> values, in job order) to ``w.index[job.split]``. ``done(k)`` is called as
    results come in (in job order): jobs ``[0, k)`` have finished and recorded."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as syncing:
        # Shard files reach the disk while later shards are being encoded (fsync mostly waits on I/O)
        synced: list[concurrent.futures.Future[None]] = []
        results: list[dict[str, Any]] = []
        for res in w.run(write_shard_task, jobs, "write shards") if ran is None else ran:
            synced += [syncing.submit(fsync_path, w.root / rel) for rel in res["files"]]
            results.append(res)
            if done is not None:
                done(len(results))
        w.profile.lap("shards")
        for future in synced:
            future.result()
        shard_dirs = {(w.root / rel).parent for res in results for rel in res["files"]}
        list(syncing.map(fsync_path, sorted(shard_dirs)))
    w.profile.absorb("shard", results)
    w.profile.lap("fsync")
    for job, res in zip(jobs, results, strict=True):
        w.files.update(res["files"])
        for key, values in res["index"].items():
            w.index.setdefault(job.split, {}).setdefault(key, []).extend(values)


# -- the commit ----------------------------------------------------------------------------------
def commit(
    w: Partial,
    source: Mapping[str, Any],
    scene: SceneInfo,
    splits: Mapping[str, SplitInfo],
    fields: Mapping[str, FieldSpec],
    table: Any,
    extras: tuple[Sequence[ImageRecord], Sequence[ComponentInfo], RayStore | None] = ((), (), None),
) -> RayStore:
    """The last phase of the write ``w`` from ``source`` (its description), its payload written
    (``table``: the camera table, a ``pyarrow.Table``, written already): the components and per-frame
    metadata (``extras``: ``write_extras``' records, components and source store), ``index.json``,
    the points, the manifest, the rename to ``dst``; its profile gets its laps and is finished.
    Returns the store opened."""
    partial, spec, points, files, index = w.root, w.spec, w.points, w.files, w.index
    extra = write_extras(partial, table, spec.backend, *extras, files)
    atomic_write_json(partial / "index.json", index)
    written = ["cameras.parquet", "index.json"]
    if points is not None:
        write_parquet(points.to_table(), partial / POINTS_FILE)
        written.append(POINTS_FILE)
    for rel in written:
        files[rel] = file_record(partial / rel)
    field_records = {name: f.to_dict() for name, f in fields.items()}
    hashed = {k: v.fingerprint_dict() for k, v in splits.items()}
    crcs = {k: v[CHUNK_CHECKSUM] for k, v in index.items()}
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "raykit_version": __version__,
        "backend": spec.backend,
        "layout": spec.to_dict(),
        "source": dict(source),
        "scene": scene.to_dict(),
        "splits": {k: v.to_dict() for k, v in splits.items()},
        "fields": field_records,
        "n_images": table.num_rows,
        "files": dict(sorted(files.items())),
        **({"points": points_entry(points)} if points is not None else {}),
        "content_fingerprint": content_fingerprint(table, scene.to_dict(), hashed, field_records, crcs),
        **extra,
    }
    manifest["manifest_digest"] = json_digest(manifest)
    atomic_write_json(partial / "manifest.json", manifest)
    w.profile.lap("index_manifest")
    store = commit_store(partial, w.dst, w.overwrite)
    w.profile.lap("commit")
    w.profile.finish(w.dst)
    return store


def commit_store(partial: Path, dst: Path, overwrite: bool) -> RayStore:
    """Remove the write's scratch from ``partial`` (staging, task records, plan, temporary files),
    rename it to ``dst`` (replacing a store there only with ``overwrite``) and open it."""
    for name in ("staging", "tasks"):
        shutil.rmtree(partial / name, ignore_errors=True)
    (partial / "plan.json").unlink(missing_ok=True)
    for path in partial.rglob(".*.tmp"):
        path.unlink()  # temporary files of writers killed mid-write (the atomic-write prefix and suffix)
    for path in partial.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # temporary files are created 0600
    if not overwrite and (dst / "manifest.json").exists():
        raise ConfigError(f"{dst}: a store already exists there ({OVERWRITE_HINT})")
    replace_dir(partial, dst)
    from raykit.store.reader import open_store

    return open_store(str(dst))
