"""The image loader's source stage: the images of one split read (and decoded) from the store, at one
resolution level, undistorted and transformed as served (:class:`ImageSource`); the checks of the
options that depend on the images' sizes.

A ray store's shuffled train split holds a share of every image in every chunk, so ``read_image`` of
one image scans the whole split; :func:`scan_images` gathers many images in one pass, which the loader
uses to fill its cache at the start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from raykit.cameras import Camera
from raykit.errors import ConfigError
from raykit.image_geometry import RemapTable, pinhole_camera
from raykit.imagedecode import downscale_area, level_size
from raykit.loaders.components import ImageComponents, held_dtype, read_components, read_split_components
from raykit.loaders.levels import level_camera
from raykit.store import RayStore, open_store

__all__ = ["ImageSource", "check_batch_sizes", "checked_crop", "scan_images"]


class ImageSource:
    """The images of ``split``, by position ``0..n_images-1`` in table order, read through
    ``RayStore.read_image``; undistorted by a remap table computed once per camera and process. It
    pickles as its store's location and options, so worker processes rebuild it.

    Args:
        undistort: resample non-pinhole images to :func:`raykit.image_geometry.pinhole_camera`.
        transform: applied to each (H, W, C) uint8 image after undistortion (see ``ImageLoader``);
            its output's bytes per pixel are found by applying it once to a 1 x 1 image.
        downscale: resolution level ``k`` (``raykit.loaders.levels``): images, shapes and cameras at
            1/k, undistorted (when asked) at that level.
    """

    def __init__(
        self,
        store: RayStore,
        split: str,
        undistort: bool = False,
        transform: Callable[[np.ndarray], np.ndarray] | None = None,
        downscale: int = 1,
    ) -> None:
        self.store, self.split, self.undistort, self.transform = store, split, undistort, transform
        self.downscale = downscale
        table, channels = store.table, store.rgba_channels
        self.rows = np.flatnonzero(np.asarray(table.splits) == split)
        self.names = [table.names[i] for i in self.rows]
        self.full_shapes = [(int(table.height[i]), int(table.width[i]), channels) for i in self.rows]
        cameras = [table.cameras[table.camera_index[i]] for i in self.rows]
        self.source_cameras = [level_camera(camera, downscale) for camera in cameras]
        # (H, W, C) of each image as ``read_image`` returns it at this level
        self._shapes = [(*level_size(h, w, downscale), c) for h, w, c in self.full_shapes]
        self._tables: dict[Camera, tuple[RemapTable, Camera]] = {}
        self._pixel_bytes = channels
        if transform is not None:
            self._pixel_bytes = int(np.asarray(transform(np.zeros((1, 1, channels), np.uint8))).nbytes)

    @property
    def n_images(self) -> int:
        return len(self.rows)

    @property
    def shuffled_rays(self) -> bool:
        """Whether the split's images are scattered over all its chunks (see the module docstring)."""
        if self.store.splits[self.split].holds_images:  # read_image reads one image
            return False
        info = self.store.splits[self.split]
        return bool(info.shuffled) and bool(np.any(self.store.table.ray_start[self.rows] < 0))

    def camera(self, position: int) -> Camera:
        """The camera of the images this source returns (the pinhole one with ``undistort``)."""
        camera = self.source_cameras[position]
        if not self.undistort or camera.is_pinhole:
            return camera
        return pinhole_camera(camera)

    def shape(self, position: int) -> tuple[int, int, int]:
        """``(H, W, C)`` of image ``position``."""
        return self._shapes[position]

    def nbytes(self, position: int) -> int:
        """Bytes of image ``position`` as served (and cached)."""
        h, w, _ = self.shape(position)
        return h * w * self._pixel_bytes

    def read_chunk(self, position: int) -> np.ndarray:
        """Image ``position``: (H, W, C) uint8, undistorted when asked (the loaders' read interface)."""
        return self.prepare(position, self.store.read_image(self.names[position], downscale=self.downscale))

    def from_full(self, position: int, image: np.ndarray) -> np.ndarray:
        """Image ``position`` served from its full-resolution pixels (level by the area filter)."""
        return self.prepare(position, np.ascontiguousarray(downscale_area(image, self.downscale)))

    def remap(self, position: int) -> RemapTable | None:
        """The undistortion table of image ``position``'s camera (None unless undistorting a
        non-pinhole camera), computed once per camera."""
        camera = self.source_cameras[position]
        if not self.undistort or camera.is_pinhole:
            return None
        if camera not in self._tables:
            self._tables[camera] = RemapTable.undistort(camera)
        return self._tables[camera][0]

    def components(self, position: int, names: Sequence[str]) -> ImageComponents:
        """Components ``names`` of image ``position`` as served: at this level, undistorted (nearest
        sample) when asked; never transformed."""
        return read_components(self.store, self.names[position], names, self.downscale, self.remap(position))

    def components_of(self, positions: Sequence[int], names: Sequence[str]) -> dict[int, ImageComponents]:
        """:meth:`components` of several images at once (the stored bytes of images lying together
        read in one go: ``read_split_components``); the same values."""
        return read_split_components(self.store, self.split, positions, names, self.downscale, self.remap)

    def component_nbytes(self, position: int, names: Sequence[str]) -> int:
        """Bytes components ``names`` of image ``position`` take as served (and cached)."""
        h, w, _ = self.shape(position)
        return h * w * sum(held_dtype(self.store, name).itemsize for name in names)

    def prepare(self, position: int, image: np.ndarray) -> np.ndarray:
        """``image`` as this source serves it (undistorted when asked, then transformed)."""
        table = self.remap(position)
        if table is not None:
            image = table.apply(image)
        if self.transform is not None:
            image = np.ascontiguousarray(self.transform(image))
        return image

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reopen, (self.store.url, self.split, self.undistort, self.transform, self.downscale)


