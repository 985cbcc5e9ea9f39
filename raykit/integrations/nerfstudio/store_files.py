"""Store locations as nerfstudio passes them, and images that nerfstudio's own dataset can open.

nerfstudio hands ``--data`` over as a ``pathlib.Path``, which folds ``http://host/x`` into
``http:/host/x``; :func:`store_location` restores the URL. :class:`StoreImageFile` stands in a
``DataparserOutputs.image_filenames`` list: it is a file object (not a path), so ``PIL.Image.open``
reads it, and its bytes are the store's pixels encoded as PNG in memory when first read (kept with the
object: fast PNG, smaller than the decoded image nerfstudio's stock datamanagers cache anyway); nothing
is written to disk.
"""

from __future__ import annotations

import io
import os
import re
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from raykit.errors import ConfigError, RaykitError
from raykit.store import RayStore, open_store

__all__ = ["StoreImageFile", "open_location", "store_location"]

_FOLDED_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")


def store_location(data: str | os.PathLike[str]) -> str:
    """``--data`` as a store location: a local path, or a URL whose ``//`` a ``Path`` folded."""
    text = os.fspath(data)
    if _FOLDED_URL.match(text) and not Path(text).exists():
        return _FOLDED_URL.sub(r"\1://", text, count=1)
    return text


@lru_cache(maxsize=8)
def open_location(location: str) -> RayStore:
    """The store at ``location`` (opened once per process); ConfigError, one line, when it is not one."""
    if not location or location == ".":
        raise ConfigError("raykit-data: no store given; pass --data STORE (a raykit convert output)")
    try:
        return open_store(location)
    except (RaykitError, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"raykit-data: {location}: not a raykit store ({first})") from exc


class StoreImageFile(io.RawIOBase):
    """One store image as a read-only binary file of PNG bytes (``name`` is the image's name)."""

    def __init__(self, location: str, image: str) -> None:
        super().__init__()
        self.location, self.image = location, image
        self._buffer: io.BytesIO | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.image

    def pixels(self) -> np.ndarray:
        """(H, W, C) uint8: the image as the store holds it."""
        return open_location(self.location).read_image(self.image)

    def _data(self) -> io.BytesIO:
        if self._buffer is None:
            encoded = io.BytesIO()
            Image.fromarray(self.pixels()).save(encoded, format="PNG", compress_level=1)
            encoded.seek(0)
            self._buffer = encoded
        return self._buffer

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        with self._lock:
            return self._data().readinto(target)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with self._lock:
            return self._data().seek(offset, whence)

    def tell(self) -> int:
        with self._lock:
            return self._data().tell()

    def __repr__(self) -> str:
        return f"StoreImageFile({self.location!r}, {self.image!r})"

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (StoreImageFile, (self.location, self.image))
