"""Whether a store is sound: ``validate_store`` (``raykit validate``): everything a store claims checked
(docs/format.md, "Integrity"), every problem reported, one line each (what it holds:
``raykit.store.summary``).

By default every file is hashed and checked against its SHA-256, and the metadata, the camera table,
the points, each stored image's and component array's CRC-32C (an image's format and header size, an
array's ``.npy`` header too) and each derived ray order are checked: at about the speed of hashing the
store's bytes, since those bytes are all it reads, once (a stored blob is checked from its file's bytes
as they are hashed, ``BlobCheck``). ``deep`` also decodes every chunk and image and checks what only
the decoded values show (every pixel once, alpha, materialised rays), on every core.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raykit.errors import RaykitError
from raykit.ordered import in_order
from raykit.store.backends import join_parts
from raykit.store.components import decode_component
from raykit.store.image_codec import header_size, image_format
from raykit.store.order import base_permutation, merge_counts
from raykit.store.points import check_points
from raykit.store.reader import RayStore, open_store
from raykit.store.table import record_problems

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping, Sequence

    from raykit.store.reader import RayStore

__all__ = [
    "BlobCheck",
    "components_check",
    "images_check",
    "validate_store",
]


HEADER_BYTES = 1 << 16  # an image's first bytes, enough for its header unless its metadata is larger


_buffers = threading.local()  # each thread's file buffer (``StoreBytes.read_file_into``)


class BlobCheck:
    """The checks of blobs stored in a store's files, from the bytes the file hashing reads, so that
    each file is read once: an images-layout split's images (``images_check``; docs/format.md, "The
    images layout", **Validation**) or the components' arrays (``components_check``, "Components").

    ``check_file`` hashes one of ``files`` (missing, or not its manifest's size and SHA-256: its blobs
    are then not checked) and checks each blob held whole in it from the bytes read; ``check_rest``
    checks the blobs that span files, once every file is hashed, but those in a file already
    reported. Files are checked on any thread (hashing, CRC-32C and decoding release the GIL).

    Args:
        blobs: each blob's key -> the files holding it.
        check: ``check(key, held)`` -> the blob's problems, one line each (``held``: the file read,
            relative path -> read-only uint8 array; None: read from the store).
    """

    def __init__(
        self,
        store: RayStore,
        blobs: Mapping[Any, Sequence[str]],
        check: Callable[[Any, Mapping[str, np.ndarray] | None], list[str]],
    ) -> None:
        self.store, self._blobs, self._check = store, blobs, check
        self._within: dict[str, list[Any]] = {}  # file -> the blobs held whole in it
        self._spanning: list[Any] = []
        files: dict[str, None] = {}
        for key, held in blobs.items():
            files.update(dict.fromkeys(held))
            if len(held) == 1:
                self._within.setdefault(held[0], []).append(key)
            else:
                self._spanning.append(key)
        self.files: list[str] = list(files)

    def check_file(self, rel: str) -> tuple[str | None, list[str]]:
        """File ``rel``'s own problem or None, and the problems of the blobs held whole in it."""
        size = int(self.store.files.get(rel, {}).get("size", 0))
        buffer = getattr(_buffers, "buffer", None)
        if buffer is None or len(buffer) < size:
            buffer = _buffers.buffer = bytearray(size)
        try:
            data = self.store.storage.read_file_into(rel, buffer)
        except RaykitError as exc:
            return str(exc), []
        return None, [p for key in self._within.get(rel, ()) for p in self._check(key, {rel: data})]

    def check_rest(self, bad_files: Collection[str]) -> list[str]:
        """Problems of the blobs that span files, but those in a file already reported."""
        bad = set(bad_files)
        return [
            p
            for key in self._spanning
            if not bad.intersection(self._blobs[key])
            for p in self._check(key, None)
        ]


