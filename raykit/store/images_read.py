"""Functions of earlier releases over an images-layout store, kept for one release: ``RayStore`` has
them as methods now (``split_rows``, ``read_split_image``), reading each split through its layout's
reader (``raykit.store.split_readers``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from raykit.store.images_layout import ImagesReader

if TYPE_CHECKING:
    from raykit.store.reader import RayStore

__all__ = ["decode_split_image", "images_reader", "split_rows"]


def images_reader(store: RayStore) -> ImagesReader:
    """The payload reader of an images-layout store."""
    if not isinstance(store.payload, ImagesReader):
        raise TypeError(f"{store!r} stores rays, not images")
    return store.payload


def split_rows(store: RayStore, split: str) -> np.ndarray:
    """``store.split_rows(split)``."""
    return store.split_rows(split)


def decode_split_image(store: RayStore, split: str, local: int) -> np.ndarray:
    """``store.read_split_image(split, local)``."""
    return store.read_split_image(split, local)
