"""What every payload writer shares, whatever the layout: its plan and the partial directory the
plan keys (``open_write``, ``open_partial``), what staging decides (``staged_payload``: splits, camera
table, fields), its tasks on any executor (``task_runner``), its shard phase (``write_shards``), the
last phase (``commit``: ``index.json``, the points, the manifest, the rename to ``dst``) and where
its time goes (``PhaseClock``).

Timing (``raykit convert --profile``, ``benchmarks/bench_convert.py``): each task times its phases with
a ``PhaseClock`` and returns the seconds with its result; the writer sums them per kind of task and
laps its own wall clock per step. A finished write adds its profile to the active ``raykit.recorder``
(a context variable: concurrent writes do not mix) and logs it at DEBUG level.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

import raykit.recorder
from raykit.errors import ConfigError, SourceError
from raykit.fileio import atomic_write_json, fsync_path
from raykit.progress import progress as progress_bar
from raykit.store.components import FRAMES_FILE, ComponentInfo, write_component
from raykit.store.files import (
    CHUNK_CHECKSUM,
    OVERWRITE_HINT,
    check_destination,
    content_fingerprint,
    file_record,
    json_digest,
    prepare_partial,
)
from raykit.store.schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    POINTS_FILE,
    FieldSpec,
    ImageRecord,
    SceneInfo,
    SparsePoints,
    SplitInfo,
    points_digest,
    points_entry,
)
from raykit.store.spec import RAYS_LAYOUT, StoreSpec, holds_images
from raykit.store.table import build_camera_table, write_camera_table, write_parquet
from raykit.version import __version__

if TYPE_CHECKING:
    from raykit.store.reader import RayStore

__all__ = [
    "SHUFFLED_SPLITS",
    "PhaseClock",
    "TaskRunner",
    "commit",
    "commit_store",
    "format_phases",
    "open_partial",
    "open_write",
    "record_plan",
    "split_infos",
    "staged_payload",
    "task_runner",
    "write_extras",
    "write_shards",
]


J = TypeVar("J")


R = TypeVar("R")


SHUFFLED_SPLITS = frozenset({"train"})


_log = logging.getLogger("raykit.store.write")


# -- where the time goes -------------------------------------------------------------------------
class PhaseClock:
    """Seconds spent per phase, by laps: ``lap(name)`` charges the time since the last lap. A task
    times its phases with one; a writer laps its own wall clock with one and sums its tasks' seconds
    per kind of task and phase into ``tasks`` (``absorb``), whichever worker ran them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.tasks: dict[str, dict[str, float]] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now

    def absorb(self, kind: str, results: list[dict[str, Any]]) -> None:
        totals = self.tasks.setdefault(kind, {})
        for res in results:
            for phase, seconds in res.pop("seconds", {}).items():
                totals[phase] = totals.get(phase, 0.0) + seconds

    def finish(self, dst: Path) -> None:
        """Add the times to the active ``raykit.recorder`` of this thread or task (scopes ``write``: the
        writer's wall time per step; ``write.stage``, ``write.shard``: its tasks' time per phase, summed
        over tasks, whichever worker ran them) and log them at DEBUG level on ``raykit.store.write``."""
        scopes = {"write": self.seconds, **{f"write.{kind}": phases for kind, phases in self.tasks.items()}}
        recorder = raykit.recorder.active()
        if recorder is not None:
            for scope, phases in scopes.items():
                for phase, seconds in phases.items():
                    recorder.add(scope, phase, seconds)
        _log.debug("wrote %s: %s", dst, json.dumps(scopes))


def format_phases(phases: Mapping[str, Mapping[str, float]], seconds: float | None = None) -> list[str]:
    """Human lines for a recorder's writer phases (``PhaseClock.finish``): wall time per step, then
    task time per phase."""
    lines = ["wall s   " + "  ".join(f"{k} {v:.2f}" for k, v in phases.get("write", {}).items())]
    for kind, label in (("write.stage", "decode tasks"), ("write.shard", "shard tasks")):
        if phases.get(kind):
            total = sum(phases[kind].values())
            parts = "  ".join(f"{k} {v:.2f}" for k, v in sorted(phases[kind].items(), key=lambda kv: -kv[1]))
            lines.append(f"{label} (summed over workers, {total:.2f} s): {parts}")
    if seconds is not None:
        outside = seconds - sum(phases.get("write", {}).values())
        lines.append(
            f"total {seconds:.2f} s, of which outside the writer (parsing, probing, start-up) {outside:.2f} s"
        )
    return lines


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


