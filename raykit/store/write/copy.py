"""``raykit copy --layout``: rewrite a store in the other layout (rays <-> images), or an images store in
the other backend (docs/format.md, "Copies").

The copy is written from the source store's own images (``RayStore.read_image``) as image records with
the source's camera table, scene and layout options, by the payload writer of the target layout
(``copy_request``; ``raykit.store.write.copy_store`` runs it). An images store copied to images keeps
every stored file's bytes (``StoreImageLoad.encoded``).
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from raykit.store.image_codec import StoredImage
from raykit.store.reader import join_parts
from raykit.store.schema import ImageRecord
from raykit.store.spec import StoreSpec
from raykit.store.table import order_records
from raykit.store.write.job import WriteRequest

if TYPE_CHECKING:
    from raykit.store.reader import RayStore

__all__ = ["StoreImageLoad", "copy_request", "store_records"]


@dataclass(frozen=True)
class StoreImageLoad:
    """Picklable ``load()`` of one image of a store (reopened by location in worker processes)."""

    url: str
    name: str
    channels: int  # 3 for an image without alpha, whatever the store serves

    def _store(self) -> RayStore:
        from raykit.store.reader import open_store

        return open_store(self.url)

    def __call__(self) -> np.ndarray:
        return np.ascontiguousarray(self._store().read_image(self.name)[..., : self.channels])

    def encoded(self) -> StoredImage | None:
        """The stored file of an images-layout store (kept as is by the images writer), else None."""
        store = self._store()
        row = store.image_index(self.name)
        split = store.table.splits[row]
        local = int(np.searchsorted(store.split_rows(split), row))
        if not store.image_files(split, local):
            return None
        data = join_parts(store.stored_image_parts(split, local))
        entry = store.index[split]
        return StoredImage(data, str(entry["image_format"][local]), bool(entry["passthrough"][local]))


def store_records(store: RayStore) -> list[ImageRecord]:
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


def copy_request(
    store: RayStore,
    dst: Path,
    layout: str,
    backend: str,
    executor: concurrent.futures.Executor | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> WriteRequest:
    """The write of ``store`` into ``layout`` (``rays`` or ``images``) and ``backend`` at ``dst``: its
    images as records, its scene, points, chunking and seed (a rays store copied to rays is copied
    chunk by chunk instead: ``raykit.store.write.rays.copy_rays``); the writer checks ``layout``."""
    kept = store.spec
    source = {k: v for k, v in store.manifest["source"].items() if k != "fingerprint"}
    spec = StoreSpec(
        kind=layout,
        backend=backend,
        chunk_rays=kept.chunk_rays,
        shard_chunks=kept.shard_chunks,
        seed=kept.seed,
    )
    records = order_records(store_records(store))
    return WriteRequest(
        dst, records, store.scene, spec, executor, progress, source, overwrite, store.sparse_points()
    )
