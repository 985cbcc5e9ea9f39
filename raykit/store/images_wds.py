"""The images layout in the WebDataset backend (docs/format.md, "The images layout"): one sample per
image, ``KEY.jpg|png|webp`` then ``KEY.json`` (the camera record), in tars closed once they hold
``layout.image_shard_bytes`` of images; ``index.json`` records each image's tar and data offset.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raykit.store.backend import ByteRead, ImageShard, StagedImage
from raykit.store.layout import StoreLayout

__all__ = ["WDS_IMAGES", "WdsImages", "tar_bytes"]

TAR_HEADER = 512  # one USTAR header block per member (names are short, no extension headers)


def tar_bytes(members: Iterable[tuple[str, bytes]]) -> tuple[bytes, list[int]]:
    """A deterministic tar (both layouts') of ``members``, ``(name, bytes)`` in order, and the offset of
    each member's data in it. ``TarInfo``'s defaults make the headers the same on every run: mtime 0,
    uid and gid 0, no owner names, mode 0644."""
    buffer, offsets = io.BytesIO(), []
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            offsets.append(tar.offset + TAR_HEADER)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue(), offsets


@dataclass(frozen=True)
class WdsImages:
    """How the WebDataset backend stores and reads images-layout splits (``ImagesPayload``)."""

    def root_metadata(self) -> dict[str, bytes]:
        return {}

    def plan_split(
        self, split: str, names: Sequence[str], entry: Mapping[str, Sequence[Any]], layout: StoreLayout
    ) -> tuple[list[ImageShard], dict[str, list[Any]], dict[str, bytes]]:
        groups: list[list[int]] = [[]]  # images in order, a tar closed once full
        held = 0
        for i, size in enumerate(entry["image_bytes"]):
            if groups[-1] and held + size > layout.image_shard_bytes:
                groups.append([])
                held = 0
            groups[-1].append(i)
            held += size
        return [ImageShard(shard=s, images=tuple(group)) for s, group in enumerate(groups)], {}, {}

    def encode_shard(
        self, split: str, shard: ImageShard, images: Sequence[StagedImage], layout: StoreLayout
    ) -> tuple[str, bytes, dict[str, list[Any]]]:
        members = []
        for i, image in enumerate(images):
            key = f"{split}_{shard.images[0] + i:08d}"  # wds_backend.sample_key
            meta = (json.dumps(image.record, sort_keys=True, indent=1) + "\n").encode()
            members += [(f"{key}.{image.ext}", image.data), (f"{key}.json", meta)]
        data, offsets = tar_bytes(members)
        index = {"image_shard": [shard.shard] * len(images), "image_member": offsets[::2]}
        return f"wds/{split}-{shard.shard:06d}.tar", data, index

    def files_of(self, entry: Mapping[str, Any], split: str, i: int, layout: StoreLayout) -> list[str]:
        return [f"wds/{split}-{int(entry['image_shard'][i]):06d}.tar"]

    def image_parts(
        self, read: ByteRead, where: str, entry: Mapping[str, Any], split: str, i: int, layout: StoreLayout
    ) -> list[bytes | np.ndarray]:
        offset, size = int(entry["image_member"][i]), int(entry["image_bytes"][i])
        return [read(self.files_of(entry, split, i, layout)[0], offset, offset + size)]


WDS_IMAGES = WdsImages()