def images_check(store: RayStore, split: str, deep: bool = False) -> BlobCheck:
    """The checks of images-layout split ``split``'s images: from the bytes read, each one's CRC-32C
    (so the index and the bytes agree), its format and, from its header, its size; ``deep`` also
    checks its own SHA-256 and decodes it (its size, channels and alpha)."""
    rows = store.split_rows(split)  # what each image is checked against, looked up once
    names = [store.table.names[int(row)] for row in rows]
    sizes = list(zip(store.table.width[rows].tolist(), store.table.height[rows].tolist(), strict=True))
    source_sha = store.table_arrow.column("source_sha256").to_pylist()
    source_shas = [source_sha[int(row)] for row in rows]
    alphas = store.table.has_alpha[rows].tolist()
    entry = store.index[split]

    def check(local: int, held: Mapping[str, np.ndarray] | None) -> list[str]:
        where = f"{store.url}/{store.image_files(split, local)[0]}: image {names[local]!r}"
        try:
            parts = store.reader.image_parts(split, local, held)
            pixels = store.read_split_image(split, local) if deep else None
        except RaykitError as exc:
            return [str(exc)]
        problems = []
        if deep and _sha256(parts) != entry["image_sha256"][local]:
            problems.append(f"{where}: SHA-256 differs from index.json")
        head = _head(parts, HEADER_BYTES)
        if image_format(head) != entry["image_format"][local]:
            problems.append(
                f"{where}: expected a {entry['image_format'][local]} file, got {image_format(head)!r}"
            )
        source_sha = source_shas[local]
        if entry["passthrough"][local] and source_sha and source_sha != entry["image_sha256"][local]:
            problems.append(f"{where}: marked pass-through but differs from its source file's SHA-256")
        expected = sizes[local]
        if pixels is None:
            try:
                size = _header_size(head, parts)
            except Exception as exc:
                return [*problems, f"{where}: unreadable image header ({exc})"]
            if size != expected:
                problems.append(
                    f"{where}: expected {expected[0]}x{expected[1]} pixels, got {size[0]}x{size[1]}"
                )
        elif pixels.shape[2] == 4 and not alphas[local] and (pixels[..., 3] != 255).any():
            problems.append(f"{where}: image without alpha has alpha != 255")
        return problems

    blobs = {local: store.image_files(split, local) for local in range(len(rows))}
    return BlobCheck(store, blobs, check)


def _sha256(parts: Sequence[bytes | np.ndarray]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else part.data)
    return digest.hexdigest()


def _head(parts: Sequence[bytes | np.ndarray], n: int) -> bytes:
    """The first ``n`` bytes of the image that ``parts`` joined give (fewer if it is shorter)."""
    head, held = [], 0
    for part in parts:
        if held >= n:
            break
        head.append(bytes(part[: n - held]))
        held += len(head[-1])
    return b"".join(head)


def _header_size(head: bytes, parts: Sequence[bytes | np.ndarray]) -> tuple[int, int]:
    """(width, height) from the image's header, read from ``head``, its first bytes, or from the
    whole image when the header does not end within them (nothing is decoded)."""
    try:
        return header_size(head)
    except Exception:
        if len(head) == sum(len(part) for part in parts):
            raise
    return header_size(join_parts(parts))


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


def components_check(store: RayStore) -> tuple[BlobCheck, list[str]]:
    """The checks of every component's arrays (docs/format.md, "Components", **Validation**): each
    array's size and CRC-32C, then its ``.npy`` dtype and shape against its camera; and the problems
    found listing them (a malformed record, a count that is not the store's)."""
    problems: list[str] = []
    names, table = store.table.names, store.table
    try:
        components = store.components
    except RaykitError as exc:  # a malformed manifest record
        components, problems = {}, [str(exc)]
    blobs: dict[tuple[str, int], list[str]] = {}
    for component, info in components.items():
        if info.n_images != len(names):
            problems.append(
                f"{store.url}/manifest.json: component {component}: {info.n_images} images, "
                f"the store has {len(names)}"
            )
            continue
        for row in range(len(names)):
            try:
                blobs[component, row] = store.component_reader.files(component, row)
            except RaykitError as exc:
                problems.append(str(exc))
                break

    def check(key: tuple[str, int], held: Mapping[str, np.ndarray] | None) -> list[str]:
        component, row = key
        name = names[row]
        try:
            data, rel = store.component_reader.stored(component, row, held)
            where = f"{store.url}/{rel}: {component} of image {name!r}"
            info = store.components[component]
            decode_component(info, data, int(table.height[row]), int(table.width[row]), where)
        except RaykitError as exc:
            return [str(exc)]
        return []

    return BlobCheck(store, blobs, check), problems
