"""``RaykitDataManager``: nerfstudio's ray datamanager contract (``VanillaDataManager``'s) served by
``RayLoader``: rays shuffled across every image of the split, memory bounded by ``cache_bytes``,
exact resume through the module's extra state (saved in nerfstudio's checkpoints with the pipeline).

``next_train`` / ``next_eval`` return ``(RayBundle, {"image": (N, 3|4) float32 CPU, "indices":
(N, 3) int64 CPU [camera, y, x]})`` with the bundle from nerfstudio's own ``RayGenerator`` on the
dataparser's cameras; ``next_eval_image`` returns ``(Cameras (1,), dataset item)`` as its
``RandIndicesEvalDataloader`` does, from a seeded draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from nerfstudio.data.datamanagers.base_datamanager import DataManager, DataManagerConfig
from nerfstudio.data.utils.dataloaders import FixedIndicesEvalDataloader
from nerfstudio.model_components.ray_generators import RayGenerator

from raykit.integrations.nerfstudio.common import DatasetRows, float_colours, setup_datasets
from raykit.integrations.nerfstudio.dataparser import RaykitDataParser, RaykitDataParserConfig
from raykit.integrations.nerfstudio.dataset import RaykitDataset
from raykit.loaders import RayLoader
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
    cache_bytes: int = 512 << 20
    """Budget of the loader's chunk cache (per split)."""
    num_workers: int = 0
    """Loader worker processes reading chunks."""


@dataclass(frozen=True)
class PixelBatch:
    """``N`` rays as nerfstudio indexes them: ``indices`` (N, 3) int64 ``[camera, y, x]``, ``rgba``
    (N, C) uint8. Sliceable, as the loader cuts generated groups into batches."""

    indices: torch.Tensor
    rgba: torch.Tensor

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __getitem__(self, rows: slice) -> PixelBatch:
        return PixelBatch(self.indices[rows], self.rgba[rows])


class PixelIndices:
    """``make_batch`` of the loader: raw rays (pids) -> :class:`PixelBatch` (no ray generation:
    nerfstudio's ``RayGenerator`` makes the rays from the dataparser's cameras)."""

    def __init__(self, store: RayStore, rows: DatasetRows) -> None:
        self.store, self.rows = store, rows

    def __call__(self, raw: RawRays) -> PixelBatch:
        image, pixel = self.store.decode_pids(raw.pid)
        indices = np.stack([self.rows(image), pixel[:, 1], pixel[:, 0]], axis=1).astype(np.int64)
        return PixelBatch(torch.from_numpy(indices), torch.from_numpy(np.ascontiguousarray(raw.rgba)))


class RaykitDataManager(DataManager):
    """See the module docstring; the constructor's arguments are nerfstudio's."""

    config: RaykitDataManagerConfig
    dataparser: RaykitDataParser
    train_dataset: RaykitDataset
    eval_dataset: RaykitDataset

    def __init__(
        self,
        config: RaykitDataManagerConfig,
        device: torch.device | str = "cpu",
        test_mode: Literal["test", "val", "inference"] = "val",
        world_size: int = 1,
        local_rank: int = 0,
        **kwargs: Any,
    ) -> None:
        self.config, self.device = config, device
        self.world_size, self.local_rank = world_size, local_rank
        self.sampler = None
        self.eval_image_draws = 0
        setup_datasets(self, config, test_mode)
        super().__init__()

    def _loader(self, dataset: Any, batch_size: int) -> RayLoader:
        rows = DatasetRows(self.dataparser, dataset)
        store = self.dataparser.store
        return RayLoader(
            store, rows.split, batch_size, self.config.seed, cache_bytes=self.config.cache_bytes,
            num_workers=self.config.num_workers, rank=self.local_rank, world_size=self.world_size,
            make_batch=PixelIndices(store, rows),
        )  # fmt: skip

    def setup_train(self) -> None:
        self.train_loader = self._loader(self.train_dataset, self.config.train_num_rays_per_batch)
        self._train_stream: Any = None
        self.train_ray_generator = RayGenerator(self.train_dataset.cameras.to(self.device))

    def setup_eval(self) -> None:
        n_rays = self.dataparser.store.splits[self.eval_dataset.metadata["raykit_split"]].n_rays
        self.eval_rays_per_batch = min(self.config.eval_num_rays_per_batch, n_rays)
        self.eval_loader = self._loader(self.eval_dataset, self.eval_rays_per_batch)
        self._eval_stream: Any = None
        self.eval_ray_generator = RayGenerator(self.eval_dataset.cameras.to(self.device))
        self.fixed_indices_eval_dataloader = FixedIndicesEvalDataloader(self.eval_dataset, device=self.device)

    def _rays(self, which: str) -> tuple[Any, dict[str, torch.Tensor]]:
        loader = getattr(self, f"{which}_loader")
        if getattr(self, f"_{which}_stream") is None:
            setattr(self, f"_{which}_stream", loader.forever())
        pixels: PixelBatch = next(getattr(self, f"_{which}_stream"))
        indices, rgba = pixels.indices, pixels.rgba
        dataset = getattr(self, f"{which}_dataset")
        batch = {"image": float_colours(rgba, dataset._dataparser_outputs.alpha_color), "indices": indices}
        if dataset.metadata.get("raykit_alpha_as_mask"):
            batch["mask"] = rgba[:, 3:] > 0
        return getattr(self, f"{which}_ray_generator")(indices), batch

    def next_train(self, step: int) -> tuple[Any, dict[str, torch.Tensor]]:
        self.train_count += 1
        return self._rays("train")

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

    def get_datapath(self) -> Any:
        return self.config.dataparser.data

    def get_param_groups(self) -> dict[str, list[Any]]:
        return {}

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
        self.train_loader.load_state_dict(state["train"])
        self.eval_loader.load_state_dict(state["eval"])
        self.eval_image_draws = int(state["eval_image_draws"])
        self._train_stream = self._eval_stream = None
