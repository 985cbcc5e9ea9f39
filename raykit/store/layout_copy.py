"""``raykit copy --layout``: rewrite a store in the other layout (rays <-> images), or an images store in
the other backend.

The copy is written from the source store's own images (``RayStore.read_image``) as image records with
the source's camera table, scene and layout options, through the writer of the target layout. An
images store copied to images keeps every stored file's bytes (and so its content fingerprint, whatever
the backend); a copy to the images layout re-encodes losslessly unless the capture's original file is
still at its recorded path with its recorded SHA-256 and passes through. The source fingerprint
(``manifest.source.fingerprint``: names, source hashes, decoded pixel CRCs) is the same in every copy.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import ConfigError
from raykit.store.image_codec import StoredImage
from raykit.store.images_layout import IMAGES_LAYOUT, LAYOUTS, store_layout
from raykit.store.images_read import images_reader
from raykit.store.schema import ImageRecord

__all__ = ["StoreImageLoad", "copy_layout", "store_records"]


@dataclass(frozen=True)
class StoreImageLoad:
    """Picklable ``load()`` of one image of a store (reopened by location in worker processes)."""

    url: str
    name: str
    channels: int  # 3 for an image without alpha, whatever the store serves

    def _store(self) -> Any:
        from raykit.store.reader import open_store

        return open_store(self.url)

    def __call__(self) -> np.ndarray:
        return np.ascontiguousarray(self._store().read_image(self.name)[..., : self.channels])

    def encoded(self) -> StoredImage | None:
        """The stored file of an images-layout store (kept as is by the images writer), else None."""
        store = self._store()
        row = store.image_index(self.name)
        split = store.table.splits[row]
        if store.layout(split) != IMAGES_LAYOUT:
            return None
        local = [i for i, s in enumerate(store.table.splits) if s == split].index(row)
        entry = store.index[split]
        data = images_reader(store).image_bytes(split, local)
        return StoredImage(data, str(entry["image_format"][local]), bool(entry["passthrough"][local]))


def store_records(store: Any) -> list[ImageRecord]:
    """One image record per camera-table row of ``store``, loading from the store."""
    table, d = store.table, store.cameras.to_pydict()
    records = []
    for i, name in enumerate(table.names):
        channels = 4 if table.has_alpha[i] else 3
        camera = table.cameras[int(table.camera_index[i])]
        load = StoreImageLoad(store.url, name, channels)
        near, far, path, sha = d["near"][i], d["far"][i], d["source_path"][i], d["source_sha256"][i]
        records.append(
            ImageRecord(name, table.splits[i], camera, table.c2w[i].copy(), near, far, path, load, sha)
        )
    return records


def copy_layout(
    src: str | Path,
    dst: str | Path,
    *,
    backend: str,
    layout: str,
    executor: concurrent.futures.Executor | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> Any:
    """Copy the store at ``src`` into ``layout`` (``rays`` or ``images``) and ``backend`` at ``dst``.

    Called by :func:`raykit.store.writer.copy_store`, which holds ``dst``'s writer lock: the writers
    are called without taking it again.
    """
    from raykit.store.reader import open_store

    if layout not in LAYOUTS:
        raise ConfigError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    store = open_store(src)
    options = dict(store.manifest["layout"])
    source = {k: v for k, v in store.manifest["source"].items() if k != "fingerprint"}
    common: dict[str, Any] = {
        "scene": store.scene, "backend": backend, "chunk_rays": int(options["chunk_rays"]),
        "shard_chunks": int(options["shard_chunks"]), "seed": int(options["seed"]), "executor": executor,
        "progress": progress, "source": source, "overwrite": overwrite, "points": store.sparse_points(),
    }  # fmt: skip
    records = store_records(store)
    if layout == IMAGES_LAYOUT:
        from raykit.store.images_writer import write_images_store

        return write_images_store.__wrapped__(dst, records, **common)  # type: ignore[attr-defined]
    from raykit.store.writer import write_store

    if store_layout(store.manifest) == "rays":
        common["rgba_codec"] = options.get("rgba_codec", "zstd")
        common["zstd_level"] = int(options.get("zstd_level", 3))
        common["materialize"] = options.get("materialize")
    return write_store.__wrapped__(dst, records, **common)  # type: ignore[attr-defined]
