"""A store's JSON-able summary (``raykit info``, the layout measurements, the demo)."""

from __future__ import annotations

from typing import Any

from raykit.store.reader import RayStore

__all__ = ["store_summary"]


def store_summary(store: RayStore) -> dict[str, Any]:
    """JSON-able summary: splits, counts, cameras, bytes on disk, bytes per ray, layout."""
    files = store.files
    payload = sum(
        v["size"] for k, v in files.items() if k.startswith(("zarr/", "wds/")) and "zarr.json" not in k
    )
    total = sum(v["size"] for v in files.values())
    n_rays = sum(info.n_rays for info in store.splits.values())
    table = store.table
    return {
        "store": store.url,
        "backend": store.backend,
        "format_version": store.manifest["format_version"],
        "content_fingerprint": store.fingerprint,
        "splits": {
            name: {**info.to_dict(), "layout": store.layout(name)} for name, info in store.splits.items()
        },
        "fields": {name: spec.to_dict() for name, spec in store.fields.items()},
        "layout": store.manifest["layout"],
        "cameras": {
            "n_images": len(table.names),
            "n_cameras": len(table.cameras),
            "models": sorted({cam.model for cam in table.cameras}),
            "sizes": sorted({f"{cam.width}x{cam.height}" for cam in table.cameras}),
            "with_alpha": int(table.has_alpha.sum()),
        },
        "scene": store.manifest["scene"],
        "points": _points_summary(store),
        "bytes_on_disk": total,
        "payload_bytes": payload,
        "n_rays": n_rays,
        "bytes_per_ray": payload / max(n_rays, 1),
        "images_layout": {  # per images-layout split: stored bytes, pass-through count, formats
            name: {
                "stored_bytes": sum(int(b) for b in store.index[name]["image_bytes"]),
                "passthrough": sum(bool(p) for p in store.index[name]["passthrough"]),
                "formats": sorted(set(store.index[name]["image_format"])),
            }
            for name in store.splits
            if store.layout(name) == "images"
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
