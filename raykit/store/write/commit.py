"""What every payload writer shares, whatever the layout: the partial directory its plan keys
(``open_partial``), its tasks on any executor (``run_tasks``), its shard phase (``write_shards``) and
the last phase (``commit``: ``index.json``, the points, the manifest, the rename to ``dst``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from raykit.errors import ConfigError, SourceError
from raykit.fileio import atomic_write_json, fsync_path
from raykit.progress import progress as progress_bar
from raykit.store.backends import Backend, PayloadSpec, backend_named
from raykit.store.components import FRAMES_FILE, write_component, write_frame_metadata
from raykit.store.files import (
    CHUNK_CHECKSUM,
    OVERWRITE_HINT,
    check_destination,
    content_fingerprint,
    file_record,
    json_digest,
    prepare_partial,
)
from raykit.store.phases import Profile
from raykit.store.points import POINTS_FILE, SparsePoints, points_digest, points_entry
from raykit.store.schema import FORMAT_NAME, FORMAT_VERSION, FieldSpec, ImageRecord, SceneInfo, SplitInfo
from raykit.store.spec import StoreSpec
from raykit.store.table import build_camera_table, write_camera_table, write_parquet
from raykit.store.write.job import WriteRequest, field_specs
from raykit.version import __version__

if TYPE_CHECKING:
    from raykit.store.reader import RayStore

__all__ = [
    "StoreContent",
    "commit",
    "commit_store",
    "in_process",
    "open_partial",
    "run_tasks",
    "source_fingerprint",
    "staged_content",
    "write_index_and_manifest",
    "write_shards",
]


J = TypeVar("J")


R = TypeVar("R")


@dataclass(frozen=True)
class StoreContent:
    """What a write's manifest describes besides its files: backend, layout, source description,
    scene, splits, fields, the camera table (a ``pyarrow.Table``) and the sparse points."""

    backend: Backend
    layout: StoreSpec
    source: Mapping[str, Any]
    scene: SceneInfo
    splits: Mapping[str, SplitInfo]
    fields: Sequence[FieldSpec]
    table: Any  # pyarrow.Table
    points: SparsePoints | None = None

    def spec(self) -> PayloadSpec:
        """What the backend needs to encode this content's rays (``PayloadSpec``)."""
        return PayloadSpec.of({f.name: f for f in self.fields}, self.layout, self.splits)

    def manifest(
        self,
        files: Mapping[str, Any],
        index: Mapping[str, Mapping[str, Any]],
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The manifest of this content with ``files`` (relative path -> record), ``index.json`` and
        the optional keys ``extra`` (``components``, ``frame_metadata``)."""
        splits = {k: v.to_dict() for k, v in self.splits.items()}
        hashed = {k: v.fingerprint_dict() for k, v in self.splits.items()}
        fields = {spec.name: spec.to_dict() for spec in self.fields}
        crcs = {k: v[CHUNK_CHECKSUM] for k, v in index.items()}
        manifest: dict[str, Any] = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "raykit_version": __version__,
            "backend": self.backend.name,
            "layout": self.layout.to_dict(),
            "source": dict(self.source),
            "scene": self.scene.to_dict(),
            "splits": splits,
            "fields": fields,
            "n_images": self.table.num_rows,
            "files": dict(sorted(files.items())),
            **({"points": points_entry(self.points)} if self.points is not None else {}),
            "content_fingerprint": content_fingerprint(
                self.table, self.scene.to_dict(), hashed, fields, crcs
            ),
            **(extra or {}),
        }
        manifest["manifest_digest"] = json_digest(manifest)
        return manifest


def staged_content(
    request: WriteRequest,
    partial: Path,
    layout: StoreSpec,
    splits: Mapping[str, SplitInfo],
    staged: Sequence[Mapping[str, Any]],
    profile: Profile,
    **source: Any,
) -> StoreContent:
    """The content of a write whose images are ``staged`` (each one's stage or encode task result, in
    table order): its camera table, written into ``partial``; the request's source description with
    the source fingerprint and the entries ``source``; the fields of the images' channels."""
    records = request.records
    alpha = [s["channels"] == 4 for s in staged]
    shuffled = {name for name, info in splits.items() if info.shuffled}
    table = build_camera_table(records, alpha, [s["source_sha256"] for s in staged], shuffled)
    write_camera_table(table, partial)
    profile.wall.lap("camera_table")
    source = {**request.source, "fingerprint": source_fingerprint(records, staged), **source}
    fields = field_specs(4 if any(alpha) else 3, layout.materialize)
    backend = backend_named(request.spec.backend)
    return StoreContent(backend, layout, source, request.scene, splits, fields, table, request.points)


def open_partial(request: WriteRequest, plan: dict[str, Any]) -> tuple[Path, str]:
    """The ``<dst>.partial`` directory of ``plan`` and the plan's key: kept when its ``plan.json``
    matches (resume), replaced otherwise; refuses to replace a store (unless ``overwrite``) or a
    non-store directory (``raykit.store.files``). The request's points join the plan (only
    then: plans, and resume keys, of stores without points are unchanged)."""
    if request.points is not None:
        plan["points"] = points_digest(request.points)
    key = json_digest(plan)
    check_destination(request.dst, request.overwrite)
    return prepare_partial(request.dst, plan, key), key


def in_process(executor: concurrent.futures.Executor | None) -> bool:
    """True when the executor runs tasks in this process (None: serially; or a thread pool)."""
    return executor is None or isinstance(executor, concurrent.futures.ThreadPoolExecutor)


def run_tasks(fn: Callable[[J], R], jobs: Sequence[J], request: WriteRequest, desc: str) -> Iterator[R]:
    """The results of ``fn`` over ``jobs`` in order, as they finish, on the request's executor (with
    a progress bar when it asks for one)."""
    executor = request.executor
    results: Iterable[R] = map(fn, jobs) if executor is None else executor.map(fn, jobs)
    yield from progress_bar(results, total=len(jobs), desc=desc, disable=not request.progress, unit="task")


def write_shards(
    fn: Callable[[J], dict[str, Any]],
    jobs: Sequence[J],
    splits: Sequence[str],
    request: WriteRequest,
    partial: Path,
    profile: Profile,
    files: dict[str, Any],
    index: dict[str, dict[str, list[Any]]],
    done: Callable[[int], None] | None = None,
) -> None:
    """The shard phase of either layout: run ``fn`` over ``jobs`` (``splits``: each job's split),
    fsync their files, and add each result's file records (``"files"``) to ``files`` and its
    ``index.json`` entries (``"index"``: key -> values, in job order) to ``index``. ``done(k)`` is
    called as results come in (in job order): jobs ``[0, k)`` have finished and recorded."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as syncing:
        # Shard files reach the disk while later shards are being encoded (fsync mostly waits on I/O)
        synced: list[concurrent.futures.Future[None]] = []
        results: list[dict[str, Any]] = []
        for res in run_tasks(fn, jobs, request, f"write {request.spec.backend} shards"):
            synced += [syncing.submit(fsync_path, partial / rel) for rel in res["files"]]
            results.append(res)
            if done is not None:
                done(len(results))
        profile.wall.lap("shards")
        for future in synced:
            future.result()
        shard_dirs = {(partial / rel).parent for res in results for rel in res["files"]}
        list(syncing.map(fsync_path, sorted(shard_dirs)))
    profile.absorb("shard", results)
    profile.wall.lap("fsync")
    for split, res in zip(splits, results, strict=True):
        files.update(res["files"])
        for key, values in res["index"].items():
            index[split].setdefault(key, []).extend(values)


def commit(
    partial: Path,
    request: WriteRequest,
    content: StoreContent,
    files: dict[str, Any],
    index: Mapping[str, Any],
    profile: Profile,
) -> RayStore:
    """The last phase of a write: ``index.json``, the points, the manifest, the rename to ``dst``;
    ``profile`` gets its laps and is finished. Returns the store opened."""
    extra = write_extras(partial, request, content, files)
    write_index_and_manifest(partial, content, files, index, extra)
    profile.wall.lap("index_manifest")
    store = commit_store(partial, request.dst, request.overwrite)
    profile.wall.lap("commit")
    profile.finish(request.dst)
    return store


def write_extras(
    partial: Path, request: WriteRequest, content: StoreContent, files: dict[str, Any]
) -> dict[str, Any]:
    """Write the request's components and per-frame metadata into ``partial`` (or, for a copy, those
    of ``request.extras_from``); their file records go into ``files``. Returns the manifest keys that
    describe them (none when there are none: such a store's bytes are those of a store without)."""
    names = content.table.column("name").to_pylist()
    columns = ("split", "height", "width")
    rows = zip(names, *(content.table.column(k).to_pylist() for k in columns), strict=True)
    images = [(n, s, int(h), int(w)) for n, s, h, w in rows]
    src = request.extras_from
    wanted = (
        list(request.components) if src is None else [replace(i, index="") for i in src.components.values()]
    )
    by_name = {r.name: r for r in request.records}
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
        done, written = write_component(partial, content.backend.name, info, images, load)
        files.update(written)
        extra.setdefault("components", {})[info.name] = done.to_dict()
    if src is not None:
        frames = {n: src.frame_metadata(n) for n in names}
    else:
        frames = {n: dict(by_name[n].metadata) for n in names if n in by_name}
    frames = {k: v for k, v in frames.items() if v}
    if frames:
        files[FRAMES_FILE] = write_frame_metadata(partial, frames)
        extra["frame_metadata"] = {"path": FRAMES_FILE, "n_frames": len(frames)}
    return extra


def _record_component(records: Mapping[str, ImageRecord], name: str, names: Sequence[str], row: int) -> Any:
    return records[names[row]].components[name]()


def _copied_component(store: Any, name: str, names: Sequence[str], row: int) -> Any:
    return store.read_component(name, names[row])


def write_index_and_manifest(
    partial: Path,
    content: StoreContent,
    files: dict[str, Any],
    index: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write ``index.json``, the points (when the content has them) and last ``manifest.json`` into
    ``partial``; ``files`` (the payload's records, ``cameras.parquet`` written already) gets theirs."""
    atomic_write_json(partial / "index.json", index)
    written = ["cameras.parquet", "index.json"]
    if content.points is not None:
        write_parquet(content.points.to_table(), partial / POINTS_FILE)
        written.append(POINTS_FILE)
    for rel in written:
        files[rel] = file_record(partial / rel)
    atomic_write_json(partial / "manifest.json", content.manifest(files, index, extra))


def source_fingerprint(records: Sequence[ImageRecord], staged: Sequence[Mapping[str, Any]]) -> str:
    """The source fingerprint (either layout): every image's name, source file SHA-256, decoded shape
    and pixel CRC-32C (``staged``: each image's stage or encode task result, in table order)."""
    return json_digest(
        [
            [r.name, s["source_sha256"], [r.camera.height, r.camera.width, s["channels"]], s["pixels_crc32c"]]
            for r, s in zip(records, staged, strict=True)
        ]
    )


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
