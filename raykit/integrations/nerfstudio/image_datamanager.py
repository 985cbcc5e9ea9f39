"""``RaykitImageDataManager``: nerfstudio's full-image datamanager contract (``FullImageDatamanager``'s)
served by ``ImageLoader``: a byte-budgeted cache of images as served (composited and converted to
``cache_images_type`` once, by :class:`~raykit.integrations.nerfstudio.common.ServedPixels`),
undistortion to pinhole cameras computed once per camera, a seeded order, exact resume, and
splatfacto's coarse-to-fine schedule as the loader's resolution levels (:func:`splatfacto_on_levels`).
What ``next_train`` returns and why: docs/integrations.md, "Datamanagers".
"""

from __future__ import annotations

import functools
from copy import copy, deepcopy
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
from nerfstudio.cameras.cameras import Cameras, CameraType
from nerfstudio.data.datamanagers.base_datamanager import DataManagerConfig

from raykit.image_geometry import pinhole_camera
from raykit.integrations.nerfstudio.common import (
    DatasetRows,
    ServedPixels,
    StoreDataManager,
    served_components,
)
from raykit.integrations.nerfstudio.components import nerfstudio_components
from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
from raykit.loaders import IMAGE_CACHE_BYTES, ImageBatch, ImageLoader

__all__ = ["RaykitImageDataManager", "RaykitImageDataManagerConfig", "level_at", "splatfacto_on_levels"]


@dataclass
class RaykitImageDataManagerConfig(DataManagerConfig):
    """Whole images for full-image methods (splatfacto) from raykit's ``ImageLoader``."""

    _target: type = field(default_factory=lambda: RaykitImageDataManager)
    dataparser: RaykitDataParserConfig = field(default_factory=RaykitDataParserConfig)
    cache_images_type: Literal["uint8", "float32"] = "float32"
    """The image type returned (as nerfstudio's option of that name)."""
    cache_bytes: int = IMAGE_CACHE_BYTES
    """Budget of the image cache (per split), images held as served (``cache_images_type``)."""
    undistort: bool = True
    """Resample distorted images to pinhole cameras (splatting rasterises pinhole cameras)."""
    seed: int = 0
    """Seed of the image order."""
    num_workers: int = 0
    """Loader worker processes reading (and undistorting) images."""
    num_downscales: int = 0
    """Training images at 1/2^(num_downscales - step // resolution_schedule) (splatfacto's schedule)."""
    resolution_schedule: int = 3000
    """Steps per resolution level of that schedule."""


