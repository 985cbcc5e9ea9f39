"""``raykit validate`` of an images-layout split: every stored image's bytes, format, size and channels,
checked from its files' bytes as they are hashed, so that each file is read once (``ImagesCheck``)."""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING

import numpy as np

from raykit.errors import RaykitError
from raykit.store.image_codec import header_size, image_format
from raykit.store.images_layout import join_parts

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    from raykit.store.reader import RayStore

__all__ = ["ImagesCheck"]

HEADER_BYTES = 1 << 16  # an image's first bytes, enough for its header unless its metadata is larger
_buffers = threading.local()  # each thread's file buffer (``RayStore.read_file_into``)


class ImagesCheck:
    """The checks of one images-layout split (docs/format.md, "The images layout", **Validation**).

    ``check_file`` hashes one of the split's ``files`` and checks each image held whole in it from the
    bytes read: its CRC-32C (so the index and the bytes agree), its format and, from its header, its
    size; ``deep`` also checks its own SHA-256 and decodes it (its size, channels and alpha).
    ``check_rest`` checks the images that span two files, once every file is hashed. Files are
    checked on any thread (hashing, CRC-32C and decoding release the GIL).
    """

    def __init__(self, store: RayStore, split: str, deep: bool = False) -> None:
        self.store, self.split, self.deep = store, split, deep
        self._within: dict[str, list[int]] = {}  # file -> the images held whole in it
        self._spanning: list[int] = []
        files: dict[str, None] = {}
        for local in range(len(store.split_rows(split))):
            held = store.image_files(split, local)
            files.update(dict.fromkeys(held))
            if len(held) == 1:
                self._within.setdefault(held[0], []).append(local)
            else:
                self._spanning.append(local)
        self.files: list[str] = list(files)
        rows = store.split_rows(split)  # what each image is checked against, looked up once
        self._names = [store.table.names[int(row)] for row in rows]
        self._sizes = list(
            zip(store.table.width[rows].tolist(), store.table.height[rows].tolist(), strict=True)
        )
        source_sha = store.cameras.column("source_sha256").to_pylist()
        self._source_sha = [source_sha[int(row)] for row in rows]
        self._alpha = store.table.has_alpha[rows].tolist()

    def check_file(self, rel: str) -> tuple[str | None, list[str]]:
        """File ``rel``'s own problem (missing, or not its manifest's size and SHA-256: its images are
        then not checked) or None, and the problems of the images held whole in it."""
        size = int(self.store.files.get(rel, {}).get("size", 0))
        buffer = getattr(_buffers, "buffer", None)
        if buffer is None or len(buffer) < size:
            buffer = _buffers.buffer = bytearray(size)
        try:
            data = self.store.read_file_into(rel, buffer)
        except RaykitError as exc:
            return str(exc), []
        return None, [p for local in self._within.get(rel, ()) for p in self._check_image(local, {rel: data})]

    def check_rest(self, bad_files: Collection[str]) -> list[str]:
        """Problems of the images that span files, but those in a file already reported."""
        return [
            problem
            for local in self._spanning
            if not set(bad_files).intersection(self.store.image_files(self.split, local))
            for problem in self._check_image(local, None)
        ]

    def _check_image(self, local: int, held: Mapping[str, np.ndarray] | None) -> list[str]:
        store, split, entry = self.store, self.split, self.store.index[self.split]
        where = f"{store.url}/{store.image_files(split, local)[0]}: image {self._names[local]!r}"
        try:
            parts = store.stored_image_parts(split, local, held)
            pixels = store.read_split_image(split, local) if self.deep else None
        except RaykitError as exc:
            return [str(exc)]
        problems = []
        if self.deep and _sha256(parts) != entry["image_sha256"][local]:
            problems.append(f"{where}: SHA-256 differs from index.json")
        head = _head(parts, HEADER_BYTES)
        if image_format(head) != entry["image_format"][local]:
            problems.append(
                f"{where}: expected a {entry['image_format'][local]} file, got {image_format(head)!r}"
            )
        source_sha = self._source_sha[local]
        if entry["passthrough"][local] and source_sha and source_sha != entry["image_sha256"][local]:
            problems.append(f"{where}: marked pass-through but differs from its source file's SHA-256")
        expected = self._sizes[local]
        if pixels is None:
            try:
                size = _header_size(head, parts)
            except Exception as exc:
                return [*problems, f"{where}: unreadable image header ({exc})"]
            if size != expected:
                problems.append(
                    f"{where}: expected {expected[0]}x{expected[1]} pixels, got {size[0]}x{size[1]}"
                )
        elif pixels.shape[2] == 4 and not self._alpha[local] and (pixels[..., 3] != 255).any():
            problems.append(f"{where}: image without alpha has alpha != 255")
        return problems


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
