"""Converters: COLMAP, Blender, instant-ngp/nerfstudio and LLFF captures -> ray stores.

``convert(src, dst, ...)`` parses a capture, checks every image and writes an atomic, resumable ray
store; ``raykit convert`` is its command line (:mod:`raykit.converters.cli`).
"""

from raykit.converters.convert import SOURCES, build_records, convert, detect_source, parse_source

__all__ = ["SOURCES", "build_records", "convert", "detect_source", "parse_source"]