def open_partial(
    dst: Path, plan: dict[str, Any], points: SparsePoints | None, overwrite: bool
) -> tuple[Path, str]:
    """The ``<dst>.partial`` directory of ``plan`` and the plan's key: kept when its ``plan.json``
    matches (resume), replaced otherwise; refuses to replace a store (unless ``overwrite``) or a
    non-store directory (``raykit.store.files``). The ``points`` join the plan (only then: plans,
    and resume keys, of stores without points are unchanged)."""
    if points is not None:
        plan["points"] = points_digest(points)
    key = json_digest(plan)
    check_destination(dst, overwrite)
    return prepare_partial(dst, plan, key), key


def open_write(
    dst: Path,
    records: Sequence[ImageRecord],
    scene: SceneInfo,
    spec: StoreSpec,
    source: Mapping[str, Any],
    points: SparsePoints | None,
    overwrite: bool,
) -> tuple[Path, str, list[dict[str, Any]]]:
    """``open_partial`` for a write of ``records`` (in table order) as ``spec``: the partial directory,
    the plan's key and each record's part of the plan (``record_plan``: it keys the record's task)."""
    records_plan = [record_plan(r) for r in records]
    plan = {
        "format_version": FORMAT_VERSION,
        "backend": spec.backend,
        "layout": spec.to_dict(),  # the kind, codecs and train order: a .partial of another is discarded
        "with_pids": spec.with_pids,
        "scene": scene.to_dict(),
        "records": records_plan,
        "source": dict(source),
    }
    return (*open_partial(dst, plan, points, overwrite), records_plan)


def staged_payload(
    records: Sequence[ImageRecord],
    staged: list[dict[str, Any]],
    spec: StoreSpec,
    partial: Path,
    profile: PhaseClock,
) -> tuple[dict[str, SplitInfo], pa.Table, dict[str, FieldSpec], str]:
    """What the stage tasks' results ``staged`` (per record: channels, source SHA-256, pixel CRC)
    decide for a write as ``spec``: its splits, its camera table (written into ``partial``), its
    stored fields in order (rgba, pid, and origins/directions when materialised) and the source
    fingerprint."""
    profile.absorb("stage", staged)
    profile.lap("stage")
    splits = split_infos(records, spec.chunk_rays, "stored" if spec.with_pids else "derived", spec.kind)
    alpha = [s["channels"] == 4 for s in staged]
    shuffled = {name for name, info in splits.items() if info.shuffled}
    table = build_camera_table(records, alpha, [s["source_sha256"] for s in staged], shuffled)
    write_camera_table(table, partial)
    profile.lap("camera_table")
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


# -- tasks ---------------------------------------------------------------------------------------
# ``run(fn, jobs, desc)``: the results of ``fn`` over ``jobs`` in order, as they finish
TaskRunner = Callable[[Callable[[Any], Any], Sequence[Any], str], Iterator[Any]]


def task_runner(executor: concurrent.futures.Executor | None, progress: bool) -> TaskRunner:
    """Runs a write's tasks on ``executor`` (None: in this process), with a progress bar if asked."""

    def run(fn: Callable[[J], R], jobs: Sequence[J], desc: str) -> Iterator[R]:
        results: Iterable[R] = map(fn, jobs) if executor is None else executor.map(fn, jobs)
        yield from progress_bar(results, total=len(jobs), desc=desc, disable=not progress, unit="task")

    return run


def in_process(executor: concurrent.futures.Executor | None) -> bool:
    """True when the executor runs tasks in this process (None: serially; or a thread pool)."""
    return executor is None or isinstance(executor, concurrent.futures.ThreadPoolExecutor)


