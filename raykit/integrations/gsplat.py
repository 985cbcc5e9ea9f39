"""A raykit store in place of gsplat's COLMAP ``Parser`` and ``Dataset`` (``examples/simple_trainer.py``).

``Parser(store)`` has what the trainer reads from gsplat's parser (``camtoworlds`` OpenCV, ``Ks_dict``,
``points``, ``transform``...; ``normalize=True``: gsplat's own world frame,
``raykit.integrations.gsplat_world``); ``factor`` serves resolution level ``factor`` of the full-size
store, images undistorted to their pinhole cameras. ``Dataset(parser, split)`` returns gsplat's items
(with ``time``, ``mask``, ``points``/``depths`` where the store has them); its ``loader()`` is the same
split as a :class:`raykit.loaders.ImageLoader`. The contract, field by field: docs/integrations.md,
"gsplat".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raykit.errors import ConfigError
from raykit.image_geometry import RemapTable, pinhole_camera
from raykit.integrations.gsplat_world import (
    align_principal_axes,
    normalize_world,
    similarity_from_cameras,
    transform_points,
)
from raykit.loaders import ImageBatch, ImageLoader, ImageLoaderConfig, ImagePlan, level_camera
from raykit.store import RayStore, open_store

__all__ = [
    "Dataset",
    "Parser",
    "align_principal_axes",
    "depth_points",
    "normalize_world",
    "similarity_from_cameras",
]


def depth_points(depth: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A depth map (H, W) (0 = unknown) -> gsplat's ``points`` (M, 2) float32 pixel centres
    ``(x + 0.5, y + 0.5)`` and ``depths`` (M,) float32 (times ``scale``) of its known pixels, row-major."""
    ys, xs = np.nonzero(depth > 0)
    points = np.stack([xs + 0.5, ys + 0.5], axis=1).astype(np.float32)
    return points, (depth[ys, xs].astype(np.float64) * scale).astype(np.float32)


class Parser:
    """gsplat's parser attributes for every image of a raykit store (see the module docstring)."""

    def __init__(self, store: RayStore | str, normalize: bool = False, factor: int = 1) -> None:
        self.store = open_store(store) if isinstance(store, str) else store
        if not isinstance(factor, int) or isinstance(factor, bool) or factor < 1:
            raise ConfigError(
                f"gsplat adapter: {self.store.url}: factor: expected a positive integer, got {factor!r}"
            )
        self.factor = factor
        table = self.store.table
        self.image_names: list[str] = list(table.names)
        self.splits: list[str] = list(table.splits)
        self.camera_ids: list[int] = [int(i) for i in table.camera_index]
        self.cameras = {i: level_camera(camera, factor) for i, camera in enumerate(table.cameras)}
        self.pinholes = {i: pinhole_camera(camera) for i, camera in self.cameras.items()}
        self.Ks_dict = {i: np.asarray(cam.K(), dtype=np.float64) for i, cam in self.pinholes.items()}
        self.imsize_dict = {i: (cam.width, cam.height) for i, cam in self.pinholes.items()}
        self.params_dict = {i: np.empty(0, dtype=np.float32) for i in self.pinholes}
        self.mask_dict: dict[int, np.ndarray | None] = dict.fromkeys(self.pinholes)
        c2w = table.c2w.astype(np.float64)
        points = self.store.sparse_points()
        # float32 first, as gsplat's parser reads COLMAP points, so the normalisation is gsplat's to the bit
        xyz = np.zeros((0, 3)) if points is None else points.xyz.astype(np.float32).astype(np.float64)
        self.transform = np.eye(4)
        if normalize:
            c2w, moved, self.transform = normalize_world(c2w, xyz if len(xyz) >= 4 else None)
            xyz = transform_points(self.transform, xyz) if moved is None else moved
        self.camtoworlds = c2w
        self.times = None if table.time is None else table.time.astype(np.float32)  # (I,), or None: static
        self.world_scale = float(np.cbrt(np.linalg.det(self.transform[:3, :3])))  # the similarity's scale
        self.points = xyz.astype(np.float32)
        self.points_rgb = np.zeros((0, 3), np.uint8) if points is None else points.rgb.astype(np.uint8)
        self.points_err = np.zeros(0, np.float32) if points is None else points.error.astype(np.float32)
        centres = c2w[:, :3, 3]
        self.scene_scale = float(np.max(np.linalg.norm(centres - centres.mean(0), axis=1)))

    def split_indices(self, split: str) -> np.ndarray:
        """(n,) int64 rows of ``split`` ("val" falls back to "test" and back); ConfigError when absent."""
        names = sorted(set(self.splits))
        for name in [split, {"val": "test", "test": "val"}.get(split, split)]:
            if name in names:
                return np.flatnonzero(np.asarray(self.splits) == name)
        raise ConfigError(f"gsplat adapter: {self.store.url}: no split {split!r}; the store has {names}")


