"""Write an images-layout store (``layout="images"``): every image stored encoded, shuffled at load time.

Its phases (docs/format.md, "The images layout", **Writing**) run in ``<dst>.partial/`` like the ray
writer's; how a shard's bytes are laid out is the backend's (``Backend.encode_blobs``), the shard phase, the
manifest and the commit every layout's (``raykit.store.write.commit``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np

from raykit.errors import SourceError
from raykit.progress import progress as progress_bar
from raykit.store.backends import Backend, Blobs, BlobShard, backend_named, image_blobs
from raykit.store.files import is_url, json_digest, write_files
from raykit.store.image_codec import (
    LOSSY,
    PIXEL_CODECS,
    PIXEL_HEADER_BYTES,
    decode_stored,
    encode_for_store,
    pixel_file_bytes,
)
from raykit.store.schema import ImageRecord
from raykit.store.spec import DEFAULT_IMAGE_CHUNK_BYTES, DEFAULT_IMAGE_SHARD_CHUNKS, StoreSpec
from raykit.store.write.commit import (
    Partial,
    PayloadWrite,
    commit,
    open_write,
    staged_payload,
    write_shards,
)
from raykit.store.write.staging import (
    DiskStaging,
    ImageJob,
    StagingArea,
    check_pixels,
    crc32c_combine,
    pixels_crc32c,
    staging_area,
)
from raykit.store.write.tasks import (
    PhaseClock,
    ShardJob,
    finish_task,
    in_process,
    record_matches,
    stream_tasks,
)

if TYPE_CHECKING:
    from raykit.store.reader import RayStore

__all__ = ["encode_image_shard", "encode_image_task", "image_chunking", "write_images"]


_TASK_FORMAT = 1  # of the encode tasks' records


_SHARD_TASK_FORMAT = 2  # of the shard tasks' records (2: the backend's index entries in "index")


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


def encode_image_task(job: ImageJob) -> dict[str, Any]:
    """Phase 1 for one image: ``{"files", "ext", "passthrough", "channels", "size", "crc32c",
    "sha256", "source_sha256", "pixels_crc32c"}``."""
    root, area = Path(job.root), job.staging or DiskStaging(job.root)
    record_path = root / f"staging/{job.index:06d}.json"
    clock = PhaseClock()
    if (done := record_matches(record_path, job.key, root, clock)) is not None:  # staged by an earlier run
        return done
    rec = job.record
    pixels = check_pixels(rec, rec.load())  # the one decode: fails on a corrupt file
    clock.lap("decode")
    kept = getattr(rec.load, "encoded", None)  # a copy of an images store keeps its stored files
    stored = kept() if callable(kept) else None
    path = rec.source_path
    local = stored is None and path and not is_url(path) and os.path.isfile(path)
    source = Path(path).read_bytes() if local else None
    clock.lap("read")
    source_sha = hashlib.sha256(source).hexdigest() if source is not None else ""
    if source is not None and rec.source_sha256 and source_sha != rec.source_sha256:
        source, source_sha = None, ""  # the file at the recorded path changed since: not the recorded source
    clock.lap("checksum")
    if stored is None:
        stored = encode_for_store(source, pixels, job.codec)
    # lossless by construction; checked all the same (a pixel file is exact by construction: image_codec)
    if not stored.passthrough and not callable(kept) and job.codec not in PIXEL_CODECS:
        again = decode_stored(stored.data, pixels.shape[2], rec.source_path or rec.name)
        if job.codec in LOSSY:  # the store's pixels are the decoded ones
            pixels = again
        elif not np.array_equal(again, pixels):
            raise SourceError(f"{rec.source_path or rec.name}: lossless re-encoding changed the pixels")
    clock.lap("encode")
    if job.codec == "raw" and not callable(kept) and not stored.passthrough:
        # a raw pixel file is its header then the pixels: one CRC-32C pass over the pixels for both
        body = np.frombuffer(stored.data, np.uint8, offset=PIXEL_HEADER_BYTES)
        pixels_crc = int(google_crc32c.value(body))
        head = google_crc32c.value(stored.data[:PIXEL_HEADER_BYTES])
        crc = crc32c_combine(int(head), pixels_crc, len(body))
    else:
        crc, pixels_crc = int(google_crc32c.value(stored.data)), pixels_crc32c(pixels)
    files = area.put_encoded(job.index, stored.data, crc, str(path) if stored.data is source else "")
    clock.lap("write")
    # a pass-through image is the source file's bytes: one hash for both; a pixel file has none of its
    # own (its shard file's SHA-256 and its own CRC-32C cover its bytes: docs/format.md)
    stored_sha = source_sha if stored.data is source else ""
    if stored.ext != "rkpx" and stored.data is not source:
        stored_sha = hashlib.sha256(stored.data).hexdigest()
    result = {
        "files": files,
        "ext": stored.ext,
        "passthrough": stored.passthrough,
        "channels": int(pixels.shape[2]),
        "size": len(stored.data),
        "crc32c": crc,
        "sha256": stored_sha,
        "source_sha256": rec.source_sha256 or source_sha,
        "pixels_crc32c": pixels_crc,
    }
    clock.lap("checksum")
    return finish_task(None if area.in_memory else record_path, job.key, result, clock)


def camera_record(rec: ImageRecord, index: int, offset: int) -> dict[str, Any]:
    """An image's camera, pose and bounds (the ``KEY.json`` of a WebDataset sample)."""
    return {
        "name": rec.name,
        "split": rec.split,
        "index": index,
        "pixel_offset": offset,
        "camera": rec.camera.to_dict(),
        "c2w": np.asarray(rec.c2w, np.float64).tolist(),
        "near": rec.near,
        "far": rec.far,
    }


