"""``RaykitDataManager``: nerfstudio's ray datamanager contract (``VanillaDataManager``'s) served by
``RayLoader``: rays shuffled across every image of the split, memory bounded by ``cache_bytes``,
exact resume through the module's extra state (saved in nerfstudio's checkpoints with the pipeline).
Rays, colours and indices are made on the loader's generation threads for whole groups of batches
(:class:`PixelRays`), through per-camera tables of nerfstudio's own ray directions
(:mod:`raykit.integrations.nerfstudio.rays`), so ``next_train`` only cuts and wraps them. What it
returns: docs/integrations.md, "Datamanagers".
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from nerfstudio.cameras.rays import RayBundle
from nerfstudio.data.datamanagers.base_datamanager import DataManagerConfig
from nerfstudio.data.utils.dataloaders import FixedIndicesEvalDataloader

from raykit.errors import ConfigError
from raykit.integrations.nerfstudio.common import (
    DatasetRows,
    StoreDataManager,
    float_colours,
    served_components,
)
from raykit.integrations.nerfstudio.components import nerfstudio_components
from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
from raykit.integrations.nerfstudio.rays import ray_bundle, tabulated_or_stock
from raykit.loaders import RAY_CACHE_BYTES, RayLoader
from raykit.store import RawRays, RayStore

__all__ = ["RaykitDataManager", "RaykitDataManagerConfig"]


@dataclass
class RaykitDataManagerConfig(DataManagerConfig):
    """Rays for ray-based methods (nerfacto, vanilla-nerf) from raykit's ``RayLoader``."""

    _target: type = field(default_factory=lambda: RaykitDataManager)
    dataparser: RaykitDataParserConfig = field(default_factory=RaykitDataParserConfig)
    train_num_rays_per_batch: int = 4096
    """Rays per training batch."""
    eval_num_rays_per_batch: int = 4096
    """Rays per evaluation batch (at most the evaluation split's rays)."""
    seed: int = 0
    """Seed of the ray order and of the evaluation image draws."""
    cache_bytes: int = RAY_CACHE_BYTES
    """Budget of the loader's chunk cache (per split)."""
    num_workers: int = 0
    """Loader worker processes reading chunks."""
    drop_masked: bool = True
    """With the store's masks, leave out of each batch the rays whose pixel the mask does not use
    (nerfstudio's pixel sampler samples only inside masks); False serves them with ``mask`` False."""
    ray_table_bytes: int = 256 << 20
    """Most bytes of per-camera ray tables (20 per pixel of each distinct set of intrinsics); cameras
    needing more are generated per batch by nerfstudio's ``RayGenerator``."""
    sampling: str = "uniform"
    """Which rays a training batch holds: ``uniform`` (the loader's shuffle) or ``loss`` (the loader's
    error-map importance sampling, fed back through :meth:`RaykitDataManager.observe`, which
    :class:`RaykitPipeline` calls each step). Batches then carry ``prob`` and ``weight``."""


@dataclass(frozen=True)
class RayRows:
    """``N`` rays made on the loader's generation threads: what ``next_train`` returns, as tensors.

    ``indices`` (N, 3) int64 ``[camera, y, x]``, ``image`` (N, 3|4) float32 (nerfstudio's colours),
    ``mask`` (N, 1) bool or None, ``depth_image`` (N, 1) float32 or None, and the ``RayBundle``'s
    fields: ``origins``, ``directions`` (N, 3), ``pixel_area``, ``directions_norm`` (N, 1) float32,
    ``camera_indices`` (N, 1) int64, ``times`` (N, 1) float32 when the store has time, else None;
    with ``sampling="loss"`` ``pid`` (N,) int64, the store's pixel ids (what
    :meth:`RaykitDataManager.observe` feeds back), ``prob`` and ``weight`` (N, 1) float32
    (``raykit.loaders``' sampling stage: the probability each ray was drawn with, and
    ``1 / (resident rays * prob)``). Sliceable, as the loader cuts generated groups into batches
    (slices are views).
    """

    indices: torch.Tensor
    image: torch.Tensor
    mask: torch.Tensor | None
    depth_image: torch.Tensor | None
    origins: torch.Tensor
    directions: torch.Tensor
    pixel_area: torch.Tensor
    directions_norm: torch.Tensor
    camera_indices: torch.Tensor
    times: torch.Tensor | None = None
    pid: torch.Tensor | None = None
    prob: torch.Tensor | None = None
    weight: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __getitem__(self, rows: slice | torch.Tensor) -> RayRows:
        cut: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        sliced: dict[str, Any] = {name: None if value is None else value[rows] for name, value in cut.items()}
        return RayRows(**sliced)

    def bundle(self, device: Any) -> RayBundle:
        """The nerfstudio ``RayBundle`` of these rays on ``device``."""
        bundle = ray_bundle(
            self.origins.to(device),
            self.directions.to(device),
            self.pixel_area.to(device),
            self.camera_indices.to(device),
            self.directions_norm.to(device),
        )
        if self.times is not None:
            bundle.times = self.times.to(device)
        return bundle