class Dataset(torch.utils.data.Dataset[dict[str, Any]]):
    """gsplat's ``Dataset`` items for one split of a :class:`Parser` (see the module docstring).

    With ``world_size`` > 1 the dataset is rank ``rank``'s share of epoch ``set_epoch(e)``'s split
    (:class:`raykit.loaders.ImagePlan`'s shares with this ``seed``, ``drop_last``); ``image_id`` stays
    the image's position in the whole split. ``sampling="loss"``: feed each batch's per-view losses
    back through :meth:`observe` (docs/integrations.md, "gsplat").
    """

    def __init__(
        self, parser: Parser, split: str = "train", patch_size: int | None = None, load_depths: bool = False,
        seed: int = 0, world_size: int = 1, rank: int = 0, sampling: Any = "uniform",
    ) -> None:  # fmt: skip
        self.parser, self.split, self.patch_size, self.load_depths, self.seed = (
            parser,
            split,
            patch_size,
            load_depths,
            seed,
        )
        self.split_rows = parser.split_indices(split)
        self.n_images = len(self.split_rows)
        self.plan = ImagePlan(self.n_images, 1, seed, world_size=world_size, rank=rank)
        self._tables: dict[int, RemapTable | None] = {}
        self._draws = np.zeros(self.n_images, dtype=np.int64)
        self.sampling = ImageLoaderConfig(sampling=sampling).sampling  # checked now
        self._loader: ImageLoader | None = None  # the last ``loader()``, which ``observe`` feeds
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Take this rank's share of epoch ``epoch`` (all of the split with one rank)."""
        single = self.plan.world_size == 1
        self.positions = np.arange(self.n_images) if single else np.sort(self.plan.rank_order(epoch))
        self.indices = self.split_rows[self.positions]

    def __len__(self) -> int:
        return len(self.indices)

    def _table(self, index: int) -> RemapTable | None:
        """The undistortion table of store row ``index``'s camera (None for a pinhole)."""
        camera_id = self.parser.camera_ids[index]
        if camera_id not in self._tables:
            camera = self.parser.cameras[camera_id]
            self._tables[camera_id] = None if camera.is_pinhole else RemapTable.undistort(camera)[0]
        return self._tables[camera_id]

    def _pixels(self, index: int) -> np.ndarray:
        """(H, W, 3) uint8 undistorted pixels of store row ``index``."""
        parser = self.parser
        image = parser.store.read_image(parser.image_names[index], downscale=parser.factor)[..., :3]
        table = self._table(index)
        return image if table is None else table.apply(np.ascontiguousarray(image))

    def _component(self, index: int, name: str) -> np.ndarray | None:
        """Store row ``index``'s component ``name`` as its pixels are served (level, undistortion by
        the nearest sample), or None when the store has none."""
        parser = self.parser
        if name not in parser.store.components:
            return None
        array = parser.store.read_component(name, parser.image_names[index], downscale=parser.factor)
        table = self._table(index)
        return array if table is None else table.apply_nearest(array)

    def __getitem__(self, item: int) -> dict[str, Any]:
        index, position = int(self.indices[item]), int(self.positions[item])
        image = self._pixels(index)
        mask = self._component(index, "mask")
        depth = self._component(index, "depth") if self.load_depths else None
        K = self.parser.Ks_dict[self.parser.camera_ids[index]].copy()
        if self.patch_size is not None:
            rng = np.random.default_rng([self.seed, position, int(self._draws[position])])
            self._draws[position] += 1
            h, w = image.shape[:2]
            x, y = (
                int(rng.integers(max(w - self.patch_size, 1))),
                int(rng.integers(max(h - self.patch_size, 1))),
            )
            window = (slice(y, y + self.patch_size), slice(x, x + self.patch_size))
            image = image[window]
            mask = None if mask is None else mask[window]
            depth = None if depth is None else depth[window]
            K[0, 2] -= x
            K[1, 2] -= y
        c2w = self.parser.camtoworlds[index]
        data: dict[str, Any] = {
            "K": torch.from_numpy(K).float(),
            "camtoworld": torch.from_numpy(c2w).float(),
            "image": torch.from_numpy(np.ascontiguousarray(image)).float(),
            "image_id": position,
        }
        if self.parser.times is not None:
            data["time"] = torch.tensor(self.parser.times[index])
        if mask is not None:
            data["mask"] = torch.from_numpy(np.ascontiguousarray(mask) > 0)
        if depth is not None:
            points, depths = depth_points(depth, self.parser.world_scale)
            data["points"], data["depths"] = torch.from_numpy(points), torch.from_numpy(depths)
        elif self.load_depths:
            points, depths = self._projected(K, c2w, image.shape[1], image.shape[0])
            data["points"], data["depths"] = (
                torch.from_numpy(points).float(),
                torch.from_numpy(depths).float(),
            )
        return data

    def _projected(
        self, K: np.ndarray, c2w: np.ndarray, width: int, height: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sparse points in front of the camera and inside the image: (M, 2) pixels, (M,) depths."""
        w2c = np.linalg.inv(c2w)
        cam = self.parser.points.astype(np.float64) @ w2c[:3, :3].T + w2c[:3, 3]
        proj = cam @ K.T
        with np.errstate(divide="ignore", invalid="ignore"):
            xy = proj[:, :2] / proj[:, 2:3]
        keep = (cam[:, 2] > 0) & (xy[:, 0] >= 0) & (xy[:, 0] < width) & (xy[:, 1] >= 0) & (xy[:, 1] < height)
        return xy[keep], cam[keep, 2]

    def loader(self, **options: Any) -> ImageLoader:
        """This split as an ``ImageLoader`` (undistorted; ``patch_size`` crops; the parser's ``factor``
        as its ``downscale``; this dataset's ranks and ``sampling``); ``options`` go to it. Its batches
        hold cameras in the store's world, not in the parser's normalised frame."""
        crop = None if self.patch_size is None else (self.patch_size, self.patch_size)
        split = self.parser.splits[int(self.split_rows[0])]
        if self.plan.world_size > 1:
            options = {"world_size": self.plan.world_size, "rank": self.plan.rank, **options}
        options = {"sampling": self.sampling, **options}
        self._loader = ImageLoader(
            self.parser.store, split, undistort=True, crop=crop, seed=self.seed, downscale=self.parser.factor,
            **options,
        )  # fmt: skip
        return self._loader

    def observe(self, batch: ImageBatch, losses: Any) -> None:
        """Feed back the loss of each view of ``batch`` (one from :meth:`loader`'s last loader; ``(B,)``)
        to its view sampling: ``ImageLoader.observe`` (a no-op with uniform sampling).

        Raises:
            ConfigError: no loader made yet, or not one finite loss >= 0 per view.
        """
        if self._loader is None:
            raise ConfigError("gsplat dataset: observe: no loader() made yet to feed")
        self._loader.observe(batch, losses)