def encode_image_shard(
    backend: Backend,
    blobs: Blobs,
    staging: StagingArea,
    split: str,
    shard: BlobShard,
    items: Sequence[tuple[int, str, Mapping[str, Any]]],
    clock: PhaseClock,
) -> tuple[dict[str, bytes | memoryview | list[bytes]], dict[str, list[Any]]]:
    """A ``ShardJob``'s ``encode``: shard ``shard`` of split ``split``, assembled by the ``backend``
    from its staged images: ``items``, per image of ``shard.images``, its table index, extension and
    camera record."""
    images = [(staging.encoded(row), ext, record) for row, ext, record in items]
    rel, pieces, index = backend.encode_blobs(blobs, split, shard, images)
    clock.lap("gather")
    return {rel: pieces}, index


def write_images(job: PayloadWrite, spec: StoreSpec) -> RayStore:
    """Write an images-layout store of ``job``; returns it opened. ``spec.chunk_rays`` and
    ``shard_chunks`` are the chunking of the store's rays view and of a ray-layout copy."""
    spec = spec.replace(image_codec=spec.image_codec, materialize=None, with_pids=False)  # recorded
    w, records_plan = open_write(job, spec)
    records = job.records
    partial = str(w.root)
    # the memory area holds the bytes of images with no source file to read again (video frames,
    # copies): at most their raw size; past the budget they are staged in files (bounded memory),
    # unless each image is dropped once its shards are written (a pipeline: stored sizes known)
    codec = spec.image_codec
    sizes = _known_sizes(records, codec) if in_process(job.executor) else None
    held = sum(r.camera.width * r.camera.height * 3 for r in records if not os.path.isfile(r.source_path))
    staging = staging_area(partial, job.executor, sizes is not None or held <= spec.memory_staging_bytes)
    keys = [json_digest([entry, _TASK_FORMAT, codec]) for entry in records_plan]
    jobs = [ImageJob(partial, i, r, keys[i], staging, codec=codec) for i, r in enumerate(records)]
    w.profile.lap("plan")
    with contextlib.closing(staging):
        if sizes is None:  # the shards' plan needs every image's size: encoded first
            encoded = list(w.run(encode_image_task, jobs, "encode images"))
            w.profile.lap("stage")
            w.spec = spec.replace(**image_chunking(records, encoded))
            shards, holds = _split_shards(w, records, staging, [e["size"] for e in encoded], encoded)
            write_shards(w, shards)
        else:  # known before: each shard written as soon as its images are encoded, then dropped
            encoded = []
            w.spec = spec.replace(**image_chunking(records, [{"size": n} for n in sizes]))
            shards, holds = _split_shards(w, records, staging, sizes, [{"ext": "rkpx"}] * len(records))
            last = {row: k for k, rows in enumerate(holds) for row in rows}  # each image's last shard
            drop = [[row for row in rows if last[row] == k] for k, rows in enumerate(holds)]
            needs = [max(rows) + 1 for rows in holds]
            stream = stream_tasks(job.executor, encode_image_task, jobs, shards, needs, encoded)
            results = progress_bar(stream, total=len(shards), desc="write shards", disable=not job.progress)
            write_shards(w, shards, lambda k: _release(staging, drop[k - 1]), results)
            _check_sizes(records, encoded, sizes)
        splits, table, fields, fingerprint = staged_payload(w, records, encoded)
        _index_entries(w, records, encoded)
        source = {**job.source, "fingerprint": fingerprint}
        return commit(w, source, job.scene, splits, fields, table, job.extras())


