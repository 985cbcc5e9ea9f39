"""Functions of earlier releases over an images-layout store, kept for one release: each is now a
``RayStore`` method (``split_rows``, ``read_split_image``, ``read_image``, ``image_raw``, ``read``),
which reads a split through its layout's reader (``raykit.store.split_readers``)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from raykit.store.images_layout import ImagesReader
from raykit.store.schema import RawRays

__all__ = ["decode_split_image", "image_raw", "images_reader", "read_image", "read_rays", "split_rows"]


class _Store(Protocol):
    """What these functions use of a ``RayStore``."""

    @property
    def payload(self) -> object: ...

    def split_rows(self, split: str) -> np.ndarray: ...

    def read_split_image(self, split: str, local: int) -> np.ndarray: ...

    def read_image(self, name: str) -> np.ndarray: ...

    def image_raw(self, name: str) -> RawRays: ...

    def read(self, split: str, start: int, stop: int) -> RawRays: ...


def images_reader(store: _Store) -> ImagesReader:
    """The payload reader of an images-layout store."""
    reader = store.payload
    if not isinstance(reader, ImagesReader):
        raise TypeError(f"{store!r} stores rays, not images")
    return reader


def split_rows(store: _Store, split: str) -> np.ndarray:
    """``store.split_rows(split)``."""
    return store.split_rows(split)


def decode_split_image(store: _Store, split: str, local: int) -> np.ndarray:
    """``store.read_split_image(split, local)``."""
    return store.read_split_image(split, local)


def read_image(store: _Store, name: str) -> np.ndarray:
    """``store.read_image(name)``."""
    return store.read_image(name)


def image_raw(store: _Store, name: str) -> RawRays:
    """``store.image_raw(name)``."""
    return store.image_raw(name)


def read_rays(store: _Store, split: str, start: int, stop: int) -> RawRays:
    """``store.read(split, start, stop)``."""
    return store.read(split, start, stop)
