"""``raykit validate`` of an images-layout split: every stored image's bytes, format, size and channels."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from raykit.errors import RaykitError
from raykit.store.image_codec import image_format

if TYPE_CHECKING:
    from raykit.store.reader import RayStore

__all__ = ["check_images_split"]


def check_images_split(store: RayStore, split: str, bad_files: set[str]) -> list[str]:
    """One line per problem of ``split``'s stored images (a file already reported is not again): the
    checks of docs/format.md, "The images layout", **Validation**."""
    entry, problems = store.index[split], []
    rows = store.split_rows(split)
    for local, row in enumerate(rows):
        name = store.table.names[int(row)]
        files = store.image_files(split, local)
        where = f"{store.url}/{files[0]}: image {name!r}"
        try:
            data = store.stored_image(split, local)
            pixels = store.read_split_image(split, local)
        except RaykitError as exc:
            if not bad_files.intersection(files):
                problems.append(str(exc))
            continue
        if hashlib.sha256(data).hexdigest() != entry["image_sha256"][local]:
            problems.append(f"{where}: SHA-256 differs from index.json")
        if image_format(data) != entry["image_format"][local]:
            problems.append(
                f"{where}: expected a {entry['image_format'][local]} file, got {image_format(data)!r}"
            )
        source_sha = store.cameras.column("source_sha256")[int(row)].as_py()
        if entry["passthrough"][local] and source_sha and source_sha != entry["image_sha256"][local]:
            problems.append(f"{where}: marked pass-through but differs from its source file's SHA-256")
        if pixels.shape[2] == 4 and not store.table.has_alpha[int(row)] and (pixels[..., 3] != 255).any():
            problems.append(f"{where}: image without alpha has alpha != 255")
    return problems
