"""Ray loaders: shuffled, cached, resumable, multi-worker and multi-rank batches; evaluation; adapters;
and ``ImageLoader``, whole images for splatting-style trainers.

The names below are imported on first use (PEP 562), so that a worker process, which imports
``raykit.loaders.processes`` and the chunk sources only, starts without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raykit.lazy import lazy_attribute

if TYPE_CHECKING:
    from raykit.loaders.batching import DeviceBatcher, image_rays, ray_generator, reference_batch
    from raykit.loaders.cache import CacheStats, ChunkCache, DiskCache, ImageCache
    from raykit.loaders.config import IMAGE_CACHE_BYTES, RAY_CACHE_BYTES, ImageLoaderConfig, LoaderConfig
    from raykit.loaders.eval import EvalImage, EvalLoader
    from raykit.loaders.images import ImageBatch, ImageLoader, ImagePlan
    from raykit.loaders.levels import level_camera
    from raykit.loaders.loader import RayLoader
    from raykit.loaders.plan import SamplingPlan
    from raykit.loaders.sampling import SamplingConfig
    from raykit.loaders.source import ChunkSource, MemorySource, StoreSource
    from raykit.loaders.torch_adapters import RayDataset, RayIterableDataset, collate_rays
    from raykit.loaders.window import WindowPlan

# module -> the public names it defines (imported on first use)
_PUBLIC = {
    "batching": ("DeviceBatcher", "image_rays", "ray_generator", "reference_batch"),
    "cache": ("CacheStats", "ChunkCache", "DiskCache", "ImageCache"),
    "config": ("IMAGE_CACHE_BYTES", "RAY_CACHE_BYTES", "ImageLoaderConfig", "LoaderConfig"),
    "eval": ("EvalImage", "EvalLoader"),
    "images": ("ImageBatch", "ImageLoader", "ImagePlan"),
    "levels": ("level_camera",),
    "loader": ("RayLoader",),
    "plan": ("SamplingPlan",),
    "sampling": ("SamplingConfig",),
    "source": ("ChunkSource", "MemorySource", "StoreSource"),
    "torch_adapters": ("RayDataset", "RayIterableDataset", "collate_rays"),
    "window": ("WindowPlan",),
}
_MODULES = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = [
    "IMAGE_CACHE_BYTES",
    "RAY_CACHE_BYTES",
    "CacheStats",
    "ChunkCache",
    "ChunkSource",
    "DeviceBatcher",
    "DiskCache",
    "EvalImage",
    "EvalLoader",
    "ImageBatch",
    "ImageCache",
    "ImageLoader",
    "ImageLoaderConfig",
    "ImagePlan",
    "LoaderConfig",
    "MemorySource",
    "RayDataset",
    "RayIterableDataset",
    "RayLoader",
    "SamplingConfig",
    "SamplingPlan",
    "StoreSource",
    "WindowPlan",
    "collate_rays",
    "image_rays",
    "level_camera",
    "ray_generator",
    "reference_batch",
]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _MODULES, globals(), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
