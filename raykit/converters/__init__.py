"""Converters: COLMAP, Blender, instant-ngp/nerfstudio and LLFF captures -> ray stores.

``convert(src, dst, ...)`` parses a capture, checks every image and writes an atomic, resumable ray
store; ``raykit convert`` is its command line (:mod:`raykit.converters.cli`). ``estimate_poses``
turns photos or a video into a COLMAP capture with pycolmap (``raykit poses``,
:mod:`raykit.converters.poses`).
"""

from raykit.converters.config import ConvertConfig
from raykit.converters.convert import SOURCES, build_records, convert, detect_source, parse_source
from raykit.converters.downscale import DOWNSCALE_RULES, mipnerf360_camera, resize_area, round_half_up_div
from raykit.converters.poses import POSE_SOURCES, PoseOptions, PoseSummary, estimate_poses
from raykit.converters.video import VIDEO_EXTENSIONS

__all__ = [
    "DOWNSCALE_RULES",
    "POSE_SOURCES",
    "SOURCES",
    "VIDEO_EXTENSIONS",
    "ConvertConfig",
    "PoseOptions",
    "PoseSummary",
    "build_records",
    "convert",
    "detect_source",
    "estimate_poses",
    "mipnerf360_camera",
    "parse_source",
    "resize_area",
    "round_half_up_div",
]
