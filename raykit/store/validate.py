"""Whether a store is sound: ``validate_store`` (``raykit validate``): everything a store claims checked
(docs/format.md, "Integrity"), every problem reported, one line each (what it holds:
``raykit.store.summary``).

By default every file is hashed and checked against its SHA-256, and the metadata, the camera table,
the points, each stored image's and component array's CRC-32C (an image's format and header size, an
array's ``.npy`` header too) and each derived ray order are checked: at about the speed of hashing the
store's bytes, since those bytes are all it reads, once (a stored blob is checked from its file's
bytes as they are hashed, ``raykit.store.blobcheck``). ``deep`` also decodes every chunk and image and
checks what only the decoded values show (every pixel once, alpha, materialised rays), on every core.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raykit.errors import RaykitError
from raykit.ordered import in_order
from raykit.store.blobcheck import components_check, images_check
from raykit.store.order import base_permutation, merge_counts
from raykit.store.points import check_points
from raykit.store.reader import RayStore, open_store
from raykit.store.table import record_problems

if TYPE_CHECKING:
    pass

__all__ = ["validate_store"]


def validate_store(path_or_url: str | Path, deep: bool = False) -> list[str]:
    """Every problem found in the store at ``path_or_url``, one line each; empty when it is valid
    (``deep``: also decode every chunk and image; see the module docstring)."""
    try:
        store = open_store(path_or_url)
    except RaykitError as exc:
        return [str(exc)]
    # the stored images' checks, per images-layout split
    images = {
        split: images_check(store, split, deep) for split, info in store.splits.items() if info.holds_images
    }
    components, component_problems = components_check(store)
    owner: dict[str, Any] = {rel: check for check in images.values() for rel in check.files}
    owner.update(dict.fromkeys(components.files, components))

    def check(rel: str) -> tuple[str | None, list[str]]:
        """``rel``'s own problem or None, and the problems of the stored images held whole in it."""
        if rel in owner:
            return owner[rel].check_file(rel)
        try:
            store.storage.verify_file(rel)
        except RaykitError as exc:
            return str(exc), []
        return None, []

    # Reads, SHA-256 and CRC-32C release the GIL: one thread per core hashes every file at the disk's or
    # the cores' speed; the sparse points are read and checked beside, the camera table meanwhile.
    # The manifest's entries must cover every file the split index names: a chunk file without an
    # entry (deleted with its entry, the digest recomputed) is reported as such, not skipped.
    indexed = [rel for split in store.splits if split not in images for rel in _chunk_files(store, split)]
    files = list(dict.fromkeys([*store.files, *owner, *indexed]))
    with ThreadPoolExecutor(max_workers=_threads()) as pool:
        points = pool.submit(_check_points, store)
        results = pool.map(check, files)
        try:
            table: list[str] | None = _check_table(store)
        except RaykitError as exc:
            table, table_error = None, f"{store.url}/cameras.parquet: {exc}"
        found = dict(zip(files, results, strict=True))
        points_problems = points.result()
    problems = [problem for problem, _ in found.values() if problem is not None]
    bad_files = {rel for rel, (problem, _) in found.items() if problem is not None}
    if table is None:
        return [*problems, table_error]
    problems += table
    if store.manifest.get("points", {}).get("path") not in bad_files:
        problems += points_problems
    for split in store.splits:
        if split in images:
            problems += [p for rel in images[split].files for p in found[rel][1]]
            problems += images[split].check_rest(bad_files)
        else:
            problems += _check_split(store, split, bad_files, deep)
    problems += component_problems + [p for rel in components.files for p in found[rel][1]]
    return problems + components.check_rest(bad_files)


def _chunk_files(store: RayStore, split: str) -> list[str]:
    """The payload files the split index names for ray split ``split``'s chunks."""
    files = (store.chunk_files(split, i) for i in range(store.splits[split].n_chunks))
    return list(dict.fromkeys(rel for names in files for rel in names))


def _threads() -> int:
    """Threads that hash or decode (reads, SHA-256 and decompression release the GIL)."""
    return min(4, len(os.sched_getaffinity(0)))


def _check_points(store: RayStore) -> list[str]:
    """Problems of the sparse points (``points3D.parquet``), if the store has them."""
    entry = store.manifest.get("points")
    if entry is None:
        return []
    where = f"{store.url}/{entry.get('path')}"
    try:
        table = store.points
    except RaykitError as exc:
        return [str(exc)]
    return [] if table is None else check_points(table, entry, where)


def _check_table(store: RayStore) -> list[str]:
    table, where = store.table, f"{store.url}/cameras.parquet"
    table.cameras  # noqa: B018  (builds every camera record: a bad model or parameter count raises)
    problems = []
    if len(table.names) != store.manifest["n_images"]:
        problems.append(f"{where}: expected {store.manifest['n_images']} rows, got {len(table.names)}")
    expected_offsets = np.concatenate([[0], np.cumsum(table.n_pixels)[:-1]])
    if not np.array_equal(table.pixel_offset, expected_offsets):
        problems.append(f"{where}: pixel_offset is not the running sum of width * height")
    for split, info in store.splits.items():
        rows = store.split_rows(split)
        n_rays = int(table.n_pixels[rows].sum())
        if len(rows) != info.n_images or n_rays != info.n_rays:
            problems.append(
                f"{where}: split {split!r}: expected {info.n_images} images / {info.n_rays} rays, "
                f"got {len(rows)} / {n_rays}"
            )
        elif len(rows) and int(table.pixel_offset[rows[0]]) != info.pid_start:
            problems.append(f"{where}: split {split!r}: expected pid_start {info.pid_start}")
        offsets = table.pixel_offset[rows] - info.pid_start
        if not info.shuffled and not np.array_equal(table.ray_start[rows], offsets):
            problems.append(f"{where}: split {split!r}: ray_start does not match the image order")
    problems += [f"{where}: {p}" for p in record_problems(table.names, table.c2w, table.near, table.far)]
    if table.time is not None and not np.isfinite(table.time).all():
        problems.append(f"{where}: expected a finite time on every image, got {table.time.tolist()[:10]}")
    return problems


