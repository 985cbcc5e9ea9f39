"""``ConvertConfig``: every option of ``raykit convert``, written once; its fields generate the flags.

``raykit.options.add_arguments(parser, ConvertConfig)`` builds the command's arguments,
``raykit.options.from_args(ConvertConfig, args)`` reads them back, and
``convert(config.src, config.dst, **config.convert_options())`` runs it (:func:`raykit.converters.convert`);
``config.store_options()`` is the part the store writer takes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from raykit.converters.downscale import DOWNSCALE_RULES
from raykit.converters.exif import EXIF_POLICIES
from raykit.converters.n3dv import N3DV_DEFAULTS
from raykit.converters.normalize import NORMALIZE_MODES
from raykit.options import option
from raykit.poses import POSE_SOURCES
from raykit.store import (
    BACKENDS,
    COMPONENT_DTYPES,
    DEFAULT_CHUNK_RAYS,
    DEFAULT_SHARD_CHUNKS,
    IMAGE_CODECS,
    LAYOUTS,
    RGBA_CODEC,
    RGBA_CODECS,
)

__all__ = ["SOURCES", "ConvertConfig"]

SOURCES = ("auto", "colmap", "blender", "ngp", "llff", "n3dv")

_SPLIT_HELP = (
    "auto | source | all | every:N | test=FILE[,val=FILE][,train=FILE] (auto: the source's own splits, "
    "else every 8th sorted image is test)"
)
_THREADS_HELP = "threads per worker (default: all cores for one worker, else 1; the output is the same)"
_COMMAND_ONLY = ("src", "dst", "profile")  # not arguments of ``convert``'s keywords


@dataclass(frozen=True)
class ConvertConfig:
    """One conversion as the command line describes it."""

    src: str = option("", "capture folder (or a transforms.json file)", positional=True, metavar="SRC")
    dst: str = option("", "store to create", positional=True, metavar="DST")
    source: str = option(
        "auto",
        "capture format; photos (a folder) or video (a file): poses estimated first into DST.poses",
        flag="--from",
        choices=(*SOURCES, *POSE_SOURCES),
    )
    backend: str = option("zarr", "store backend", flag="--format", choices=BACKENDS)
    downscale: int = option(1, "area-downscale images by N", metavar="N")
    downscale_rule: str = option(
        "exact",
        "exact: N divides the sizes; mipnerf360: the Mip-NeRF 360 protocol as nerfbaselines prepares it "
        "(from full resolution, sizes rounded half up, cx' = (cx - W/2)/N + w/2)",
        choices=DOWNSCALE_RULES,
    )
    split: str = option("auto", _SPLIT_HELP)
    normalize: str = option("none", "world normalisation", choices=NORMALIZE_MODES)
    workers: int = option(1, "N > 1: local Dask cluster", metavar="N", group="cluster")
    scheduler: str | None = option(
        None, "existing Dask scheduler, e.g. tcp://host:8786", metavar="ADDRESS", group="cluster"
    )
    threads: int | None = option(None, _THREADS_HELP, metavar="T")
    skip_missing: bool = option(False, "skip frames whose image is missing")
    images: str | None = option(None, "COLMAP image folder (default: found beside the model)", metavar="DIR")
    exif: str = option(
        "auto",
        "EXIF orientation policy (auto: per image, the layout whose size matches its camera)",
        choices=EXIF_POLICIES,
    )
    frame_start: int = option(N3DV_DEFAULTS["frame_start"], "n3dv: first video frame converted", metavar="F")
    frame_stop: int | None = option(
        N3DV_DEFAULTS["frame_stop"],
        "n3dv: video frame to stop before (default: the video's end)",
        metavar="F",
    )
    frame_stride: int = option(N3DV_DEFAULTS["frame_stride"], "n3dv: convert every N-th frame", metavar="N")
    test_camera: str = option(
        N3DV_DEFAULTS["test_camera"],
        "n3dv: the camera whose frames are all test (others: train)",
        metavar="CAM",
    )
    drop_cameras: str = option(
        N3DV_DEFAULTS["drop_cameras"],
        "n3dv: cameras left out, comma-separated (e.g. cam13, coffee_martini's unsynchronised one); "
        "none unless named",
        metavar="CAMS",
    )
    near: float | None = option(None, "override every image's near bound (source units)")
    far: float | None = option(None, "override every image's far bound (source units)")
    chunk_rays: int = option(DEFAULT_CHUNK_RAYS, "rays per chunk", metavar="N")
    shard_chunks: int = option(DEFAULT_SHARD_CHUNKS, "chunks per shard", metavar="N")
    seed: int = option(0, "seed of the train split's ray permutation")
    rgba_codec: str = option(
        RGBA_CODEC, "colour codec of the rays layout in zarr: lz4 (fast) or zstd (small)", choices=RGBA_CODECS
    )
    mask_dtype: str = option(
        "bit",
        "masks (mask_path): bit (1 bit a pixel: mask > 0) or uint8 (8 bits)",
        choices=COMPONENT_DTYPES["mask"],
    )
    depth_dtype: str = option(
        "float32", "depth maps (depth_file_path), in metres", choices=COMPONENT_DTYPES["depth"]
    )
    overwrite: bool = option(False, "replace an existing store at DST")
    layout: str = option(
        "rays",
        "rays: pre-shuffled rays; images: the encoded images, shuffled at load time",
        choices=LAYOUTS,
    )
    image_codec: str = option(
        IMAGE_CODECS[0],
        "images layout: how images are stored that do not pass through as their source JPEG/PNG (video "
        "frames, other formats): webp (lossless), png (lossless), jpeg (quality 95, lossy: the decoded "
        "JPEG's pixels are the store's), lz4 (lossless: rows' differences LZ4-compressed, several times "
        "faster to write and read than webp, about twice its bytes on video frames) or raw (lossless, "
        "uncompressed)",
        choices=IMAGE_CODECS,
    )
    progress: bool = option(True, "progress bars")
    profile: bool = option(False, "print where the time went (per writer step and task phase)")

    def store_options(self) -> dict[str, Any]:
        """How the store is written: keywords of :func:`raykit.store.write_store`."""
        names = ("layout", "backend", "chunk_rays", "shard_chunks", "seed", "rgba_codec", "image_codec")
        return {name: getattr(self, name) for name in names}

    def video_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`raykit.converters.n3dv.parse_n3dv` (Neural 3D Video only)."""
        return {name: getattr(self, name) for name in N3DV_DEFAULTS}

    def convert_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`raykit.converters.convert` (all but ``src``, ``dst`` and the pose
        estimation options of ``--from photos|video``, which ``raykit.poses.cli`` defines)."""
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _COMMAND_ONLY
        }
