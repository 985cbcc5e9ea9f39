"""The ray store: one logical format (``docs/format.md``) with Zarr v3 and WebDataset backends.

This package is the store's one public face: code outside it imports these names from
``raykit.store``, never from its modules (``tests/test_package.py`` checks it). The reading side is
imported with the package; the writing side (``write_store``, ``copy_store``),
validation and summaries are imported on first use (PEP 562), so that reading a store
(``raykit info``, the loaders, worker processes) does not pay for the writer's imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raykit.errors import RayRangeError
from raykit.lazy import lazy_attribute
from raykit.store.components import COMPONENT_DTYPES, COMPONENTS, ComponentInfo
from raykit.store.files import is_url
from raykit.store.points import SparsePoints
from raykit.store.reader import RayStore, Timed, open_store
from raykit.store.schema import (
    FORMAT_VERSION,
    FieldSpec,
    FrameTime,
    ImageRecord,
    RawRays,
    SceneInfo,
    SplitInfo,
    decode_pids,
    encode_pids,
)
from raykit.store.spec import (
    BACKENDS,
    DEFAULT_CHUNK_RAYS,
    DEFAULT_SHARD_CHUNKS,
    IMAGE_CODECS,
    IMAGES_LAYOUT,
    LAYOUTS,
    RAYS_LAYOUT,
    RGBA_CODEC,
    RGBA_CODECS,
    StoreSpec,
    holds_images,
)

if TYPE_CHECKING:
    from raykit.store.summary import field_bytes, payload_bytes, store_summary
    from raykit.store.validate import validate_store
    from raykit.store.write import (
        add_component,
        add_components,
        copy_store,
        work_folder,
        write_remote,
        write_store,
    )
    from raykit.store.write.tasks import format_phases

# module -> the public names it defines that are imported on first use
_LAZY = {
    "summary": ("field_bytes", "payload_bytes", "store_summary"),
    "validate": ("validate_store",),
    "write": ("add_component", "add_components", "copy_store", "work_folder", "write_remote", "write_store"),
    "write.tasks": ("format_phases",),
}
_MODULES = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _MODULES, globals(), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "BACKENDS",
    "COMPONENTS",
    "COMPONENT_DTYPES",
    "DEFAULT_CHUNK_RAYS",
    "DEFAULT_SHARD_CHUNKS",
    "FORMAT_VERSION",
    "IMAGES_LAYOUT",
    "IMAGE_CODECS",
    "LAYOUTS",
    "RAYS_LAYOUT",
    "RGBA_CODEC",
    "RGBA_CODECS",
    "ComponentInfo",
    "FieldSpec",
    "FrameTime",
    "ImageRecord",
    "RawRays",
    "RayRangeError",
    "RayStore",
    "SceneInfo",
    "SparsePoints",
    "SplitInfo",
    "StoreSpec",
    "Timed",
    "add_component",
    "add_components",
    "copy_store",
    "decode_pids",
    "encode_pids",
    "field_bytes",
    "format_phases",
    "holds_images",
    "is_url",
    "open_store",
    "payload_bytes",
    "store_summary",
    "validate_store",
    "work_folder",
    "write_remote",
    "write_store",
]
