"""Write a store: ``write_store`` (from image records, converters) and ``copy_store`` (from another
store, ``raykit copy``), the one entry point of every layout.

``StoreSpec.kind`` picks the payload writer: ``raykit.store.write.rays`` (pre-shuffled rays) or
``raykit.store.write.images`` (the encoded images); both end in ``raykit.store.write.commit``. Each holds
``dst``'s writer lock (``raykit.locks``).

``raykit copy --layout`` rewrites a store in the other layout (rays <-> images), or an images store in
the other backend (docs/format.md, "Copies"), from the source store's own images (``RayStore.read_image``)
as image records with the source's camera table, scene and chunking (``store_records``), by the payload
writer of the target layout. An images store copied to images keeps every stored file's bytes
(``StoreImageLoad.encoded``). A rays store copied to rays is copied chunk by chunk (``copy_rays``).

Object storage (``s3://bucket/scene`` or any writable fsspec URL; docs/format.md, "Object storage"):
written locally by the ordinary writers in a work folder derived from the URL (so a rerun resumes it),
then uploaded file by file with ``manifest.json`` last (until it is there, readers see no store);
``overwrite`` deletes the old manifest first. The local copy is removed after the upload.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import ConfigError, StoreError
from raykit.fileio import atomic_write_json
from raykit.locks import holding_store_lock, store_lock
from raykit.progress import progress as progress_bar
from raykit.store.backends import join_parts
from raykit.store.components import ComponentInfo
from raykit.store.files import OVERWRITE_HINT, filesystem, is_url, json_digest, read_errors
from raykit.store.image_codec import StoredImage
from raykit.store.points import SparsePoints
from raykit.store.reader import RayStore, open_store
from raykit.store.schema import ImageRecord, SceneInfo
from raykit.store.spec import IMAGES_LAYOUT, RAYS_LAYOUT, StoreSpec, holds_images
from raykit.store.table import order_records
from raykit.store.write.commit import PayloadWrite
from raykit.store.write.components import write_component
from raykit.store.write.images import write_images
from raykit.store.write.rays import copy_rays, write_rays

__all__ = [
    "StoreImageLoad",
    "add_component",
    "add_components",
    "copy_store",
    "store_records",
    "upload_store",
    "work_folder",
    "write_remote",
    "write_store",
]


# the payload writer of each layout (``StoreSpec.kind``)
_PAYLOAD_WRITERS: dict[str, Callable[[PayloadWrite, StoreSpec], RayStore]] = {
    RAYS_LAYOUT: write_rays,
    IMAGES_LAYOUT: write_images,
}


_O = StoreSpec  # every default of write_store's options is StoreSpec's, written there once


@holding_store_lock("dst")  # one writer per store (raykit.locks)
def write_store(
    dst: str | Path,
    records: Sequence[ImageRecord],
    *,
    scene: SceneInfo,
    layout: str = _O.kind,
    backend: str = _O.backend,
    chunk_rays: int = _O.chunk_rays,
    shard_chunks: int = _O.shard_chunks,
    seed: int = _O.seed,
    materialize: str | None = _O.materialize,
    rgba_codec: str = _O.rgba_codec,
    image_codec: str = _O.image_codec,
    zstd_level: int = _O.zstd_level,
    with_pids: bool = _O.with_pids,
    memory_staging_bytes: int = _O.memory_staging_bytes,
    executor: concurrent.futures.Executor | None = None,
    progress: bool = False,
    source: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    points: SparsePoints | None = None,
    components: Sequence[ComponentInfo] = (),
) -> RayStore:
    """Write a store at ``dst`` from ``records`` and return it opened (a ``RayStore``).

    Args:
        records: one per image; ``load()`` must be picklable when ``executor`` is a process pool.
        scene: world frame, transform from the source frame, bounds.
        layout, backend, chunk_rays, ...: how the store is written, the fields of
            :class:`~raykit.store.spec.StoreSpec` (their defaults and checks; ``layout`` is its ``kind``).
        executor: runs the per-image and per-shard tasks; None runs them in this process.
        source: description of the source (format, path, ...) recorded in the manifest.
        overwrite: replace an existing store at ``dst``.
        points: sparse 3-D points in the store's world frame, stored as ``points3D.parquet``
            (``raykit.store.schema``).
        components: the per-image components to store (``ComponentInfo``: name, dtype, unit, scale),
            each record's ``components[name]()`` giving its array; records' ``metadata`` is kept as
            per-frame metadata (``raykit.store.components``).
    """
    spec = StoreSpec(
        kind=layout,
        backend=backend,
        chunk_rays=chunk_rays,
        shard_chunks=shard_chunks,
        seed=seed,
        materialize=materialize,
        rgba_codec=rgba_codec,
        image_codec=image_codec,
        zstd_level=zstd_level,
        with_pids=with_pids,
        memory_staging_bytes=memory_staging_bytes,
    )
    tasks: dict[str, Any] = {"executor": executor, "progress": progress, "overwrite": overwrite}
    ordered, source = order_records(records), dict(source or {})
    job = PayloadWrite(Path(dst), ordered, scene, source, points, **tasks, components=tuple(components))
    return _PAYLOAD_WRITERS[spec.kind](job, spec)


@holding_store_lock("dst")
def copy_store(
    src: str | Path,
    dst: str | Path,
    *,
    backend: str,
    executor: concurrent.futures.Executor | None = None,
    progress: bool = False,
    overwrite: bool = False,
    layout: str | None = None,
    with_pids: bool = False,
) -> RayStore:
    """Copy the store at ``src`` (path or URL) to ``dst`` in ``backend``; same logical content.

    The copy keeps the chunk and shard layout, the camera table, scene and source description, so its
    content fingerprint equals the source's. ``layout`` (``rays`` or ``images``; default: the
    source's) rewrites it in that layout from the source's images (``store_records``).
    ``with_pids`` stores every split's pids explicitly (a format-3 store derives them). A copy of a
    format 1 or 2 store is written in the current format, its pids stored, its chunk checksums
    computed anew: its content fingerprint is the same in every backend but not the source's.
    """
    store = open_store(src)
    layout = layout or store.layout()
    tasks: dict[str, Any] = {"executor": executor, "progress": progress, "overwrite": overwrite}
    # a copy carries the source's components and per-frame metadata (``raykit.store.components``)
    if layout == store.layout() and not holds_images(layout):  # rays to rays: chunk by chunk
        spec = store.spec.replace(backend=backend)
        return copy_rays(store, Path(dst), spec, **tasks, with_pids=with_pids, extras_from=store)
    kept = store.spec  # its chunking and seed, in the target layout and backend (checked there)
    spec = StoreSpec(
        kind=layout,
        backend=backend,
        chunk_rays=kept.chunk_rays,
        shard_chunks=kept.shard_chunks,
        seed=kept.seed,
    )
    source = {k: v for k, v in store.manifest["source"].items() if k != "fingerprint"}
    records = order_records(store_records(store))
    points = store.sparse_points()
    job = PayloadWrite(Path(dst), records, store.scene, source, points, **tasks, extras_from=store)
    return _PAYLOAD_WRITERS[layout](job, spec)


@dataclass(frozen=True)
class StoreImageLoad:
    """Picklable ``load()`` of one image of a store (reopened by location in worker processes)."""

    url: str
    name: str
    channels: int  # 3 for an image without alpha, whatever the store serves

    def __call__(self) -> np.ndarray:
        return np.ascontiguousarray(open_store(self.url).read_image(self.name)[..., : self.channels])

    def encoded(self) -> StoredImage | None:
        """The stored file of an images-layout store (kept as is by the images writer), else None."""
        store = open_store(self.url)
        row = store.image_index(self.name)
        split = store.table.splits[row]
        local = int(np.searchsorted(store.split_rows(split), row))
        if not store.image_files(split, local):
            return None
        data = join_parts(store.reader.image_parts(split, local))
        entry = store.index[split]
        return StoredImage(data, str(entry["image_format"][local]), bool(entry["passthrough"][local]))


def store_records(store: RayStore) -> list[ImageRecord]:
    """One image record per camera-table row of ``store``, loading from the store."""
    table, d = store.table, store.table_arrow.to_pydict()
    records = []
    for i, name in enumerate(table.names):
        channels = 4 if table.has_alpha[i] else 3
        camera = table.cameras[int(table.camera_index[i])]
        load = StoreImageLoad(store.url, name, channels)
        near, far, path, sha = d["near"][i], d["far"][i], d["source_path"][i], d["source_sha256"][i]
        timing = {k: d[k][i] for k in ("time", "camera_index", "frame_index") if k in d}
        records.append(
            ImageRecord(
                name, table.splits[i], camera, table.c2w[i].copy(), near, far, path, load, sha, **timing
            )
        )
    return records


def add_component(
    path: str | Path,
    name: str,
    load: Callable[[str, int, int], np.ndarray],
    *,
    dtype: str = "",
    unit: str = "",
    scale: float = 1.0,
    source: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> RayStore:
    """Add component ``name`` to the committed local store at ``path`` without touching its pixels:
    its files are written (each atomically), then the manifest is rewritten last with the component
    in ``components`` and its files in ``files``; the content (pixel) fingerprint is unchanged, the
    store fingerprint records the component. Holds the store's writer lock.

    Args:
        load: ``load(image name, height, width)`` -> the image's array at its stored size.

    Raises:
        ConfigError: a remote store, or one that has the component already.
        SourceError: an array of the wrong size or values (one line naming the image); the store is
            unchanged.
    """
    info = ComponentInfo(name, dtype, unit, scale, source=dict(source or {}))
    return add_components(path, [info], lambda _, *image: load(*image), progress=progress)


def add_components(
    path: str | Path,
    infos: Sequence[ComponentInfo],
    load: Callable[[str, str, int, int], np.ndarray],
    *,
    progress: bool = False,
) -> RayStore:
    """Add the components ``infos`` to the committed local store at ``path`` as :func:`add_component`
    adds one: every component's files, then one manifest with all of them (none if any fails).

    Args:
        load: ``load(component, image name, height, width)`` -> that component's array of the image
            at its stored size (``raykit.store.components.component_shape``).
    """
    if is_url(str(path)):
        raise ConfigError(f"{path}: add-component writes local stores only")
    store = open_store(path)
    root = Path(store.url)
    with store_lock(root):
        store = open_store(root)  # as committed now, under the lock
        for info in infos:
            if info.name in store.components:
                raise ConfigError(f"{store.url}: the store has a {info.name} component already")
        table = store.table
        images = [
            (table.names[r], table.splits[r], int(table.height[r]), int(table.width[r]))
            for r in range(len(table.names))
        ]
        present = set(root.rglob("*"))
        written: dict[str, Any] = {}
        done = {}
        try:
            for info in infos:
                bar = functools.partial(
                    progress_bar, total=len(images), desc=f"add {info.name}", unit="image",
                    disable=not progress,
                )  # fmt: skip
                done[info.name], files = write_component(
                    root, store.backend, info, images,
                    functools.partial(_load_row, load, info.name, images), bar,
                )  # fmt: skip
                written.update(files)
        except BaseException:  # a file that fails only when decoded: leave no stray file behind
            for path in sorted(set(root.rglob("*")) - present, key=lambda p: -len(p.parts)):
                path.rmdir() if path.is_dir() else path.unlink()
            raise
        manifest = {k: v for k, v in store.manifest.items() if k != "manifest_digest"}
        manifest["files"] = dict(sorted({**manifest["files"], **written}.items()))
        manifest["components"] = {
            **manifest.get("components", {}),
            **{k: v.to_dict() for k, v in done.items()},
        }
        manifest["manifest_digest"] = json_digest(manifest)
        atomic_write_json(root / "manifest.json", manifest)
    return open_store(root)


def _load_row(load: Callable[..., np.ndarray], name: str, images: Sequence[tuple[str, str, int, int]],
              row: int) -> np.ndarray:  # fmt: skip
    image, _, height, width = images[row]
    return load(name, image, height, width)


# Object storage: written locally, then uploaded with the manifest last.


def work_folder(url: str) -> Path:
    """The local folder a store for ``url`` is written in before its upload (stable across reruns)."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"raykit-upload-{digest}"


