"""Ray loaders: shuffled, cached, resumable, multi-worker and multi-rank batches; evaluation; adapters."""

from raykit.loaders.cache import CacheStats, ChunkCache, DiskCache
from raykit.loaders.config import LoaderConfig
from raykit.loaders.loader import RayLoader
from raykit.loaders.plan import SamplingPlan
from raykit.loaders.source import ChunkSource, MemorySource, StoreSource

__all__ = [
    "CacheStats",
    "ChunkCache",
    "ChunkSource",
    "DiskCache",
    "LoaderConfig",
    "MemorySource",
    "RayLoader",
    "SamplingPlan",
    "StoreSource",
]
