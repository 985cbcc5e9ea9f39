"""The ``raykit-data`` dataparser: any raykit store (either layout, either backend, a path or a URL)
as nerfstudio's ``DataparserOutputs``.

Cameras: each image's camera through :func:`raykit.integrations.camera_map.nerfstudio_intrinsics`;
poses flipped from OpenCV to OpenGL axes (``raykit.conventions``), then, optionally, oriented,
centred and scaled exactly as nerfstudio's own ``nerfstudio-data`` parser does
(``camera_utils.auto_orient_and_center_poses``), over all of the store's images so that every split
shares one frame. The scene box is the store's bounds through that similarity (the box of the
transformed corners), or, without bounds, the cube around the origin that holds every camera. The
store's sparse points become ``metadata["points3D_xyz"]`` / ``["points3D_rgb"]`` in the same frame.

Pixels stay in the store: ``image_filenames`` are :class:`StoreImageFile` objects (PNG encoded in
memory when nerfstudio's stock ``InputDataset`` opens one); raykit's datamanagers read the store
directly through :class:`raykit.integrations.nerfstudio.dataset.RaykitDataset`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
from nerfstudio.cameras import camera_utils
from nerfstudio.cameras.cameras import Cameras, CameraType
from nerfstudio.data.dataparsers.base_dataparser import DataParser, DataParserConfig, DataparserOutputs
from nerfstudio.data.scene_box import SceneBox
from nerfstudio.plugins.registry_dataparser import DataParserSpecification

from raykit.conventions import opencv_to_opengl_c2w
from raykit.errors import ConfigError
from raykit.integrations.camera_map import nerfstudio_intrinsics
from raykit.integrations.nerfstudio.store_files import StoreImageFile, open_location, store_location

__all__ = ["RaykitDataParser", "RaykitDataParserConfig", "raykit_dataparser"]

_ALPHA_COLORS = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}


@dataclass
class RaykitDataParserConfig(DataParserConfig):
    """A raykit store (``--data scene.zarr``, a directory or an fsspec URL) for nerfstudio."""

    _target: type = field(default_factory=lambda: RaykitDataParser)
    data: Path = Path()
    """Store path or URL (``raykit convert`` output)."""
    eval_split: str | None = None
    """Store split served when nerfstudio asks for "val" or "test"; default: the split of that name,
    else the other one of the two."""
    alpha_color: Literal["white", "black", "none"] = "white"
    """Background composited under RGBA stores' pixels; "none" keeps four channels."""
    alpha_as_mask: bool = False
    """Also give nerfstudio a ``mask`` (alpha > 0) for RGBA stores."""
    orientation_method: Literal["pca", "up", "vertical", "none"] = "none"
    """As nerfstudio-data's; "none" keeps the store's world (``raykit convert --normalize`` chose it)."""
    center_method: Literal["poses", "focus", "none"] = "none"
    """As nerfstudio-data's."""
    auto_scale_poses: bool = False
    """As nerfstudio-data's: scale so that the largest camera coordinate is 1."""
    scale_factor: float = 1.0
    """Extra scale on the camera positions (after ``auto_scale_poses``)."""
    load_3D_points: bool = True
    """Put the store's sparse points in ``metadata`` (splatfacto's initialisation)."""
    components: tuple[str, ...] = ("mask", "depth")
    """The store's per-image components served, of those it has: ``mask`` as nerfstudio's ``mask``
    (H, W, 1) bool, ``depth`` as its ``depth_image`` (H, W, 1) float32 in nerfstudio's units."""


@dataclass
class _Frame:
    """The similarity from the store's world to nerfstudio's: ``x' = scale * (transform @ [x; 1])``."""

    transform: torch.Tensor  # (3, 4) float32
    scale: float

    def points(self, xyz: torch.Tensor) -> torch.Tensor:
        """(P, 3) store-world points -> (P, 3) nerfstudio-frame points."""
        return (xyz @ self.transform[:, :3].T + self.transform[:, 3]) * self.scale