def upload_store(local: Path, url: str, *, overwrite: bool = False) -> list[str]:
    """Upload the committed store at ``local`` to ``url``, ``manifest.json`` last; the uploaded
    relative paths in upload order.

    Raises:
        ConfigError: a store exists at ``url`` and ``overwrite`` is False.
        StoreError: the object store refused a write (naming the object).
    """
    if not (local / "manifest.json").is_file():
        raise ConfigError(f"{local}: not a committed store (no manifest.json); nothing to upload")
    fs, root = filesystem(url)
    root = root.rstrip("/")
    if fs.exists(f"{root}/manifest.json"):
        if not overwrite:
            raise ConfigError(f"{url}: a store already exists there ({OVERWRITE_HINT})")
        fs.rm(f"{root}/manifest.json")  # the old store disappears first
        fs.rm(root, recursive=True)
    files = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    order = [rel for rel in files if rel != "manifest.json"] + ["manifest.json"]
    for rel in order:
        try:
            fs.put_file(str(local / rel), f"{root}/{rel}")
        except read_errors() as exc:
            raise StoreError(f"{url}/{rel}: upload failed ({type(exc).__name__}: {exc})") from None
    return order


def write_remote(url: str, write: Callable[[Path], Any], *, overwrite: bool = False) -> Any:
    """Run ``write(local_dst)`` (a store writer), upload its store to ``url`` and open it there."""
    fs, root = filesystem(url)
    if fs.exists(f"{root.rstrip('/')}/manifest.json") and not overwrite:
        raise ConfigError(f"{url}: a store already exists there ({OVERWRITE_HINT})")
    folder = work_folder(url)
    local = folder / "store"
    if local.exists() and (local / "manifest.json").exists():
        shutil.rmtree(local)  # an earlier upload's finished copy: write again (inputs may differ)
    write(local)
    upload_store(local, url, overwrite=overwrite)
    shutil.rmtree(folder, ignore_errors=True)
    return open_store(url)
