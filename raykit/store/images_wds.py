"""The images layout in the WebDataset backend (``docs/format.md``; ``raykit.store.images_layout``).

``wds/{split}-{shard:06d}.tar``, one sample per image with key ``{split}_{i:08d}``: ``KEY.jpg|png|webp``
(the stored bytes) then ``KEY.json`` (the camera record); a tar is closed once it holds
``image_chunk_bytes * image_shard_chunks`` bytes of images. ``index.json`` records each image's tar
(``image_shard``) and the offset of its data in it (``image_member``).
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raykit.store.backend import ByteRead, ImageShard, StagedImage
from raykit.store.layout import StoreLayout

__all__ = ["WDS_IMAGES", "WdsImages", "tar_bytes", "tar_member", "wds_image_shards", "wds_shard_groups"]

TAR_HEADER = 512  # one USTAR header block per member (names are short, no extension headers)


def tar_member(name: str, size: int) -> tarfile.TarInfo:
    """A deterministic USTAR member header (both layouts' tars): mtime 0, uid/gid 0, mode 0644."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def wds_shard_groups(sizes: Sequence[int], layout: StoreLayout) -> list[list[int]]:
    """Split-local image indices of each tar shard: images in order, a shard closed once full."""
    limit = layout.image_shard_bytes
    groups: list[list[int]] = [[]]
    held = 0
    for i, size in enumerate(sizes):
        if groups[-1] and held + size > limit:
            groups.append([])
            held = 0
        groups[-1].append(i)
        held += size
    return groups


def tar_bytes(members: Iterable[tuple[str, bytes]]) -> tuple[bytes, list[int]]:
    """A deterministic tar (both layouts') of ``members``, ``(name, bytes)`` in order, and the offset of
    each member's data in it."""
    buffer, offsets = io.BytesIO(), []
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            offsets.append(tar.offset + TAR_HEADER)
            tar.addfile(tar_member(name, len(data)), io.BytesIO(data))
    return buffer.getvalue(), offsets


def wds_image_shards(split: str, first: int, images: Sequence[StagedImage]) -> tuple[bytes, list[int]]:
    """One tar of samples ``first..``: ``(tar bytes, data offset of each image member)``."""
    members = []
    for i, image in enumerate(images):
        key = f"{split}_{first + i:08d}"
        meta = (json.dumps(image.record, sort_keys=True, indent=1) + "\n").encode()
        members += [(f"{key}.{image.ext}", image.data), (f"{key}.json", meta)]
    data, offsets = tar_bytes(members)
    return data, offsets[::2]


@dataclass(frozen=True)
class WdsImages:
    """How the WebDataset backend stores and reads images-layout splits (``ImagesPayload``)."""

    def root_metadata(self) -> dict[str, bytes]:
        return {}

    def plan_split(
        self, split: str, names: Sequence[str], entry: Mapping[str, Sequence[Any]], layout: StoreLayout
    ) -> tuple[list[ImageShard], dict[str, list[Any]], dict[str, bytes]]:
        groups = wds_shard_groups(entry["image_bytes"], layout)
        return [ImageShard(shard=s, images=tuple(group)) for s, group in enumerate(groups)], {}, {}

    def encode_shard(
        self, split: str, shard: ImageShard, images: Sequence[StagedImage], layout: StoreLayout
    ) -> tuple[str, bytes, dict[str, list[Any]]]:
        data, members = wds_image_shards(split, shard.images[0], images)
        index = {"image_shard": [shard.shard] * len(images), "image_member": members}
        return f"wds/{split}-{shard.shard:06d}.tar", data, index

    def files_of(self, entry: Mapping[str, Any], split: str, i: int, layout: StoreLayout) -> list[str]:
        return [f"wds/{split}-{int(entry['image_shard'][i]):06d}.tar"]

    def read_image(
        self, read: ByteRead, where: str, entry: Mapping[str, Any], split: str, i: int, layout: StoreLayout
    ) -> bytes:
        offset, size = int(entry["image_member"][i]), int(entry["image_bytes"][i])
        return read(self.files_of(entry, split, i, layout)[0], offset, offset + size)


WDS_IMAGES = WdsImages()
