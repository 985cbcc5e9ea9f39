"""What a store holds: its JSON-able summary (``store_summary``: ``raykit info``, the layout
measurements, the demo) and its bytes on disk, per split and field (whether it is sound:
``raykit.store.validate``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from raykit.store.backends import backend_named
from raykit.store.components import component_files
from raykit.store.files import local_files_bytes
from raykit.store.reader import RayStore
from raykit.store.table import CameraTable

__all__ = [
    "component_bytes",
    "field_bytes",
    "payload_bytes",
    "source_image_bytes",
    "store_summary",
    "time_summary",
]


def field_bytes(store: RayStore) -> dict[str, dict[str, int]]:
    """Payload bytes per split and stored field, ``{split: {field: bytes}}`` (``Backend.field_bytes``;
    components are counted apart, ``component_bytes``)."""
    skip = component_files(store.files)
    files = {rel: entry for rel, entry in store.files.items() if rel not in skip}
    return backend_named(store.backend).field_bytes(store.splits, files, store.index)


def component_bytes(store: RayStore) -> int:
    """Bytes on disk of the component files (payload, zarr metadata and index files)."""
    return sum(int(store.files[rel]["size"]) for rel in component_files(store.files))


def payload_bytes(store: RayStore) -> int:
    """Bytes of the payload files (shards; no metadata), whatever the backend and layout."""
    return sum(size for counts in field_bytes(store).values() for size in counts.values())


def source_image_bytes(store: RayStore) -> int | None:
    """Bytes of the source image files: as recorded when the store was written, else the sizes of
    the camera table's ``source_path`` files when they are all local files; None when unknown."""
    recorded = store.manifest.get("source", {}).get("image_bytes")
    if recorded is not None:
        return int(recorded)
    return local_files_bytes(store.table_arrow.column("source_path").to_pylist())


def store_summary(store: RayStore) -> dict[str, Any]:
    """JSON-able summary: splits, counts, cameras, bytes on disk, bytes per ray (in all and per
    field), the ratio of store bytes to source image bytes, the spec."""
    files = store.files
    payload = payload_bytes(store)
    total = sum(v["size"] for v in files.values())
    n_rays = sum(info.n_rays for info in store.splits.values())
    table = store.table
    per_split = field_bytes(store)
    per_field: dict[str, int] = {}
    for counts in per_split.values():
        for name, size in counts.items():
            per_field[name] = per_field.get(name, 0) + size
    source_bytes = source_image_bytes(store)
    return {
        "store": store.url,
        "backend": store.backend,
        "format_version": store.manifest["format_version"],
        "content_fingerprint": store.fingerprint,
        "store_fingerprint": store.store_fingerprint,
        "components": {name: info.to_dict() for name, info in store.components.items()},
        "frame_metadata": store.manifest.get("frame_metadata"),
        "component_bytes": component_bytes(store),
        "splits": {
            name: {**info.to_dict(), "holds_images": info.holds_images} for name, info in store.splits.items()
        },
        "fields": {name: spec.to_dict() for name, spec in store.fields.items()},
        "spec": store.spec.to_dict(),
        "cameras": {
            "n_images": len(table.names),
            "n_cameras": len(table.camera_keys),
            "models": sorted({key[0] for key in table.camera_keys}),
            "sizes": sorted({f"{key[1]}x{key[2]}" for key in table.camera_keys}),
            "with_alpha": int(table.has_alpha.sum()),
        },
        "scene": store.manifest["scene"],
        "time": time_summary(store.table),
        "points": _points_summary(store),
        "bytes_on_disk": total,
        "payload_bytes": payload,
        "n_rays": n_rays,
        "bytes_per_ray": payload / max(n_rays, 1),
        "field_bytes": per_split,
        "bytes_per_ray_by_field": {name: size / max(n_rays, 1) for name, size in per_field.items()},
        "split_bytes_per_ray": {
            name: {k: v / max(store.splits[name].n_rays, 1) for k, v in counts.items()}
            for name, counts in per_split.items()
        },
        "source_image_bytes": source_bytes,
        "store_to_source": None if not source_bytes else total / source_bytes,
        "images_layout": {  # per images-layout split: stored bytes, pass-through count, formats
            name: {
                "stored_bytes": sum(int(b) for b in store.index[name]["image_bytes"]),
                "passthrough": sum(bool(p) for p in store.index[name]["passthrough"]),
                "formats": sorted(set(store.index[name]["image_format"])),
            }
            for name in store.splits
            if store.splits[name].holds_images
        },
    }


def _points_summary(store: RayStore) -> dict[str, Any] | None:
    """Count, world-frame bounds and mean track length of the sparse points, or None."""
    points = store.sparse_points()
    if points is None:
        return None
    n = len(points)
    return {
        "file": store.manifest["points"]["path"],
        "n_points": n,
        "bounds": [points.xyz.min(axis=0).tolist(), points.xyz.max(axis=0).tolist()] if n else None,
        "mean_track_length": float(points.track_length.mean()) if n else 0.0,
        "mean_error": float(points.error.mean()) if n else 0.0,
    }


def time_summary(table: CameraTable) -> dict[str, Any] | None:
    """The time span of a store with time, its instants (distinct times), and ``[min, max]`` frames
    per camera and cameras per instant; None for a static store. Cameras are the rig cameras
    (``camera_index``) when the store has them, else the distinct poses and intrinsics (``by``)."""
    if table.time is None:
        return None
    by = "camera_index" if table.rig_camera is not None else "pose"
    if table.rig_camera is not None:
        camera = table.rig_camera
    else:
        keys = np.concatenate([table.c2w.reshape(len(table.time), 16), table.camera_index[:, None]], axis=1)
        camera = np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1)
    per_camera = np.unique(camera, return_counts=True)[1]
    per_instant = np.unique(table.time, return_counts=True)[1]
    return {
        "span": [float(table.time.min()), float(table.time.max())],
        "n_instants": len(per_instant),
        "n_cameras": len(per_camera),
        "cameras_by": by,
        "frames_per_camera": [int(per_camera.min()), int(per_camera.max())],
        "cameras_per_instant": [int(per_instant.min()), int(per_instant.max())],
    }
