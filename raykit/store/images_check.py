"""``raykit validate`` of an images-layout split: every stored image's bytes, format, size and channels."""

from __future__ import annotations

import hashlib
import io
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from raykit.errors import RaykitError
from raykit.store.image_codec import image_format

if TYPE_CHECKING:
    from raykit.store.reader import RayStore

__all__ = ["check_images_split"]


def check_images_split(
    store: RayStore, split: str, bad_files: set[str], deep: bool = False, threads: int = 1
) -> list[str]:
    """One line per problem of ``split``'s stored images (a file already reported is not again): the
    checks of docs/format.md, "The images layout", **Validation**. Each image's bytes are checked
    against their CRC-32C (their files' SHA-256 already checked), its format and, from its header,
    its size; ``deep`` also checks its own SHA-256 and decodes it (its size, channels and alpha).
    Images are checked on ``threads`` threads (hashing and decoding release the GIL)."""
    rows = store.split_rows(split)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        found = pool.map(lambda local: _check_image(store, split, local, bad_files, deep), range(len(rows)))
        return [problem for problems in found for problem in problems]


def _check_image(store: RayStore, split: str, local: int, bad_files: set[str], deep: bool) -> list[str]:
    entry, row = store.index[split], int(store.split_rows(split)[local])
    name = store.table.names[row]
    files = store.image_files(split, local)
    where = f"{store.url}/{files[0]}: image {name!r}"
    try:
        data = store.stored_image(split, local)
        pixels = store.read_split_image(split, local) if deep else None
    except RaykitError as exc:
        return [] if bad_files.intersection(files) else [str(exc)]
    problems = []
    if deep and hashlib.sha256(data).hexdigest() != entry["image_sha256"][local]:
        problems.append(f"{where}: SHA-256 differs from index.json")
    if image_format(data) != entry["image_format"][local]:
        problems.append(
            f"{where}: expected a {entry['image_format'][local]} file, got {image_format(data)!r}"
        )
    source_sha = store.cameras.column("source_sha256")[row].as_py()
    if entry["passthrough"][local] and source_sha and source_sha != entry["image_sha256"][local]:
        problems.append(f"{where}: marked pass-through but differs from its source file's SHA-256")
    expected = (int(store.table.width[row]), int(store.table.height[row]))
    if pixels is None:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as header:  # the header only: nothing is decoded
                size = header.size
        except Exception as exc:
            return [*problems, f"{where}: unreadable image header ({exc})"]
        if size != expected:
            problems.append(f"{where}: expected {expected[0]}x{expected[1]} pixels, got {size[0]}x{size[1]}")
    elif pixels.shape[2] == 4 and not store.table.has_alpha[row] and (pixels[..., 3] != 255).any():
        problems.append(f"{where}: image without alpha has alpha != 255")
    return problems
