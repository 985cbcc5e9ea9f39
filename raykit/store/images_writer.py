"""Write an images-layout store (``layout="images"``): every image stored encoded, shuffled at load time.

Phases, in ``<dst>.partial/`` like the ray writer (``raykit.store.writer``), both run by any
``concurrent.futures.Executor``:

1. **encode**: one task per image decodes it once (``ImageRecord.load()``: a truncated or corrupt
   file fails the conversion), keeps the source file's bytes when they pass through unchanged, else
   re-encodes losslessly and checks that the new bytes decode to the same pixels
   (``raykit.store.image_codec``); the bytes go to ``staging/{index:06d}.img`` with a task record
   (resume: a task whose key and file checksum match is skipped);
2. **shards**: one task per zarr shard (a fixed byte range of the split's byte array) or per tar (a
   run of whole images) assembles its file from the staged bytes and writes it atomically;
3. **commit**: zarr metadata, ``cameras.parquet``, ``index.json``, then ``manifest.json``; then the
   rename to ``dst``.

Every byte depends only on the records and options, never on the executor or worker count.

Length (about 410 lines): the three phases, their task records and the manifest of this layout are
read together, as in ``writer.py``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from raykit.errors import SourceError
from raykit.fileio import atomic_path, atomic_write_bytes, atomic_write_json, fsync_path
from raykit.store.destination import check_seed
from raykit.store.image_codec import REENCODE_FORMAT, decode_stored, encode_for_store
from raykit.store.images_layout import (
    IMAGES_LAYOUT,
    ZARR_ROOT,
    camera_record,
    images_metadata,
    wds_image_shards,
    wds_shard_groups,
    zarr_image_shard,
    zarr_shard_count,
)
from raykit.store.integrity import content_fingerprint, file_record, json_digest
from raykit.store.lock import holding_store_lock
from raykit.store.phases import PhaseClock, Profile
from raykit.store.plan import check_options, field_specs, partial_dir, record_plan, split_infos
from raykit.store.points import POINTS_FILE, SparsePoints, points_digest, points_entry, write_points
from raykit.store.schema import FORMAT_NAME, FORMAT_VERSION, ImageRecord, SceneInfo, SplitInfo
from raykit.store.staging import bytes_record, record_matches, scratch_record, write_record
from raykit.store.table import build_camera_table, order_records, write_camera_table

__all__ = [
    "DEFAULT_IMAGE_CHUNK_BYTES",
    "DEFAULT_IMAGE_SHARD_CHUNKS",
    "EncodeJob",
    "encode_image_task",
    "images_layout_options",
    "write_images_store",
]

DEFAULT_IMAGE_CHUNK_BYTES = 1 << 16  # zarr inner chunk (the padding of a split's last chunk: <= 64 KiB)
DEFAULT_IMAGE_SHARD_CHUNKS = 1024  # 64 MiB shard files (zarr) / tars closed at 64 MiB (wds)
_TASK_FORMAT = 1


def images_layout_options(chunk_rays: int, shard_chunks: int, seed: int) -> dict[str, Any]:
    """The manifest ``layout`` of an images store (ray-read keys kept for the rays view and copies)."""
    return {
        "chunk_rays": chunk_rays,
        "shard_chunks": shard_chunks,
        "seed": seed,
        "image_chunk_bytes": DEFAULT_IMAGE_CHUNK_BYTES,
        "image_shard_chunks": DEFAULT_IMAGE_SHARD_CHUNKS,
        "image_codec": REENCODE_FORMAT,
        "materialize": None,
    }


def image_chunking(ordered: Sequence[ImageRecord], encoded: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """``image_chunk_bytes`` and ``image_shard_chunks``: zarr inner chunks of at most 64 KiB, smaller
    for small splits (down to 4 KiB, about 1/32 of the smallest split's bytes), so the zero padding of
    a split's last chunk stays small; shards of 64 MiB, or of the largest split when it is smaller (the
    shard index has 16 bytes per chunk of the shard, used or not)."""
    totals: dict[str, int] = {}
    for rec, e in zip(ordered, encoded, strict=True):
        totals[rec.split] = totals.get(rec.split, 0) + int(e["size"])
    size = DEFAULT_IMAGE_CHUNK_BYTES
    while size > 4096 and size * 32 > min(totals.values()):
        size //= 2
    per_shard = (DEFAULT_IMAGE_CHUNK_BYTES * DEFAULT_IMAGE_SHARD_CHUNKS) // size
    largest = -(-max(totals.values()) // size)  # a shard index has an entry per chunk: no more than needed
    return {"image_chunk_bytes": size, "image_shard_chunks": min(per_shard, largest)}


@dataclass(frozen=True)
class EncodeJob:
    """Phase-1 task: image ``index`` (table order) of ``root``'s plan; ``memory``: keep the bytes in
    this process (``_MEMORY``) instead of a staging file (tasks run in the writing process)."""

    root: str
    index: int
    record: ImageRecord
    key: str
    memory: bool = False


# Encoded images of in-process writes: partial directory -> table index -> bytes (no staging files).
_MEMORY: dict[str, dict[int, bytes]] = {}


def _source_bytes(rec: ImageRecord) -> bytes | None:
    path = rec.source_path
    if path and "://" not in path and os.path.isfile(path):
        with open(path, "rb") as handle:
            return handle.read()
    return None


def _crc32c(data: bytes | np.ndarray) -> int:
    view = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else np.ascontiguousarray(data)
    view = view.reshape(-1).view(np.uint8)
    view.flags.writeable = False
    return int(google_crc32c.value(view))


def _checked(rec: ImageRecord, pixels: Any) -> np.ndarray:
    array = np.asarray(pixels)
    shape = (rec.camera.height, rec.camera.width)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[:2] != shape or array.shape[2] not in (3, 4):
        raise SourceError(
            f"{rec.source_path or rec.name}: expected uint8 pixels of shape ({shape[0]}, {shape[1]}, 3|4) "
            f"matching its camera, got {array.dtype} {array.shape}"
        )
    return np.ascontiguousarray(array)


def encode_image_task(job: EncodeJob) -> dict[str, Any]:
    """Phase 1 for one image: ``{"files", "ext", "passthrough", "channels", "size", "crc32c",
    "sha256", "source_sha256", "pixels_crc32c"}``."""
    root, rel = Path(job.root), f"staging/{job.index:06d}.img"
    record_path = root / f"staging/{job.index:06d}.json"
    clock = PhaseClock()
    done = record_matches(record_path, job.key, root)  # (from an earlier run that staged files)
    if done is not None:
        clock.lap("resume_check")
        return {**done, "seconds": clock.seconds}
    rec = job.record
    pixels = _checked(rec, rec.load())  # the one decode: fails on a truncated or corrupt file
    clock.lap("decode")
    kept = getattr(rec.load, "encoded", None)  # a copy of an images store keeps its stored files
    stored = kept() if callable(kept) else None
    source = _source_bytes(rec) if stored is None else None
    clock.lap("read")
    source_sha = hashlib.sha256(source).hexdigest() if source is not None else ""
    if source is not None and rec.source_sha256 and source_sha != rec.source_sha256:
        source, source_sha = None, ""  # the file at the recorded path changed since: not the recorded source
    clock.lap("checksum")
    if stored is None:
        stored = encode_for_store(source, pixels)
    if not stored.passthrough and not callable(kept):  # lossless by construction; checked all the same
        again = decode_stored(stored.data, pixels.shape[2], rec.source_path or rec.name)
        if not np.array_equal(again, pixels):
            raise SourceError(f"{rec.source_path or rec.name}: lossless re-encoding changed the pixels")
    clock.lap("encode")
    if job.memory:
        _MEMORY.setdefault(job.root, {})[job.index] = stored.data
    else:
        atomic_write_bytes(root / rel, stored.data, sync=False)
    clock.lap("write")
    # a pass-through image is the source file's bytes: one hash for both
    stored_sha = source_sha if stored.data is source else hashlib.sha256(stored.data).hexdigest()
    result = {
        "files": {} if job.memory else {rel: scratch_record(stored.data)},
        "ext": stored.ext,
        "passthrough": stored.passthrough,
        "channels": int(pixels.shape[2]),
        "size": len(stored.data),
        "crc32c": _crc32c(stored.data),
        "sha256": stored_sha,
        "source_sha256": rec.source_sha256 or source_sha,
        "pixels_crc32c": _crc32c(pixels),
    }
    clock.lap("checksum")
    if not job.memory:
        write_record(record_path, {"key": job.key, "result": result})
        clock.lap("write")
    return {**result, "seconds": clock.seconds}


@dataclass(frozen=True)
class ShardJob:
    """Phase-2 task: one shard file of one split from staged images ``first..`` (table indices)."""

    root: str
    backend: str
    split: str
    shard: int
    images: tuple[int, ...]  # table indices of the staged images the shard needs
    offsets: tuple[int, ...]  # zarr: each image's byte offset in the split's array; wds: unused
    local: tuple[int, ...]  # split-local index of each image
    records: tuple[Mapping[str, Any], ...]  # wds: each image's camera record
    exts: tuple[str, ...]
    layout: Mapping[str, Any]
    total: int  # zarr: bytes in the split's array
    key: str


def _staged(root: Path, index: int) -> bytes:
    held = _MEMORY.get(str(root), {}).get(index)
    return held if held is not None else (root / f"staging/{index:06d}.img").read_bytes()


def write_shard_task(job: ShardJob) -> dict[str, Any]:
    """Phase 2 for one shard: ``{"files": {rel: record}, "members": [...]}``."""
    root = Path(job.root)
    record_path = root / f"tasks/{job.split}-{job.shard:06d}.json"
    clock = PhaseClock()
    done = record_matches(record_path, job.key, root)
    if done is not None:
        clock.lap("resume_check")
        return {**done, "seconds": clock.seconds}
    members: list[int] = []
    if job.backend == "zarr":
        per = job.layout["image_chunk_bytes"] * job.layout["image_shard_chunks"]
        lo, hi = job.shard * per, min((job.shard + 1) * per, job.total)
        blob = bytearray(hi - lo)
        for index, offset in zip(job.images, job.offsets, strict=True):
            data = _staged(root, index)
            a, b = max(offset, lo), min(offset + len(data), hi)
            blob[a - lo : b - lo] = data[a - offset : b - offset]
        rel = f"zarr/{job.split}/images/c/{job.shard}"
        pieces: bytes | list[bytes] = zarr_image_shard(bytes(blob), job.shard, job.total, job.layout)
    else:
        items = [(_staged(root, i), e, r) for i, e, r in zip(job.images, job.exts, job.records, strict=True)]
        rel = f"wds/{job.split}-{job.shard:06d}.tar"
        pieces, members = wds_image_shards(job.split, job.local[0], items)
    clock.lap("gather")
    atomic_write_bytes(root / rel, pieces, sync=False)
    clock.lap("write")
    result = {"files": {rel: bytes_record(pieces)}, "members": members}
    clock.lap("checksum")
    write_record(record_path, {"key": job.key, "result": result})
    clock.lap("write")
    return {**result, "seconds": clock.seconds}


def _run(fn: Any, jobs: Sequence[Any], executor: Any) -> list[Any]:
    return list(map(fn, jobs) if executor is None else executor.map(fn, jobs))


def _shard_jobs(backend: str, info: SplitInfo, rows: list[int], ordered: Sequence[ImageRecord],
                encoded: Sequence[Mapping[str, Any]], offsets_px: Sequence[int], layout: Mapping[str, Any],
                root: str, key: str) -> tuple[list[ShardJob], list[int]]:  # fmt: skip
    """The shard tasks of one split, and its images' byte offsets (zarr) in the split's array."""
    sizes = [int(encoded[i]["size"]) for i in rows]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
    exts = [str(encoded[i]["ext"]) for i in rows]
    jobs = []
    if backend == "zarr":
        per = layout["image_chunk_bytes"] * layout["image_shard_chunks"]
        for s in range(zarr_shard_count(starts[-1], layout)):
            take = [j for j in range(len(rows)) if starts[j] < (s + 1) * per and starts[j + 1] > s * per]
            jobs.append(ShardJob(root, backend, info.name, s, tuple(rows[j] for j in take),
                                 tuple(starts[j] for j in take), tuple(take), (), (), layout, starts[-1],
                                 f"{key}:{info.name}:{s}:{_TASK_FORMAT}"))  # fmt: skip
        return jobs, starts
    for s, group in enumerate(wds_shard_groups(sizes, layout)):
        recs = tuple(camera_record(ordered[rows[j]], rows[j], offsets_px[rows[j]]) for j in group)
        jobs.append(ShardJob(root, backend, info.name, s, tuple(rows[j] for j in group), (), tuple(group),
                             recs, tuple(exts[j] for j in group), layout, 0,
                             f"{key}:{info.name}:{s}:{_TASK_FORMAT}"))  # fmt: skip
    return jobs, starts


@holding_store_lock("dst")
def write_images_store(
    dst: str | Path,
    records: Sequence[ImageRecord],
    *,
    scene: SceneInfo,
    backend: str = "zarr",
    chunk_rays: int = 65536,
    shard_chunks: int = 16,
    seed: int = 0,
    executor: concurrent.futures.Executor | None = None,
    progress: bool = False,
    source: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    points: SparsePoints | None = None,
) -> Any:
    """Write an images-layout store at ``dst`` from ``records``; returns it opened (``RayStore``).

    ``chunk_rays`` and ``shard_chunks`` are the chunking of the store's rays view and of a ray-layout
    copy; ``seed`` is recorded as the store's default loader seed. Other arguments as
    :func:`raykit.store.write_store`.
    """
    del progress  # phases are short per image; no progress bars
    profile = Profile()
    check_options(backend, chunk_rays, shard_chunks, None)
    check_seed(seed)
    dst = Path(dst)
    ordered = order_records(records)
    layout = images_layout_options(chunk_rays, shard_chunks, seed)
    records_plan = [record_plan(r) for r in ordered]
    plan = {"format_version": FORMAT_VERSION, "layout_kind": IMAGES_LAYOUT, "backend": backend,
            "layout": layout, "scene": scene.to_dict(), "records": records_plan,
            "source": dict(source or {})}  # fmt: skip
    if points is not None:  # only then: plans (and resume keys) of stores without points are unchanged
        plan["points"] = points_digest(points)
    key = json_digest(plan)
    partial = partial_dir(dst, plan, overwrite, key)
    memory = executor is None or isinstance(executor, concurrent.futures.ThreadPoolExecutor)
    jobs = [EncodeJob(str(partial), i, r, json_digest([records_plan[i], _TASK_FORMAT]), memory)
            for i, r in enumerate(ordered)]  # fmt: skip
    profile.wall.lap("plan")
    try:
        return _write_rest(jobs, executor, partial, dst, ordered, backend, layout, chunk_rays, scene, source,
                           key, overwrite, points, profile)  # fmt: skip
    finally:
        _MEMORY.pop(str(partial), None)


def _write_rest(jobs: list[EncodeJob], executor: Any, partial: Path, dst: Path, ordered: list[ImageRecord],
                backend: str, layout: dict[str, Any], chunk_rays: int, scene: SceneInfo,
                source: Mapping[str, Any] | None, key: str, overwrite: bool,
                points: SparsePoints | None, profile: Profile) -> Any:  # fmt: skip
    """Phases 1 to 3 of :func:`write_images_store`; ``profile`` gets the time per phase
    (``raykit.store.phases``: the encode tasks as ``stage``, the shard tasks as ``shard``)."""
    encoded = _run(encode_image_task, jobs, executor)
    profile.absorb("stage", encoded)
    profile.wall.lap("stage")
    layout = {**layout, **image_chunking(ordered, encoded)}
    channels = 4 if any(e["channels"] == 4 for e in encoded) else 3
    infos = {k: SplitInfo(k, v.n_rays, v.n_images, chunk_rays, False, v.pid_start, "derived", IMAGES_LAYOUT)
             for k, v in split_infos(ordered, chunk_rays).items()}  # fmt: skip
    table = build_camera_table(ordered, [e["channels"] == 4 for e in encoded],
                               [e["source_sha256"] for e in encoded], set())  # fmt: skip
    with atomic_path(partial / "cameras.parquet") as tmp:
        write_camera_table(table, str(tmp))
    offsets_px = table.column("pixel_offset").to_pylist()
    profile.wall.lap("camera_table")
    files: dict[str, Any] = {}
    index: dict[str, dict[str, list[Any]]] = {}
    shard_jobs: list[ShardJob] = []
    if backend == "zarr":
        atomic_write_bytes(partial / "zarr/zarr.json", _doc(ZARR_ROOT))
        files["zarr/zarr.json"] = file_record(partial / "zarr/zarr.json")
    for name, info in infos.items():
        rows = [i for i, r in enumerate(ordered) if r.split == name]
        jobs_s, starts = _shard_jobs(
            backend, info, rows, ordered, encoded, offsets_px, layout, str(partial), key
        )
        shard_jobs += jobs_s
        entry: dict[str, list[Any]] = {
            "crc32c": [encoded[i]["crc32c"] for i in rows],
            "image_sha256": [encoded[i]["sha256"] for i in rows],
            "image_bytes": [encoded[i]["size"] for i in rows],
            "image_format": [encoded[i]["ext"] for i in rows],
            "passthrough": [encoded[i]["passthrough"] for i in rows],
        }
        if backend == "zarr":
            entry["image_offset"] = starts
            meta = images_metadata(
                name, [ordered[i].name for i in rows], entry["image_format"], starts, layout
            )
            for rel, data in meta.items():
                atomic_write_bytes(partial / rel, data)
                files[rel] = file_record(partial / rel)
        index[name] = entry
    profile.wall.lap("metadata")
    results = _run(write_shard_task, shard_jobs, executor)
    profile.absorb("shard", results)
    profile.wall.lap("shards")
    for job, res in zip(shard_jobs, results, strict=True):
        files.update(res["files"])
        if backend == "wds":
            entry = index[job.split]
            entry.setdefault("image_shard", []).extend([job.shard] * len(job.images))
            entry.setdefault("image_member", []).extend(res["members"])
        for rel in res["files"]:
            fsync_path(partial / rel)
    profile.wall.lap("fsync")
    atomic_write_json(partial / "index.json", index)
    written = ["cameras.parquet", "index.json"]
    if points is not None:
        with atomic_path(partial / POINTS_FILE) as tmp:
            write_points(points, str(tmp))
        written.append(POINTS_FILE)
    for rel in written:
        files[rel] = file_record(partial / rel)
    fingerprint = json_digest(
        [[r.name, e["source_sha256"], [r.camera.height, r.camera.width, e["channels"]], e["pixels_crc32c"]]
         for r, e in zip(ordered, encoded, strict=True)]
    )  # fmt: skip
    manifest = _manifest(backend, layout, {**dict(source or {}), "fingerprint": fingerprint}, scene, infos,
                         channels, table, files, index, points)  # fmt: skip
    atomic_write_json(partial / "manifest.json", manifest)
    profile.wall.lap("index_manifest")
    from raykit.store.writer import _commit

    store = _commit(partial, dst, overwrite)
    profile.wall.lap("commit")
    profile.finish(dst)
    return store


def _doc(document: Mapping[str, Any]) -> bytes:
    import json

    return json.dumps(document, indent=2).encode()


def _manifest(backend: str, layout: Mapping[str, Any], source: Mapping[str, Any], scene: SceneInfo,
              infos: Mapping[str, SplitInfo], channels: int, table: Any, files: Mapping[str, Any],
              index: Mapping[str, Mapping[str, Any]],
              points: SparsePoints | None) -> dict[str, Any]:  # fmt: skip
    from raykit import __version__

    splits = {k: v.to_dict() for k, v in infos.items()}
    hashed = {k: v.fingerprint_dict() for k, v in infos.items()}
    fields = {spec.name: spec.to_dict() for spec in field_specs(channels, None)}
    crcs = {k: v["crc32c"] for k, v in index.items()}
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "raykit_version": __version__,
        "backend": backend,
        "layout": dict(layout),
        "source": dict(source),
        "scene": scene.to_dict(),
        "splits": splits,
        "fields": fields,
        "n_images": table.num_rows,
        "files": dict(sorted(files.items())),
        **({"points": points_entry(points)} if points is not None else {}),
        "content_fingerprint": content_fingerprint(table, scene.to_dict(), hashed, fields, crcs),
    }
    manifest["manifest_digest"] = json_digest(manifest)
    return manifest
