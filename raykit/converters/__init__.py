"""Converters: COLMAP, Blender, instant-ngp/nerfstudio and LLFF captures -> ray stores.

``convert(src, dst, ...)`` parses a capture, checks every image and writes an atomic, resumable ray
store; ``raykit convert`` is its command line (:mod:`raykit.converters.cli`); ``--from photos|video``
estimates the poses first with :mod:`raykit.poses`.
"""

from raykit.converters.config import ConvertConfig
from raykit.converters.convert import SOURCES, convert, detect_source, parse_source
from raykit.converters.downscale import DOWNSCALE_RULES, mipnerf360_camera, resize_area, round_half_up_div
from raykit.converters.records import build_records

__all__ = [
    "DOWNSCALE_RULES",
    "SOURCES",
    "ConvertConfig",
    "build_records",
    "convert",
    "detect_source",
    "mipnerf360_camera",
    "parse_source",
    "resize_area",
    "round_half_up_div",
]