class PixelRays:
    """``make_batch`` of the loader: raw rays (pids) -> :class:`RayRows`, on its generation threads.

    Rays come from the dataparser's cameras through ``generator`` (a
    :class:`~raykit.integrations.nerfstudio.rays.TabulatedRayGenerator` or nerfstudio's own
    ``RayGenerator``), colours as nerfstudio's ``InputDataset`` computes them, so batches equal those
    nerfstudio's ``RayGenerator`` and dataset give for the same pixels; the consumer only wraps them.
    """

    def __init__(
        self, store: RayStore, rows: DatasetRows, generator: Any, alpha_color: Any, alpha_as_mask: bool,
        scale: float = 1.0, pids: bool = False,
    ) -> None:  # fmt: skip
        self.store, self.rows, self.generator = store, rows, generator
        self.alpha_color, self.alpha_as_mask, self.scale = alpha_color, alpha_as_mask, scale
        self.pids = pids  # keep each ray's pixel id (what observe feeds back; loss sampling only)

    def __call__(self, raw: RawRays) -> RayRows:
        image, pixel = self.store.decode_pids(raw.pid)
        indices = np.stack([self.rows(image), pixel[:, 1], pixel[:, 0]], axis=1).astype(np.int64)
        rgba = torch.from_numpy(np.ascontiguousarray(raw.rgba))
        with torch.no_grad():
            bundle = self.generator(torch.from_numpy(indices))
        mask, depth = (raw.extra.get(name) for name in ("mask", "depth"))
        served = nerfstudio_components(
            None if mask is None else torch.from_numpy(mask),
            None if depth is None else torch.from_numpy(depth),
            self.scale,
            rgba[:, 3:] > 0 if self.alpha_as_mask else None,
        )
        return RayRows(
            indices=torch.from_numpy(indices),
            image=float_colours(rgba, self.alpha_color),
            mask=served.get("mask"),
            depth_image=served.get("depth_image"),
            origins=bundle.origins.cpu(),
            directions=bundle.directions.cpu(),
            pixel_area=bundle.pixel_area.cpu(),
            directions_norm=bundle.metadata["directions_norm"].cpu(),
            camera_indices=bundle.camera_indices.cpu(),
            times=None if bundle.times is None else bundle.times.cpu(),
            pid=torch.from_numpy(np.asarray(raw.pid, np.int64)) if self.pids else None,
            prob=_column(raw.extra.get("prob")),
            weight=_column(raw.extra.get("weight")),
        )


def _column(values: np.ndarray | None) -> torch.Tensor | None:
    """(N,) numbers -> (N, 1) float32, as nerfstudio's batches hold per-ray values; None stays None."""
    return None if values is None else torch.from_numpy(np.asarray(values, np.float32)).reshape(-1, 1)


