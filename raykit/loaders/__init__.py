"""Ray loaders: shuffled, cached, resumable, multi-worker and multi-rank batches; evaluation; adapters;
and ``ImageLoader``, whole images for splatting-style trainers."""

from raykit.loaders.cache import CacheStats, ChunkCache, DiskCache, ImageCache
from raykit.loaders.config import ImageLoaderConfig, LoaderConfig
from raykit.loaders.image_plan import ImagePlan
from raykit.loaders.images import ImageBatch, ImageLoader
from raykit.loaders.loader import RayLoader
from raykit.loaders.plan import SamplingPlan
from raykit.loaders.source import ChunkSource, MemorySource, StoreSource
from raykit.loaders.window import WindowPlan

__all__ = [
    "CacheStats",
    "ChunkCache",
    "ChunkSource",
    "DiskCache",
    "ImageBatch",
    "ImageCache",
    "ImageLoader",
    "ImageLoaderConfig",
    "ImagePlan",
    "LoaderConfig",
    "MemorySource",
    "RayLoader",
    "SamplingPlan",
    "StoreSource",
    "WindowPlan",
]
