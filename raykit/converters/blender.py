"""Blender ``nerf_synthetic`` captures: ``transforms_{train,val,test}.json`` beside the images.

Each file's frames form the split named by the file. ``file_path`` is relative to the capture folder,
usually ``./train/r_0`` without extension. Intrinsics: ``camera_angle_x`` (full horizontal field of
view) with ``fx = fy = 0.5 * W / tan(camera_angle_x / 2)``, derived from the actual image size (so a
half-resolution copy of the images gets half the focal length); ``camera_angle_y`` or ``fl_x``/``fl_y``
/``cx``/``cy`` are used when present. Principal point defaults to the image centre ``(W/2, H/2)``.
Poses are OpenGL camera-to-world and become OpenCV. RGBA PNGs keep their alpha.

D-NeRF captures are this format with a per-frame ``time`` in [0, 1] (every frame or none): each
view's time (``raykit.store.FrameTime``). Their frames' own ``fl_x``, ``fl_y``, ``cx``, ``cy``, ``w``,
``h`` are honoured, as any frame's (D-NeRF's own loaders read only ``camera_angle_x``).

Scene box and near/far: nerf_synthetic objects lie in the box ``[-1.5, 1.5]^3`` (the box instant-ngp
and nerfacc use for them); per view, ``far`` is the distance to the box's farthest corner and ``near``
the distance to the box (see :func:`raykit.converters.ngp.box_near_far`). For the original scenes
(cameras 4.03 from the origin) this gives about 2.3-2.5 and 6.6, close to NeRF's constants 2 and 6
but never clipping the box.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from raykit.converters.base import Capture, Problems, SourceView, load_json
from raykit.converters.ngp import box_near_far, component_problems, parse_frames, report_missing
from raykit.converters.paths import ImageRoots
from raykit.ranges import Range

__all__ = ["BLENDER_BOUNDS", "BLENDER_SPLITS", "parse_blender"]

BLENDER_SPLITS = ("train", "val", "test")
BLENDER_BOUNDS = ((-1.5, -1.5, -1.5), (1.5, 1.5, 1.5))
DNERF_TIME = Range(0.0, 1.0)
"""D-NeRF's per-frame ``time``."""


def parse_blender(
    src: Path, *, skip_missing: bool = False, exif: str = "auto", allow_outside: Sequence[Path] = ()
) -> Capture:
    """Parse every ``transforms_{split}.json`` in ``src``.

    Image files must lie in ``src`` or one of ``allow_outside`` (see :mod:`raykit.converters.paths`).
    """
    problems = Problems()
    files = [(split, src / f"transforms_{split}.json") for split in BLENDER_SPLITS]
    files = [(split, path) for split, path in files if path.is_file()]
    if not files:
        problems.add(f"{src}: no transforms_{{train,val,test}}.json found")
    views, skipped, roots = [], [], ImageRoots(src, allow_outside)
    assumed: list[tuple[str, str]] = []
    for split, path in files:
        try:
            meta = load_json(path)
        except Exception as exc:  # SourceError: keep going to report every file's problems
            problems.extend(getattr(exc, "problems", [str(exc)]))
            continue
        if isinstance(meta, dict) and "camera_model" not in meta:
            meta = {**meta, "camera_model": "PINHOLE"}
        found, missing = parse_frames(path, meta, problems, exif, roots, time_range=DNERF_TIME)
        if isinstance(meta, dict) and meta.get("frames") == []:
            assumed.append(("splits", f"{path}: no frames, so no {split} images come from it"))
        report_missing(path, missing, skip_missing, problems)
        skipped += missing
        views += [_in_split(v, split) for v in found]
    problems.extend(component_problems(src, views))  # masks, depth maps, time: every frame or none
    problems.raise_if_fatal(views)
    params = {"skipped_missing": sorted(skipped) if skip_missing else []}
    return Capture(
        "blender", views, bounds=BLENDER_BOUNDS, problems=problems.lines, params=params, assumed=assumed
    )


def _in_split(view: SourceView, split: str) -> SourceView:
    lo, hi = np.array(BLENDER_BOUNDS)
    near, far = box_near_far((lo + hi) / 2, (hi - lo) / 2, view.c2w[:3, 3])
    return replace(view, split=split, near=near, far=far)