def _check_split(store: RayStore, split: str, bad_files: set[str], deep: bool) -> list[str]:
    """Problems of ray split ``split``'s chunks (read only when ``deep``); a chunk in a file already
    reported (``bad_files``) is not reported again."""
    info = store.splits[split]
    derived = info.pids == "derived"
    problems = _check_derived_order(store, split) if derived else []
    if not deep:
        return problems
    seen = None if derived else np.zeros(info.n_rays, dtype=bool)
    unreadable = False

    def read(index: int) -> Any:
        try:
            return store.read_chunk(split, index)
        except RaykitError as exc:  # reported in order, below
            return exc

    threads = _threads()
    with ThreadPoolExecutor(threads) as pool:  # decoded in parallel, two per thread ahead, checked in order
        for index, raw in in_order(pool, read, range(info.n_chunks), 2 * threads):
            if isinstance(raw, RaykitError):
                unreadable = True
                if not bad_files.intersection(store.chunk_files(split, index)):
                    problems.append(str(raw))
                continue
            where = f"{store.url}: split {split!r} chunk {index}"
            if seen is not None:
                problems += _mark_pixels(seen, raw.pid, info, index, where)
            problems += _check_values(store, raw, where)
    if seen is not None and not problems and not unreadable and not seen.all():
        missing = int(np.count_nonzero(~seen))  # as many rays hold a pixel found before
        problems.append(f"{store.url}: split {split!r}: {missing} pixels missing, {missing} duplicated")
    return problems


def _check_derived_order(store: RayStore, split: str) -> list[str]:
    """A split whose pids are derived holds each pixel once by construction, if every ``base_n`` is a
    permutation and the merge gives each image all its ranks: checked so, without touching every ray
    (the read-side derivation is tested against the definition's slow twin)."""
    order, info = store.split_order(split), store.splits[split]
    where = f"{store.url}: split {split!r}"
    if sum(order.sizes) != info.n_rays:
        return [f"{where}: images hold {sum(order.sizes)} pixels, the split {info.n_rays} rays"]
    if not order.shuffled:
        return []
    problems = []
    for n in sorted(set(order.sizes)):
        base = base_permutation(order.seed, split, n)
        if not np.array_equal(np.sort(base), np.arange(n, dtype=base.dtype)):
            problems.append(f"{where}: the order of images of {n} pixels is not a permutation")
    if merge_counts(tuple(order.sizes), info.n_rays) != list(order.sizes):
        problems.append(f"{where}: the train order does not hold every pixel of every image")
    return problems


def _mark_pixels(seen: np.ndarray, pid: np.ndarray, info: Any, index: int, where: str) -> list[str]:
    """Mark chunk ``index``'s stored pixels in ``seen``; its problems. Every chunk holds exactly its
    share of rays, so a pixel found twice leaves another unmarked: ``seen.all()`` at the end means each
    pixel once (a bool store per ray, not ``np.add.at``: 5-20x faster on large splits)."""
    start, stop = info.chunk_range(index)
    local = pid.astype(np.int64) - info.pid_start
    if local.size != stop - start:
        return [f"{where}: expected {stop - start} rays, got {local.size}"]
    if local.size and (local.min() < 0 or local.max() >= info.n_rays):
        return [f"{where}: pixel ids outside the split's range"]
    seen[local] = True
    if not info.shuffled and not np.array_equal(local, np.arange(start, stop)):
        return [f"{where}: evaluation rays are not in image, row-major order"]
    return []


def _check_values(store: RayStore, raw: Any, where: str) -> list[str]:
    problems = []
    has_alpha = store.table.has_alpha
    if raw.rgba.shape[1] == 4 and not has_alpha.all():
        alpha = raw.rgba[:, 3]
        if has_alpha.any():  # mixed: which rays belong to images without alpha
            alpha = alpha[~has_alpha[store.decode_pids(raw.pid)[0]]]
        if np.any(alpha != 255):
            problems.append(f"{where}: images without alpha have alpha != 255")
    if "directions" in raw.extra:
        from raykit.rays import materialized_rays  # imports torch: only for materialised rays

        generated = materialized_rays(store.table, raw.pid, "float32")
        tol = 2e-3 if raw.extra["directions"].dtype == np.float16 else 1e-5
        for name in ("origins", "directions"):
            stored = raw.extra[name].astype(np.float32)
            scale = max(1.0, float(np.abs(generated[name]).max(initial=0.0)))
            if not np.allclose(stored, generated[name], atol=tol * scale, rtol=0):
                problems.append(f"{where}: materialised {name} differ from generated rays")
    return problems
