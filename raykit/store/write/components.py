"""Writing a store's per-image components and per-frame metadata (``raykit.store.components``:
the format and its reader): one component's files (``write_component``), and those of a new store
or a copy (``write_extras``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from raykit.errors import SourceError
from raykit.fileio import atomic_write_json
from raykit.ordered import in_order
from raykit.store.backends import backend_named, component_blobs
from raykit.store.components import FRAMES_FILE, ComponentInfo, component_shape, encode_component, stored_size
from raykit.store.files import file_record, json_digest, write_files
from raykit.store.schema import ImageRecord

__all__ = ["write_component", "write_extras"]


def write_component(
    root: Path,
    backend: str,
    info: ComponentInfo,
    images: Sequence[tuple[str, str, int, int]],
    load: Callable[[int], np.ndarray],
    progress: Callable[[Iterable[Any]], Iterable[Any]] = iter,
) -> tuple[ComponentInfo, dict[str, dict[str, Any]]]:
    """Write component ``info`` of the store at ``root`` (its files only, each atomically; the caller
    writes the manifest last), each split's arrays laid out by the ``backend`` as the images layout's
    images are (``raykit.store.backends.Blobs``), one shard held at a time.

    Args:
        backend: ``"zarr"`` or ``"wds"``.
        images: per camera-table row, ``(name, split, height, width)``.
        load: ``load(row)`` -> the row's array at its stored size (``component_shape``;
            ``encode_component``'s input);
            called on a few threads, the arrays written in row order (the bytes do not depend on it).
        progress: wraps the iterator of written rows (a progress bar).

    Returns:
        ``info`` completed (index path, counts, fingerprint) and the records of the files written
        (relative path -> ``{size, sha256}``), its index file included.

    Raises:
        SourceError: an array of the wrong size or values (one line naming the image).
    """

    def encoded(row: int) -> bytes:  # on a thread: decoding files and numpy release the GIL
        name, _, height, width = images[row]
        values = np.asarray(load(row))
        rows, columns = component_shape(info, height, width)
        if values.shape[:2] != (rows, columns):
            shape = f"{values.shape[1]}x{values.shape[0]}" if values.ndim >= 2 else str(values.shape)
            raise SourceError(f"image {name!r}: {info.name} is {shape}, expected {columns}x{rows}")
        return encode_component(info, values, f"image {name!r}")

    store, blobs = backend_named(backend), component_blobs(info.name)
    files: dict[str, Any] = {}

    index: dict[str, Any] = {}
    splits: dict[str, list[int]] = {}  # each split's rows: one run of the table
    for row, (_, split, _, _) in enumerate(images):
        splits.setdefault(split, []).append(row)
    threads = max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(threads, "raykit-component") as pool:
        arrays = iter(progress(in_order(pool, encoded, range(len(images)), 2 * threads)))
        for split, rows in splits.items():
            sizes = [stored_size(info, images[r][2], images[r][3]) for r in rows]
            shards, planned, metadata = store.plan_blobs(blobs, split, sizes)
            entry = index[split] = {"bytes": sizes, "crc32c": [], **planned}
            held: dict[int, bytes] = {}  # split-local index -> bytes, for the shards to come
            for shard in shards:
                while len(entry["crc32c"]) <= shard.images[-1]:
                    _, data = next(arrays)
                    i = len(entry["crc32c"])
                    if len(data) != sizes[i]:
                        raise ValueError(f"component {info.name}: {len(data)} bytes, expected {sizes[i]}")
                    entry["crc32c"].append(int(google_crc32c.value(data)))
                    held[i] = data
                items = [(held[i], f"{info.name}.npy", None) for i in shard.images]
                rel, data, entries = store.encode_blobs(blobs, split, shard, items)
                write_files(root, {rel: data}, files)
                for key, values in entries.items():
                    entry.setdefault(key, []).extend(values)
                held = {shard.images[-1]: held[shard.images[-1]]}  # it may run into the next shard
            write_files(root, metadata, files)
    atomic_write_json(root / info.index, index)
    files[info.index] = file_record(root / info.index)
    crcs = [crc for split in index for crc in index[split]["crc32c"]]
    stored = sum(n for split in index for n in index[split]["bytes"])
    fingerprint = json_digest({"name": info.name, "dtype": info.dtype, "unit": info.unit, "crc32c": crcs})
    done = replace(info, n_images=len(images), stored_bytes=stored, fingerprint=fingerprint)
    return done, dict(files)


def write_extras(
    partial: Path,
    table: Any,
    backend: str,
    records: Sequence[ImageRecord],
    components: Sequence[ComponentInfo],
    extras_from: Any,
    files: dict[str, Any],
) -> dict[str, Any]:
    """Write the ``components`` of ``records`` and their per-frame metadata into ``partial`` (or, for a
    copy, those of the ``RayStore`` ``extras_from``); their file records go into ``files``. ``table``: the
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
