"""Checks of the blobs a store's files hold, from the bytes the file hashing reads (``validate_store``
reads each file once): an images-layout split's images (``images_check``) and the components' arrays
(``components_check``), both ``BlobCheck``s.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from raykit.errors import RaykitError
from raykit.store.backends import join_parts
from raykit.store.components import decode_component
from raykit.store.image_codec import header_size, image_format
from raykit.store.reader import RayStore

__all__ = ["HEADER_BYTES", "BlobCheck", "components_check", "images_check"]

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
        sha = entry["image_sha256"][local]  # a pixel file's may be "": its shard file's covers it
        if deep and (sha or entry["image_format"][local] != "rkpx") and _sha256(parts) != sha:
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