class RaykitDataParser(DataParser):
    """Reads cameras, splits, bounds and points from a raykit store (pixels are read later)."""

    config: RaykitDataParserConfig

    def __init__(self, config: RaykitDataParserConfig) -> None:
        super().__init__(config)
        self.location = store_location(config.data)
        self.store = open_location(self.location)
        self._frame: _Frame | None = None

    def store_split(self, split: str) -> str:
        """The store split that serves nerfstudio's ``split``; ConfigError (one line) when none does."""
        splits = sorted(self.store.splits)
        wanted = [split]
        if split in ("val", "test"):
            other = {"val": "test", "test": "val"}[split]
            wanted = [self.config.eval_split] if self.config.eval_split else [split, other]
        for name in wanted:
            if name in self.store.splits:
                return name
        raise ConfigError(
            f"raykit-data: {self.location}: no split {wanted[0]!r} for nerfstudio's {split!r} split; "
            f"the store has {splits} (choose one with --pipeline.datamanager.dataparser.eval-split)"
        )

    def frame(self) -> _Frame:
        """The store-world -> nerfstudio similarity, computed once from every image's pose."""
        if self._frame is None:
            table = self.store.table
            poses = torch.from_numpy(opencv_to_opengl_c2w(table.c2w.astype(np.float64))).float()
            oriented, transform = camera_utils.auto_orient_and_center_poses(
                poses, method=self.config.orientation_method, center_method=self.config.center_method
            )
            scale = 1.0 / float(oriented[:, :3, 3].abs().max()) if self.config.auto_scale_poses else 1.0
            self._frame = _Frame(transform.float(), scale * self.config.scale_factor)
        return self._frame

    def _generate_dataparser_outputs(self, split: str = "train", **kwargs: Any) -> DataparserOutputs:
        name = self.store_split(split)
        table, frame = self.store.table, self.frame()
        rows = np.flatnonzero(np.asarray(table.splits) == name)
        cameras = self._cameras(rows, frame)
        alpha = self.store.rgba_channels == 4 and self.config.alpha_color != "none"
        metadata: dict[str, Any] = {
            "raykit_store": self.location,
            "raykit_split": name,
            "raykit_names": [table.names[r] for r in rows],
            "raykit_alpha_as_mask": bool(self.config.alpha_as_mask and self.store.rgba_channels == 4),
            "raykit_components": [
                c for c in ("mask", "depth") if c in self.config.components and c in self.store.components
            ],
        }
        if self.config.load_3D_points:
            metadata.update(self._points(frame))
        return DataparserOutputs(
            # nerfstudio types these as paths but opens them with ``Image.open``, which takes a file; a cast,
            # not a ``type: ignore``, so that mypy is clean with and without nerfstudio installed
            image_filenames=cast("list[Path]", [StoreImageFile(self.location, table.names[r]) for r in rows]),
            cameras=cameras,
            alpha_color=torch.tensor(_ALPHA_COLORS[self.config.alpha_color]) if alpha else None,
            scene_box=self._scene_box(frame, cameras),
            metadata=metadata,
            dataparser_transform=frame.transform,
            dataparser_scale=frame.scale,
        )

    def _cameras(self, rows: np.ndarray, frame: _Frame) -> Cameras:
        """The ``rows`` of the camera table as one nerfstudio ``Cameras`` (I,)."""
        table = self.store.table
        intrinsics = [nerfstudio_intrinsics(table.cameras[table.camera_index[r]]) for r in rows]
        c2w = torch.from_numpy(opencv_to_opengl_c2w(table.c2w[rows].astype(np.float64))).float()
        c2w = frame.transform @ c2w  # (3, 4) @ (I, 4, 4) -> (I, 3, 4)
        c2w[:, :, 3] *= frame.scale

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32)[:, None]

        return Cameras(
            camera_to_worlds=c2w,
            fx=column([k.fx for k in intrinsics]),
            fy=column([k.fy for k in intrinsics]),
            cx=column([k.cx for k in intrinsics]),
            cy=column([k.cy for k in intrinsics]),
            width=torch.from_numpy(table.width[rows].astype(np.int64))[:, None],
            height=torch.from_numpy(table.height[rows].astype(np.int64))[:, None],
            distortion_params=torch.tensor([k.distortion for k in intrinsics], dtype=torch.float32),
            camera_type=[CameraType[k.camera_type] for k in intrinsics],
            times=None
            if table.time is None
            else torch.from_numpy(table.time[rows].astype(np.float32))[:, None],
        )

    def _scene_box(self, frame: _Frame, cameras: Cameras) -> SceneBox:
        bounds = self.store.scene.bounds
        if bounds is None:
            table = self.store.table
            every = torch.from_numpy(table.c2w[:, :3, 3].astype(np.float32))
            r = float(frame.points(every).abs().max()) or 1.0
            return SceneBox(aabb=torch.tensor([[-r, -r, -r], [r, r, r]], dtype=torch.float32))
        lo, hi = np.asarray(bounds[0]), np.asarray(bounds[1])
        corners = np.array(
            [[(lo, hi)[(i >> k) & 1][k] for k in range(3)] for i in range(8)], dtype=np.float32
        )
        moved = frame.points(torch.from_numpy(corners))
        return SceneBox(aabb=torch.stack([moved.min(0).values, moved.max(0).values]))

    def _points(self, frame: _Frame) -> dict[str, torch.Tensor]:
        points = self.store.sparse_points()
        if points is None or len(points) == 0:
            return {}
        xyz = frame.points(torch.from_numpy(points.xyz.astype(np.float32)))
        return {"points3D_xyz": xyz, "points3D_rgb": torch.from_numpy(points.rgb.astype(np.uint8))}


raykit_dataparser = DataParserSpecification(
    config=RaykitDataParserConfig(),
    description="a raykit store (raykit convert output); cameras, splits, bounds, points and pixels from it",
)
