"""How a store is written and how it was: ``StoreSpec``, one frozen record checked once, and the layout
names (``RAYS_LAYOUT``, ``IMAGES_LAYOUT``: "layout" means these two kinds of payload, nothing else).

A writer builds a ``StoreSpec`` from ``write_store``'s keywords (every default written here once) and
records it in the manifest (``to_dict``: its ``layout`` record); a reader parses that record back once
(``StoreSpec.from_dict``, ``RayStore.spec``). ``to_dict`` writes back exactly the keys the record had
(``recorded``), so a manifest read and written again is the same JSON, and a store written before a
key existed keeps its meaning (no ``rgba_codec``: zstd; no ``blosc_*``: the constants below).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raykit.errors import ConfigError, StoreCorruptError

BACKENDS = ("zarr", "wds")  # each one module of raykit.store.backends
DEFAULT_CHUNK_RAYS = 65536
DEFAULT_SHARD_CHUNKS = 16
RAYS_LAYOUT, IMAGES_LAYOUT = "rays", "images"  # a split's payload: ray chunks, or encoded images


LAYOUTS = (RAYS_LAYOUT, IMAGES_LAYOUT)


# Multi-byte fields (pids, floats): blosc-lz4 with bit shuffle. On shuffled train pids it is as small
# as blosc-zstd (2.92 vs 3.02 bytes/ray on the `realistic` scene) and 8x faster to write (docs/format.md).
BLOSC_CNAME, BLOSC_CLEVEL, BLOSC_SHUFFLE = "lz4", 5, "bitshuffle"


# Byte fields (rgba): "lz4" (blosc-lz4, fast) or "zstd" (``zstd_level``; about two thirds the size).
RGBA_CODECS = ("lz4", "zstd")


RGBA_CODEC = "lz4"


# How the images layout stores an image that does not pass through as its source file: "webp" (WebP
# lossless, the default), "png" (lossless), "jpeg" (lossy, quality 95: its decoded pixels are the
# store's), "lz4" (lossless: raykit's pixel file, rows' differences LZ4-compressed; for video frames,
# several times faster to write and read, larger) or "raw" (its pixels uncompressed). raykit.store.image_codec
# encodes them.
IMAGE_CODECS = ("webp", "png", "jpeg", "lz4", "raw")


DEFAULT_IMAGE_CHUNK_BYTES = 1 << 16  # zarr inner chunk (the padding of a split's last chunk: <= 64 KiB)


DEFAULT_IMAGE_SHARD_CHUNKS = 1024  # 64 MiB shard files (zarr) / tars closed at 64 MiB (wds)


def holds_images(layout: str) -> bool:
    """Whether a split of payload kind ``layout`` stores encoded images (else ray chunks)."""
    return layout == IMAGES_LAYOUT


def _default_memory_staging() -> int:
    """1 GiB, or an eighth of this machine's memory when that is less: conversion stays under 2 GB of
    RSS at any capture size (4 GiB staged 500 1080p photos in memory: 5.0 GB peak RSS,
    benchmarks/bench_scale_nerfstudio.py's prepare step)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 1 << 30
    return int(min(1 << 30, total // 8))


DEFAULT_MEMORY_STAGING_BYTES = _default_memory_staging()

_CODEC_KEYS = ("rgba_codec", "zstd_level", "blosc_cname", "blosc_clevel", "blosc_shuffle")
_RAYS_KEYS = ("chunk_rays", "shard_chunks", "seed", *_CODEC_KEYS, "materialize", "train_order")
_IMAGE_KEYS = ("image_chunk_bytes", "image_shard_chunks", "image_codec")
_IMAGES_KEYS = ("chunk_rays", "shard_chunks", "seed", *_IMAGE_KEYS, "materialize")
_KEYS = tuple(dict.fromkeys(_RAYS_KEYS + _IMAGES_KEYS))


@dataclass(frozen=True)
class StoreSpec:
    """How a store is written: its kind, backend, chunking, seed and codecs (the manifest's ``layout``
    record, docs/format.md, and the write's own options), checked once when made.

    Attributes:
        kind: ``"rays"`` (pre-shuffled rays) or ``"images"`` (the encoded images, shuffled at load
            time; ``raykit.store.write.images``).
        backend: ``"zarr"`` or ``"wds"`` (the manifest records it on its own).
        chunk_rays: rays per chunk (the read unit); shard_chunks: chunks per shard (the write unit).
            An images store records them for its rays view and for ray-layout copies.
        seed: the seed of the shuffled (train) split's stored ray order, an integer in ``[0, 2**63)``.
            An images store stores no ray order: it records the seed for its copies to the rays
            layout. Loaders shuffle with their own ``seed`` argument and never read this one.
        materialize: None, ``"float16"`` or ``"float32"``: rays layout: origins and directions
            stored too.
        rgba_codec, zstd_level, blosc_cname, blosc_clevel, blosc_shuffle: the rays layout's codecs
            (``rgba_codec``: zarr's colours, ``"lz4"``, fast, or ``"zstd"``, about two thirds the size).
        train_order: the name of the shuffled splits' order (``raykit.store.order.TRAIN_ORDER``).
        image_chunk_bytes, image_shard_chunks, image_codec: the images layout's chunking and the
            codec of images that do not pass through (``IMAGE_CODECS``; ``webp``, lossless, by default).
        with_pids: rays layout: also store every split's pids (format 3 derives them from the split's
            order at read time). Not recorded: a split's ``pids`` says it.
        memory_staging_bytes: rays layout: when every task runs in this process (no executor or a
            thread pool) and the decoded images take at most this many bytes staged (4 per pixel),
            they are staged in memory instead of in files (0: always files). Not recorded.
        recorded: the keys the manifest records, in the order ``to_dict`` writes them (default: the
            ``kind``'s).
    """

    kind: str = RAYS_LAYOUT
    backend: str = "zarr"
    chunk_rays: int = DEFAULT_CHUNK_RAYS
    shard_chunks: int = DEFAULT_SHARD_CHUNKS
    seed: int = 0
    materialize: str | None = None
    rgba_codec: str = RGBA_CODEC
    zstd_level: int = 3
    blosc_cname: str = BLOSC_CNAME
    blosc_clevel: int = BLOSC_CLEVEL
    blosc_shuffle: str = BLOSC_SHUFFLE
    train_order: str | None = None
    image_chunk_bytes: int = DEFAULT_IMAGE_CHUNK_BYTES
    image_shard_chunks: int = DEFAULT_IMAGE_SHARD_CHUNKS
    image_codec: str = IMAGE_CODECS[0]
    with_pids: bool = False
    memory_staging_bytes: int = dataclasses.field(default=DEFAULT_MEMORY_STAGING_BYTES, compare=False)
    recorded: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Raise ``ConfigError`` for an unknown kind, backend or codec, empty chunks or shards, a bad
        ``materialize`` or a seed that is not an integer in ``[0, 2**63)``."""
        if self.kind not in LAYOUTS:
            raise ConfigError(f"layout: expected one of {', '.join(LAYOUTS)}, got {self.kind!r}")
        if self.rgba_codec not in RGBA_CODECS:
            raise ConfigError(f"rgba_codec: expected one of {RGBA_CODECS}, got {self.rgba_codec!r}")
        if self.image_codec not in IMAGE_CODECS:
            raise ConfigError(f"image_codec: expected one of {IMAGE_CODECS}, got {self.image_codec!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"store backend: expected one of {BACKENDS}, got {self.backend!r}")
        for name in ("chunk_rays", "shard_chunks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name}: expected an integer, got {value!r}")
        if self.chunk_rays < 1 or self.shard_chunks < 1:
            raise ConfigError(
                f"expected chunk_rays >= 1 and shard_chunks >= 1, got {self.chunk_rays}, {self.shard_chunks}"
            )
        if self.materialize not in (None, "float16", "float32"):
            raise ConfigError(f"materialize: expected None, 'float16' or 'float32', got {self.materialize!r}")
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ConfigError(f"seed: expected an integer >= 0, got {seed!r}")
        if not self.recorded:
            object.__setattr__(self, "recorded", _IMAGES_KEYS if holds_images(self.kind) else _RAYS_KEYS)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "layout", backend: str = "zarr") -> StoreSpec:
        """The ``layout`` record ``d`` of a manifest (``backend``: the manifest's); unknown keys are
        ignored. A record without ``rgba_codec`` predates the choice: zstd.

        Raises:
            StoreCorruptError: no ``chunk_rays`` or ``shard_chunks``, or a bad value.
        """
        try:
            values = {k: d[k] for k in _KEYS if k in d}
            kind = IMAGES_LAYOUT if "image_codec" in values else RAYS_LAYOUT
            defaults = {"rgba_codec": "zstd"}
            backend = backend if backend in BACKENDS else "zarr"  # an unknown one: the reader says so
            spec = cls(kind, backend, **{**defaults, **values}, recorded=tuple(values))
            if "chunk_rays" not in values or "shard_chunks" not in values:
                raise TypeError("chunk_rays and shard_chunks must be recorded")
        except (TypeError, ConfigError) as exc:
            raise StoreCorruptError(f"{where}: layout {dict(d)!r} malformed: {exc}") from None
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The manifest's ``layout`` record: the ``recorded`` keys."""
        return {k: getattr(self, k) for k in self.recorded}

    def replace(self, **changes: Any) -> StoreSpec:
        """This spec with ``changes`` (checked again); a changed key not recorded yet is recorded
        from now on."""
        recorded = self.recorded + tuple(k for k in changes if k in _KEYS and k not in self.recorded)
        return dataclasses.replace(self, **changes, recorded=recorded)

    @property
    def image_shard_bytes(self) -> int:
        """Bytes of image data per shard of an images split (a zarr shard; a tar is closed then)."""
        return self.image_chunk_bytes * self.image_shard_chunks