class RaykitDataManager(StoreDataManager):
    """See the module docstring; the constructor's arguments are nerfstudio's."""

    config: RaykitDataManagerConfig

    def setup_loaders(self, test_mode: str) -> None:
        """Nothing yet: nerfstudio's setup calls :meth:`setup_train` and :meth:`setup_eval`."""
        self.eval_image_draws = 0
        self._ray_tables: dict[bytes, Any] = {}  # shared by the splits' ray generators

    def _loader(self, dataset: Any, batch_size: int) -> tuple[RayLoader, Any]:
        """The split's ``RayLoader`` making :class:`RayRows`, and the split's ray generator on the device."""
        rows = DatasetRows(self.dataparser, dataset)
        store = self.dataparser.store
        cameras = dataset.cameras
        host = tabulated_or_stock(cameras.to("cpu"), self.config.ray_table_bytes, self._ray_tables)
        on_device = host if torch.device(self.device).type == "cpu" else host.to(self.device)
        sampling = self.config.sampling if dataset is self.train_dataset else "uniform"
        make = PixelRays(
            store=store,
            rows=rows,
            generator=host,
            alpha_color=dataset._dataparser_outputs.alpha_color,
            alpha_as_mask=bool(dataset.metadata.get("raykit_alpha_as_mask")),
            scale=float(dataset._dataparser_outputs.dataparser_scale),
            pids=sampling != "uniform",
        )
        loader = RayLoader(
            store, rows.split, batch_size, self.config.seed, cache_bytes=self.config.cache_bytes,
            num_workers=self.config.num_workers, rank=self.local_rank, world_size=self.world_size,
            make_batch=make, components=served_components(dataset),
            sampling=sampling,
        )  # fmt: skip
        return loader, on_device

    def setup_train(self) -> None:
        self.train_loader, self.train_ray_generator = self._loader(
            self.train_dataset, self.config.train_num_rays_per_batch
        )
        self._train_stream = None

    def setup_eval(self) -> None:
        n_rays = self.dataparser.store.splits[self.eval_dataset.metadata["raykit_split"]].n_rays
        self.eval_rays_per_batch = min(self.config.eval_num_rays_per_batch, n_rays)
        self.eval_loader, self.eval_ray_generator = self._loader(self.eval_dataset, self.eval_rays_per_batch)
        self._eval_stream = None
        self.fixed_indices_eval_dataloader = FixedIndicesEvalDataloader(self.eval_dataset, device=self.device)

    def _rays(self, which: str) -> tuple[Any, dict[str, torch.Tensor]]:
        rays: RayRows = self.next_batch(which)
        dataset = self.train_dataset if which == "train" else self.eval_dataset
        if self.config.drop_masked and rays.mask is not None and "mask" in served_components(dataset):
            rays = rays[rays.mask[:, 0]]
        batch = {"image": rays.image, "indices": rays.indices}
        if rays.mask is not None:
            batch["mask"] = rays.mask
        if rays.depth_image is not None:
            batch["depth_image"] = rays.depth_image
        for name in ("prob", "weight"):
            if (value := getattr(rays, name)) is not None:
                batch[name] = value
        if which == "train":
            self._last_train = rays
        return rays.bundle(self.device), batch

    def next_train(self, step: int) -> tuple[Any, dict[str, torch.Tensor]]:
        self.train_count += 1
        return self._rays("train")

    def observe(self, losses: Any) -> None:
        """Feed back the per-ray ``losses`` of the last :meth:`next_train` batch ((N,) or (N, 1), one
        per ray it returned) to the loader's sampling stage; a no-op with ``sampling="uniform"``.
        Observe each batch before taking the next: batches then depend only on the seed and the losses.

        Raises:
            ConfigError: no training batch was taken yet, or not one loss per ray of it.
        """
        last = getattr(self, "_last_train", None)
        if last is None:
            raise ConfigError("datamanager: observe: no training batch to observe (call next_train first)")
        self.train_loader.observe(last, losses)

    def observe_outputs(self, model: Any, outputs: dict[str, Any]) -> None:
        """With ``sampling="loss"``, feed back the last training batch's per-ray squared error of
        ``outputs["rgb"]`` (the mean over channels of what nerfacto's ``rgb_loss`` averages, through
        ``model.renderer_rgb``'s background blending when the model has one); else nothing.
        :class:`RaykitPipeline` calls it after each step's loss."""
        if self.config.sampling == "uniform":
            return
        pred = outputs["rgb"].detach()
        image = self._last_train.image.to(pred.device)
        renderer = getattr(model, "renderer_rgb", None)
        if renderer is not None and "accumulation" in outputs:
            pred, image = renderer.blend_background_for_loss_computation(
                pred_image=pred, pred_accumulation=outputs["accumulation"].detach(), gt_image=image
            )
        self.observe(((pred - image[..., :3]) ** 2).mean(-1))

    def next_eval(self, step: int) -> tuple[Any, dict[str, torch.Tensor]]:
        self.eval_count += 1
        return self._rays("eval")

    def next_eval_image(self, step: int) -> tuple[Any, dict[str, Any]]:
        draw = np.random.default_rng([self.config.seed, self.eval_image_draws])
        self.eval_image_draws += 1
        return self.fixed_indices_eval_dataloader.get_camera(int(draw.integers(len(self.eval_dataset))))

    def get_train_rays_per_batch(self) -> int:
        return self.config.train_num_rays_per_batch

    def get_eval_rays_per_batch(self) -> int:
        return self.eval_rays_per_batch

    def get_extra_state(self) -> dict[str, Any]:
        """The loaders' positions (JSON-able), saved in the pipeline's ``state_dict``; empty in
        nerfstudio's "inference" mode (ns-render, the viewer), which sets up no loader."""
        if not hasattr(self, "train_loader"):
            return {}
        return {
            "train": self.train_loader.state_dict(),
            "eval": self.eval_loader.state_dict(),
            "eval_image_draws": self.eval_image_draws,
        }

    def set_extra_state(self, state: Any) -> None:
        if not state or not hasattr(self, "train_loader"):  # inference mode: nothing to continue
            return
        self.load_loader_states(state)
        self.eval_image_draws = int(state["eval_image_draws"])