def _known_sizes(records: Sequence[ImageRecord], codec: str) -> list[int] | None:
    """Each image's stored bytes before it is encoded where they are known: a pixel file of a fixed
    size (``pixel_file_bytes``) for images whose loader declares their channels (``load.channels``:
    video frames); else None."""
    sizes = []
    for rec in records:
        channels = getattr(rec.load, "channels", None)
        size = pixel_file_bytes(codec, rec.camera.height, rec.camera.width, channels) if channels else None
        if size is None:
            return None
        sizes.append(size)
    return sizes


def _check_sizes(
    records: Sequence[ImageRecord], encoded: Sequence[Mapping[str, Any]], sizes: Sequence[int]
) -> None:
    """The images' stored sizes are those their shards were planned with.

    Raises:
        SourceError: a loader that declared other channels than its pixels have.
    """
    for rec, e, size in zip(records, encoded, sizes, strict=True):
        if e["size"] != size or e["ext"] != "rkpx":
            raise SourceError(
                f"{rec.source_path or rec.name}: {e['channels']} channels decoded, its loader declared "
                f"{getattr(rec.load, 'channels', None)}"
            )


def _index_entries(w: Partial, records: Sequence[ImageRecord], encoded: Sequence[Mapping[str, Any]]) -> None:
    """Every split's ``index.json`` entries of its images, from their encode tasks' results."""
    for name in w.index:
        rows = [i for i, r in enumerate(records) if r.split == name]
        w.index[name].update(
            crc32c=[encoded[i]["crc32c"] for i in rows],
            image_sha256=[encoded[i]["sha256"] for i in rows],
            image_bytes=[encoded[i]["size"] for i in rows],
            image_format=[encoded[i]["ext"] for i in rows],
            passthrough=[encoded[i]["passthrough"] for i in rows],
        )


def _split_shards(
    w: Partial,
    records: Sequence[ImageRecord],
    staging: StagingArea,
    sizes: Sequence[int],
    encoded: Sequence[Mapping[str, Any]],
) -> tuple[list[ShardJob], list[tuple[int, ...]]]:
    """Every split's shard tasks of the write ``w`` for its images of ``sizes`` bytes, and the images
    (table rows) each one holds; the entries of its ``index.json`` known before any shard is written
    and its metadata files (written) go into ``w``. ``encoded``: each image's ``"ext"``."""
    backend, blobs = backend_named(w.spec.backend), image_blobs(w.spec)
    pixels = [r.camera.width * r.camera.height for r in records]
    offsets_px = np.concatenate([[0], np.cumsum(pixels)[:-1]]).astype(np.int64).tolist()
    jobs: list[ShardJob] = []
    holds: list[tuple[int, ...]] = []
    for name in dict.fromkeys(r.split for r in records):
        rows = [i for i, r in enumerate(records) if r.split == name]
        formats = [str(encoded[i]["ext"]) for i in rows]
        shards, planned, meta = backend.plan_blobs(blobs, name, [sizes[i] for i in rows])
        w.index[name] = planned
        names = [records[i].name for i in rows]
        write_files(w.root, {**backend.images_metadata(name, names, formats), **meta}, w.files)
        for shard in shards:
            held = tuple(rows[j] for j in shard.images)
            items = tuple(
                (i, str(encoded[i]["ext"]), camera_record(records[i], i, offsets_px[i])) for i in held
            )
            task_key = f"{w.key}:{name}:{shard.shard}:{_SHARD_TASK_FORMAT}"
            encode = functools.partial(encode_image_shard, backend, blobs, staging, name, shard, items)
            jobs.append(ShardJob(str(w.root), name, shard.shard, task_key, encode))
            holds.append(held)
    w.profile.lap("metadata")
    return jobs, holds


def _release(staging: StagingArea, rows: Sequence[int]) -> None:
    """Drop the staged bytes of images ``rows``: their shards are written."""
    for row in rows:
        staging.release_encoded(row)
