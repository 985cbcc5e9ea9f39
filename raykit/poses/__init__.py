"""Camera poses of photos or a video with pycolmap (``raykit poses``, docs/poses.md): a COLMAP capture
that ``raykit.converters`` turns into a store (``raykit convert --from photos|video``).

Modules: ``estimate`` (``estimate_poses``: the stages and their summary; ``poses_for_convert``),
``state`` (``OUT/poses.json``, resume), ``sfm`` (the interruptible pycolmap calls), ``photos`` (listing
and checking photos), ``video`` (PyAV frames), ``align`` (Umeyama similarity, pose errors), ``cli``
(``raykit poses``). Outside this package, code imports the names below from ``raykit.poses``.
"""

from raykit.poses.align import pose_errors, rotation_angle_deg, umeyama
from raykit.poses.estimate import (
    MATCHERS,
    POSE_SOURCES,
    PoseOptions,
    PoseSummary,
    estimate_poses,
    poses_for_convert,
)
from raykit.poses.video import VIDEO_EXTENSIONS, video_stream

__all__ = [
    "MATCHERS",
    "POSE_SOURCES",
    "VIDEO_EXTENSIONS",
    "PoseOptions",
    "PoseSummary",
    "estimate_poses",
    "pose_errors",
    "poses_for_convert",
    "rotation_angle_deg",
    "umeyama",
    "video_stream",
]
