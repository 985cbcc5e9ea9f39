"""A store's layout: the payload kinds a split may have (``RAYS_LAYOUT``, ``IMAGES_LAYOUT``) and the
manifest's ``layout`` record as one frozen object (``StoreLayout``), parsed once when a store opens.

``StoreLayout.to_dict`` writes back exactly the keys the record had (``recorded``), so a manifest
read and written again is the same JSON, and a store written before a key existed keeps its meaning
(no ``rgba_codec``: zstd; no ``blosc_*``: the constants below).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raykit.errors import StoreCorruptError

__all__ = [
    "BLOSC_CLEVEL",
    "BLOSC_CNAME",
    "BLOSC_SHUFFLE",
    "IMAGES_LAYOUT",
    "LAYOUTS",
    "RAYS_LAYOUT",
    "RGBA_CODEC",
    "RGBA_CODECS",
    "StoreLayout",
    "holds_images",
]


RAYS_LAYOUT, IMAGES_LAYOUT = "rays", "images"  # a split's payload: ray chunks, or encoded images


LAYOUTS = (RAYS_LAYOUT, IMAGES_LAYOUT)


# Multi-byte fields (pids, floats): blosc-lz4 with bit shuffle. On shuffled train pids it is as small
# as blosc-zstd (2.92 vs 3.02 bytes/ray on the `realistic` scene) and 8x faster to write (docs/format.md).
BLOSC_CNAME, BLOSC_CLEVEL, BLOSC_SHUFFLE = "lz4", 5, "bitshuffle"


# Byte fields (rgba): "lz4" (blosc-lz4, fast) or "zstd" (``zstd_level``; about two thirds the size).
RGBA_CODECS = ("lz4", "zstd")


RGBA_CODEC = "lz4"


DEFAULT_IMAGE_CHUNK_BYTES = 1 << 16  # zarr inner chunk (the padding of a split's last chunk: <= 64 KiB)


DEFAULT_IMAGE_SHARD_CHUNKS = 1024  # 64 MiB shard files (zarr) / tars closed at 64 MiB (wds)


def holds_images(layout: str) -> bool:
    """Whether a split of payload kind ``layout`` stores encoded images (else ray chunks)."""
    return layout == IMAGES_LAYOUT


_CODEC_KEYS = ("rgba_codec", "zstd_level", "blosc_cname", "blosc_clevel", "blosc_shuffle")


_RAYS_KEYS = ("chunk_rays", "shard_chunks", "seed", *_CODEC_KEYS, "materialize", "train_order")


_IMAGE_KEYS = ("image_chunk_bytes", "image_shard_chunks", "image_codec")


_IMAGES_KEYS = ("chunk_rays", "shard_chunks", "seed", *_IMAGE_KEYS, "materialize")


_KEYS = tuple(dict.fromkeys(_RAYS_KEYS + _IMAGES_KEYS))


@dataclass(frozen=True)
class StoreLayout:
    """The manifest's ``layout`` (docs/format.md), typed.

    Attributes:
        chunk_rays: rays per chunk (the read unit); shard_chunks: chunks per shard (the write unit).
        seed: the seed of the shuffled (train) split's stored ray order. An images store stores no
            ray order: it records the seed for its copies to the rays layout. Loaders shuffle with
            their own ``seed`` argument and never read this one.
        materialize: None, ``"float16"`` or ``"float32"``: origins and directions stored too.
        rgba_codec, zstd_level, blosc_cname, blosc_clevel, blosc_shuffle: the rays layout's codecs.
        train_order: the name of the shuffled splits' order (``raykit.store.order.TRAIN_ORDER``).
        image_chunk_bytes, image_shard_chunks, image_codec: the images layout's chunking and the
            codec of images re-encoded losslessly.
        recorded: the keys the manifest records, in the order ``to_dict`` writes them.
    """

    chunk_rays: int
    shard_chunks: int
    seed: int = 0
    materialize: str | None = None
    rgba_codec: str = "zstd"  # a record without the key predates the choice: zstd
    zstd_level: int = 3
    blosc_cname: str = BLOSC_CNAME
    blosc_clevel: int = BLOSC_CLEVEL
    blosc_shuffle: str = BLOSC_SHUFFLE
    train_order: str | None = None
    image_chunk_bytes: int = DEFAULT_IMAGE_CHUNK_BYTES
    image_shard_chunks: int = DEFAULT_IMAGE_SHARD_CHUNKS
    image_codec: str | None = None
    recorded: tuple[str, ...] = _RAYS_KEYS

    @classmethod
    def rays(cls, chunk_rays: int, shard_chunks: int, seed: int, **codecs: Any) -> StoreLayout:
        """A rays-layout record (``codecs``: ``rgba_codec``, ``zstd_level``, ``materialize``,
        ``train_order``)."""
        return cls(chunk_rays, shard_chunks, seed, recorded=_RAYS_KEYS, **codecs)

    @classmethod
    def images(cls, chunk_rays: int, shard_chunks: int, seed: int, image_codec: str) -> StoreLayout:
        """An images-layout record (the ray keys kept for the rays view and ray-layout copies)."""
        return cls(chunk_rays, shard_chunks, seed, image_codec=image_codec, recorded=_IMAGES_KEYS)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "layout") -> StoreLayout:
        """The record ``d`` of a manifest; unknown keys are ignored.

        Raises:
            StoreCorruptError: no ``chunk_rays`` or ``shard_chunks``, or a value of the wrong type.
        """
        try:
            values = {k: d[k] for k in _KEYS if k in d}
            layout = cls(**values, recorded=tuple(values))
            if not isinstance(layout.chunk_rays, int) or not isinstance(layout.shard_chunks, int):
                raise TypeError("chunk_rays and shard_chunks must be integers")
        except TypeError as exc:
            raise StoreCorruptError(f"{where}: layout {dict(d)!r} malformed: {exc}") from None
        return layout

    def to_dict(self) -> dict[str, Any]:
        """The manifest record: the ``recorded`` keys."""
        return {k: getattr(self, k) for k in self.recorded}

    def replace(self, **changes: Any) -> StoreLayout:
        """This layout with ``changes``; a changed key not recorded yet is recorded from now on."""
        recorded = self.recorded + tuple(k for k in changes if k not in self.recorded)
        return dataclasses.replace(self, **changes, recorded=recorded)

    @property
    def image_shard_bytes(self) -> int:
        """Bytes of image data per shard of an images split (a zarr shard; a tar is closed then)."""
        return self.image_chunk_bytes * self.image_shard_chunks