def _reopen(
    url: str,
    split: str,
    undistort: bool,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
    downscale: int = 1,
) -> ImageSource:
    return ImageSource(open_store(url), split, undistort, transform, downscale)


def scan_images(store: RayStore, split: str, rows: Sequence[int]) -> dict[int, np.ndarray]:
    """Images (table rows ``rows`` of ``split``) gathered in one pass over the split's chunks.

    Returns:
        row -> (H, W, C) uint8 pixels (views into one buffer), C = ``store.rgba_channels``.
    """
    table, channels = store.table, store.rgba_channels
    picked = np.asarray(sorted({int(r) for r in rows}), dtype=np.int64)
    if len(picked) == 0:
        return {}
    sizes = table.n_pixels[picked]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    buffer = np.zeros((int(sizes.sum()), channels), dtype=np.uint8)
    slot = np.full(len(table.names), -1, dtype=np.int64)
    slot[picked] = np.arange(len(picked))
    for index in range(store.splits[split].n_chunks):
        raw = store.read_chunk(split, index)
        image, pixel = store.decode_pids(raw.pid)
        take = np.flatnonzero(slot[image] >= 0)
        image = image[take]
        local = pixel[take, 1] * table.width[image] + pixel[take, 0]
        buffer[starts[slot[image]] + local] = raw.rgba[take, :channels]
    return {
        int(row): buffer[s : s + n].reshape(int(table.height[row]), int(table.width[row]), channels)
        for row, s, n in zip(picked, starts, sizes, strict=True)
    }


def checked_crop(crop: Any, source: ImageSource) -> tuple[int, int] | None:
    """``crop`` as ``(h, w)`` after checking it fits every image of ``source``, or None.

    Raises:
        ConfigError: not two positive integers, or larger than an image (named).
    """
    if crop is None:
        return None
    ok = isinstance(crop, tuple | list) and len(crop) == 2
    ok = ok and all(isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 1 for v in crop)
    if not ok:
        raise ConfigError(f"image loader: crop: expected (height, width) positive integers, got {crop!r}")
    h, w = int(crop[0]), int(crop[1])
    small = [p for p in range(source.n_images) if source.shape(p)[0] < h or source.shape(p)[1] < w]
    if small:
        height, width, _ = source.shape(small[0])
        raise ConfigError(
            f"image loader: crop {h}x{w} (h x w) is larger than {len(small)} image(s) of split "
            f"{source.split!r}, e.g. {source.names[small[0]]!r} ({width}x{height})"
        )
    return h, w


def check_batch_sizes(source: ImageSource, batch_size: int, crop: tuple[int, int] | None) -> None:
    """Raise ``ConfigError`` when whole images of several sizes would be stacked in one batch."""
    if batch_size == 1 or crop is not None:
        return
    sizes = {source.shape(p)[:2] for p in range(source.n_images)}
    if len(sizes) > 1:
        raise ConfigError(
            f"image loader: batch_size {batch_size} stacks whole images, but split {source.split!r} has "
            f"{len(sizes)} image sizes ({', '.join(f'{w}x{h}' for h, w in sorted(sizes))}); use "
            "batch_size=1 or crop=(h, w)"
        )