def write_shards(
    run: TaskRunner,
    fn: Callable[[Any], dict[str, Any]],
    jobs: Sequence[Any],
    partial: Path,
    profile: PhaseClock,
    files: dict[str, Any],
    index: dict[str, dict[str, list[Any]]],
    done: Callable[[int], None] | None = None,
) -> None:
    """The shard phase of either layout: run ``fn`` (``staging.write_shard_task``) over ``jobs``
    (``ShardJob``), fsync their files, and add each result's file records (``"files"``) to ``files``
    and its ``index.json`` entries (``"index"``: key -> values, in job order) to ``index[job.split]``.
    ``done(k)`` is called as results come in (in job order): jobs ``[0, k)`` have finished and recorded."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as syncing:
        # Shard files reach the disk while later shards are being encoded (fsync mostly waits on I/O)
        synced: list[concurrent.futures.Future[None]] = []
        results: list[dict[str, Any]] = []
        for res in run(fn, jobs, "write shards"):
            synced += [syncing.submit(fsync_path, partial / rel) for rel in res["files"]]
            results.append(res)
            if done is not None:
                done(len(results))
        profile.lap("shards")
        for future in synced:
            future.result()
        shard_dirs = {(partial / rel).parent for res in results for rel in res["files"]}
        list(syncing.map(fsync_path, sorted(shard_dirs)))
    profile.absorb("shard", results)
    profile.lap("fsync")
    for job, res in zip(jobs, results, strict=True):
        files.update(res["files"])
        for key, values in res["index"].items():
            index[job.split].setdefault(key, []).extend(values)


# -- the commit ----------------------------------------------------------------------------------
def commit(
    partial: Path,
    dst: Path,
    overwrite: bool,
    spec: StoreSpec,
    source: Mapping[str, Any],
    scene: SceneInfo,
    splits: Mapping[str, SplitInfo],
    fields: Mapping[str, FieldSpec],
    table: Any,
    points: SparsePoints | None,
    files: dict[str, Any],
    index: Mapping[str, Mapping[str, Any]],
    profile: PhaseClock,
    extras: tuple[Sequence[ImageRecord], Sequence[ComponentInfo], RayStore | None] = ((), (), None),
) -> RayStore:
    """The last phase of a write as ``spec`` from ``source`` (its description), its payload written
    (``files``: relative path -> record; ``table``: the camera table, a ``pyarrow.Table``, written
    already): the components and per-frame metadata (``extras``: ``write_extras``' records,
    components and source store), ``index.json``, the ``points``, the manifest, the rename to
    ``dst``; ``profile`` gets its laps and is finished. Returns the store opened."""
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
    profile.lap("index_manifest")
    store = commit_store(partial, dst, overwrite)
    profile.lap("commit")
    profile.finish(dst)
    return store


def write_extras(
    partial: Path,
    table: Any,
    backend: str,
    records: Sequence[ImageRecord],
    components: Sequence[ComponentInfo],
    extras_from: RayStore | None,
    files: dict[str, Any],
) -> dict[str, Any]:
    """Write the ``components`` of ``records`` and their per-frame metadata into ``partial`` (or, for a
    copy, those of the store ``extras_from``); their file records go into ``files``. ``table``: the
    camera table written. Returns the manifest keys that describe them (none when there are none:
    such a store's bytes are those of a store without)."""
    names = table.column("name").to_pylist()
    columns = ("split", "height", "width")
    rows = zip(names, *(table.column(k).to_pylist() for k in columns), strict=True)
    images = [(n, s, int(h), int(w)) for n, s, h, w in rows]
    src = extras_from
    wanted = (
        list(components)
        if src is None
        else [dataclasses.replace(i, index="") for i in src.components.values()]
    )
    by_name = {r.name: r for r in records}
    extra: dict[str, Any] = {}
    for info in wanted:
        if src is not None:
            load = functools.partial(_copied_component, src, info.name, names)
        else:
            missing = [n for n in names if info.name not in by_name[n].components]
            if missing:
                raise SourceError(
                    f"image {missing[0]!r}: no {info.name} ({len(missing)} of {len(names)} images have none)"
                )
            load = functools.partial(_record_component, by_name, info.name, names)
        done, written = write_component(partial, backend, info, images, load)
        files.update(written)
        extra.setdefault("components", {})[info.name] = done.to_dict()
    if src is not None:
        frames = {n: src.frame_metadata(n) for n in names}
    else:
        frames = {n: dict(by_name[n].metadata) for n in names if n in by_name}
    frames = {k: v for k, v in frames.items() if v}
    if frames:
        atomic_write_json(partial / FRAMES_FILE, frames)
        files[FRAMES_FILE] = file_record(partial / FRAMES_FILE)
        extra["frame_metadata"] = {"path": FRAMES_FILE, "n_frames": len(frames)}
    return extra


def _record_component(records: Mapping[str, ImageRecord], name: str, names: Sequence[str], row: int) -> Any:
    return records[names[row]].components[name]()


def _copied_component(store: Any, name: str, names: Sequence[str], row: int) -> Any:
    return store.read_component(name, names[row])


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