def level_at(step: int, num_downscales: int, resolution_schedule: int) -> int:
    """splatfacto's downscale factor at training ``step``: ``2 ** max(n - step // schedule, 0)``."""
    return int(2 ** max(num_downscales - step // resolution_schedule, 0))


def splatfacto_on_levels(config: Any, **kwargs: Any) -> Any:
    """A ``SplatfactoModel`` (``config._target`` of ``splatfacto-raykit``) whose ground truth, served
    at the rendered size by the datamanager's levels, is not shrunk a second time."""
    return _splatfacto_class()(config=config, **kwargs)


@functools.cache
def _splatfacto_class() -> type:
    from nerfstudio.models.splatfacto import SplatfactoModel

    class RaykitSplatfactoModel(SplatfactoModel):
        def _downscale_if_required(self, image: torch.Tensor) -> torch.Tensor:
            if tuple(image.shape[:2]) == tuple(getattr(self, "last_size", ())):
                return image  # already at this step's level
            return cast(torch.Tensor, super()._downscale_if_required(image))

    return RaykitSplatfactoModel


def served_cameras(dataset: Any, undistort: bool) -> Cameras:
    """The dataset's cameras as the loader's images show them: pinhole (no distortion) when undistorted."""
    cameras = deepcopy(dataset.cameras)
    if not undistort:
        return cameras
    store = dataset.store
    table = store.table
    for i, name in enumerate(dataset.names):
        pinhole = pinhole_camera(table.cameras[table.camera_index[store.image_index(name)]])
        fx, fy, cx, cy = pinhole.params
        cameras.fx[i], cameras.fy[i], cameras.cx[i], cameras.cy[i] = fx, fy, cx, cy
    if cameras.distortion_params is not None:
        cameras.distortion_params.zero_()
    cameras.camera_type.fill_(CameraType.PERSPECTIVE.value)
    return cameras


class RaykitImageDataManager(StoreDataManager):
    """See the module docstring; the constructor's arguments are nerfstudio's."""

    config: RaykitImageDataManagerConfig

    def setup_loaders(self, test_mode: str) -> None:
        config = self.config
        self.train_cameras = served_cameras(self.train_dataset, config.undistort)
        self.eval_cameras = served_cameras(self.eval_dataset, config.undistort)
        self._camera_slices: dict[str, dict[int, Cameras]] = {}
        self.train_rows = DatasetRows(self.dataparser, self.train_dataset)
        self.eval_rows = DatasetRows(self.dataparser, self.eval_dataset)
        self.train_loader = self._loader(self.train_rows.split, shuffle=True)
        self.eval_loader = self._loader(self.eval_rows.split, shuffle=True)
        if test_mode != "inference":  # decode what fits now, as nerfstudio's own caches at setup
            self.train_loader.preload()

    def _loader(self, split: str, shuffle: bool) -> ImageLoader:
        dataset = self.train_dataset if split == self.train_rows.split else self.eval_dataset
        alpha_color = dataset._dataparser_outputs.alpha_color
        served = ServedPixels(
            None if alpha_color is None else tuple(float(v) for v in alpha_color.reshape(-1).tolist()),
            self.config.cache_images_type,
            bool(dataset.metadata.get("raykit_alpha_as_mask")),
        )
        return ImageLoader(
            self.dataparser.store, split, 1, self.config.seed, shuffle=shuffle, device=self.device,
            num_workers=self.config.num_workers, cache_bytes=self.config.cache_bytes,
            rank=self.local_rank, world_size=self.world_size, undistort=self.config.undistort,
            transform=served, components=served_components(dataset),
        )  # fmt: skip

    def _item(self, batch: ImageBatch, which: str) -> tuple[Cameras, dict[str, Any]]:
        """One loader batch (an image as nerfstudio's dataset gives it) -> nerfstudio's ``(camera, data)``."""
        rows = getattr(self, f"{which}_rows")
        dataset = getattr(self, f"{which}_dataset")
        index = int(rows(batch.image.numpy())[0])
        served = batch.images[0]
        data: dict[str, Any] = {"image_idx": index}
        alpha_mask = None
        if dataset.metadata.get("raykit_alpha_as_mask"):
            data["image"] = served[..., :-1].to(self.device)
            alpha_mask = data["mask"] = (served[..., -1:] > 0).to(self.device)
        else:
            data["image"] = served.to(self.device)
        mask = None if batch.mask is None else batch.mask[0].to(self.device)
        depth = None if batch.depth is None else batch.depth[0].to(self.device)
        scale = float(dataset._dataparser_outputs.dataparser_scale)
        data.update(nerfstudio_components(mask, depth, scale, alpha_mask))
        camera = copy(self._one_camera(which, index))  # fresh metadata; tensors shared, as a slice's are
        camera.metadata = {"cam_idx": index} if which == "train" else camera.metadata
        return camera, data

    def _one_camera(self, which: str, index: int) -> Cameras:
        """``cameras[index : index + 1]`` on the device, sliced once per image."""
        known: dict[int, Cameras] = self._camera_slices.setdefault(which, {})
        if index not in known:
            cameras = getattr(self, f"{which}_cameras")
            known[index] = cameras[index : index + 1].to(self.device)
        return known[index]

    def _next(self, which: str) -> tuple[Cameras, dict[str, Any]]:
        return self._item(self.next_batch(which), which)

    def next_train(self, step: int) -> tuple[Cameras, dict[str, Any]]:
        self.train_count += 1
        level = level_at(step, self.config.num_downscales, self.config.resolution_schedule)
        if level != self.train_loader.downscale:
            self.train_loader.set_downscale(level)
            self._train_stream = None
        return self._next("train")

    def next_eval(self, step: int) -> tuple[Cameras, dict[str, Any]]:
        return self.next_eval_image(step)

    def next_eval_image(self, step: int) -> tuple[Cameras, dict[str, Any]]:
        self.eval_count += 1
        return self._next("eval")

    @property
    def fixed_indices_eval_dataloader(self) -> list[tuple[Cameras, dict[str, Any]]]:
        """Every evaluation image, in order (one pass of an unshuffled loader)."""
        with self._loader(self.eval_rows.split, shuffle=False) as loader:
            return [self._item(batch, "eval") for batch in loader]

    def setup_train(self) -> None:
        """Nothing to set up: the loaders start on the first batch."""

    def setup_eval(self) -> None:
        """Nothing to set up: the loaders start on the first batch."""

    def get_train_rays_per_batch(self) -> int:
        camera = self.train_cameras[0]
        return int(camera.width.item() * camera.height.item())

    def get_extra_state(self) -> dict[str, Any]:
        """The loaders' positions (JSON-able), saved in the pipeline's ``state_dict``."""
        return {"train": self.train_loader.state_dict(), "eval": self.eval_loader.state_dict()}

    def set_extra_state(self, state: Any) -> None:
        self.load_loader_states(state)
