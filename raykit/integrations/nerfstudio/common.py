"""What both raykit datamanagers share: their constructor, the parser's outputs, datasets, the loaders'
streams and colours as nerfstudio's ``InputDataset`` computes them (so batches equal those of
nerfstudio's own datamanagers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from nerfstudio.data.datamanagers.base_datamanager import DataManager

from raykit.errors import ConfigError
from raykit.integrations.nerfstudio.dataparser import RaykitDataParser, RaykitDataParserConfig
from raykit.integrations.nerfstudio.dataset import RaykitDataset

__all__ = [
    "DatasetRows",
    "ServedPixels",
    "StoreDataManager",
    "float_colours",
    "served_components",
    "uint8_colours",
]


class StoreDataManager(DataManager):
    """The datamanagers' base: nerfstudio's constructor arguments; the dataparser, its outputs and the
    datasets (:class:`RaykitDataset`) set as nerfstudio's datamanagers set them, then the subclass's
    :meth:`setup_loaders`, then nerfstudio's own ``DataManager.__init__``."""

    dataparser: RaykitDataParser
    train_dataset: RaykitDataset
    eval_dataset: RaykitDataset
    train_loader: Any  # the subclass's loaders: RayLoader or ImageLoader
    eval_loader: Any

    def __init__(
        self,
        config: Any,
        device: torch.device | str = "cpu",
        test_mode: Literal["test", "val", "inference"] = "val",
        world_size: int = 1,
        local_rank: int = 0,
        **kwargs: Any,
    ) -> None:
        if not isinstance(config.dataparser, RaykitDataParserConfig):
            got = type(config.dataparser).__name__
            raise ConfigError(f"raykit datamanager: expected the raykit-data dataparser, got {got}")
        if config.data is not None:
            config.dataparser.data = Path(config.data)
        else:
            config.data = config.dataparser.data
        self.config, self.device = config, device
        self.world_size, self.local_rank = world_size, local_rank
        self.sampler = None
        self.test_mode = test_mode
        self.test_split = "test" if test_mode in ("test", "inference") else "val"
        self.dataparser_config = config.dataparser
        self.dataparser = config.dataparser.setup()
        self.includes_time = False
        self.train_dataparser_outputs = self.dataparser.get_dataparser_outputs(split="train")
        self.train_dataset = RaykitDataset(self.train_dataparser_outputs)
        self.eval_dataset = RaykitDataset(self.dataparser.get_dataparser_outputs(split=self.test_split))
        self.exclude_batch_keys_from_device = list(self.train_dataset.exclude_batch_keys_from_device)
        self._train_stream: Any = None
        self._eval_stream: Any = None
        self.setup_loaders(test_mode)
        super().__init__()

    def setup_loaders(self, test_mode: str) -> None:
        """What the subclass sets up once the datasets are there (before nerfstudio's setup)."""

    def next_batch(self, which: str) -> Any:
        """The next batch of the ``which`` (``train`` or ``eval``) loader, its stream started once."""
        if getattr(self, f"_{which}_stream") is None:
            setattr(self, f"_{which}_stream", getattr(self, f"{which}_loader").forever())
        return next(getattr(self, f"_{which}_stream"))

    def load_loader_states(self, state: Any) -> None:
        """Continue both loaders from ``get_extra_state``'s positions."""
        self.train_loader.load_state_dict(state["train"])
        self.eval_loader.load_state_dict(state["eval"])
        self._train_stream = self._eval_stream = None

    def get_datapath(self) -> Any:
        return self.config.dataparser.data

    def get_param_groups(self) -> dict[str, list[Any]]:
        return {}


class DatasetRows:
    """Store camera-table rows -> positions in one split's dataset (nerfstudio's camera indices)."""

    def __init__(self, parser: RaykitDataParser, dataset: RaykitDataset) -> None:
        self.split = dataset.metadata["raykit_split"]
        table = parser.store.table
        rows = np.flatnonzero(np.asarray(table.splits) == self.split)
        self.lookup = np.full(len(table.names), -1, dtype=np.int64)
        self.lookup[rows] = np.arange(len(rows))

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        """(N,) store rows -> (N,) int64 dataset indices."""
        return self.lookup[rows]


def served_components(dataset: Any) -> tuple[str, ...]:
    """The store components the datamanagers serve for ``dataset`` (the parser's ``components`` the
    store has)."""
    return tuple(dataset.metadata.get("raykit_components", ()))


def float_colours(rgba: torch.Tensor, alpha_color: torch.Tensor | None) -> torch.Tensor:
    """(..., C) uint8 -> (..., 3|C) float32 exactly as ``InputDataset.get_image_float32``."""
    image = rgba.to(torch.float32) / 255.0
    if alpha_color is not None and image.shape[-1] == 4:
        alpha = image[..., -1:]
        image = image[..., :3] * alpha + alpha_color.to(image.device) * (1.0 - alpha)
    return image


def uint8_colours(rgba: torch.Tensor, alpha_color: torch.Tensor | None) -> torch.Tensor:
    """(..., C) uint8 -> (..., 3|C) uint8 exactly as ``InputDataset.get_image_uint8``."""
    if alpha_color is None or rgba.shape[-1] != 4:
        return rgba
    alpha = rgba[..., -1:] / 255.0
    image = rgba[..., :3] * alpha + 255.0 * alpha_color.to(rgba.device) * (1.0 - alpha)
    return torch.clamp(image, min=0, max=255).to(torch.uint8)


_BLOCK_ROWS = 32  # image rows converted at once (bounds the temporaries)


@dataclass(frozen=True)
class ServedPixels:
    """``ImageLoader`` transform: (H, W, C) uint8 store pixels -> the image nerfstudio's dataset gives.

    ``uint8_colours`` or ``float_colours`` (``image_type``) over ``alpha_color`` (RGB in [0, 1], or
    None); with ``with_mask`` one more channel, 1 where alpha > 0 (the dataset's ``mask``). Applied
    once per image before the loader's cache, so cached images are served as they are. Pickles (for
    the loader's worker processes).

    Each output value is a function of one channel's value and the pixel's alpha, so the functions
    are tabulated once, by the very ``uint8_colours`` / ``float_colours`` calls on every
    ``(value, alpha)`` pair (bit-identical results), and an image costs one table look-up per
    value, a few rows at a time (no image-sized float temporaries).
    """

    alpha_color: tuple[float, ...] | None
    image_type: str = "float32"
    with_mask: bool = False

    def _tables(self, composite: bool) -> np.ndarray:
        """With ``composite``: (3, 65536) ``[channel, value << 8 | alpha]`` -> served value; else
        (1, 256) ``[0, value]`` -> value as float32 (both by nerfstudio's functions)."""
        tables = _TABLES.get((self, composite))
        if tables is None:
            colour = None if self.alpha_color is None else torch.tensor(self.alpha_color, dtype=torch.float32)
            if not composite:
                grid = np.arange(256, dtype=np.uint8)[:, None]
                tables = _serve(torch.from_numpy(grid), None, self.image_type).numpy().reshape(1, 256)
            else:
                grid = np.zeros((256, 256, 4), dtype=np.uint8)
                grid[..., :3] = np.arange(256, dtype=np.uint8)[:, None, None]
                grid[..., 3] = np.arange(256, dtype=np.uint8)[None, :]
                served = _serve(torch.from_numpy(grid), colour, self.image_type).numpy()
                tables = served.reshape(65536, 3).T
            tables = np.ascontiguousarray(tables)
            _TABLES[(self, composite)] = tables
        return tables

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """(H, W, C) uint8 -> (H, W, C') served pixels, C' = 3 with alpha compositing, C otherwise,
        plus one with ``with_mask``."""
        h, w, channels = image.shape
        composite = self.alpha_color is not None and channels == 4
        out_channels = (3 if composite else channels) + int(self.with_mask)
        out = np.empty((h, w, out_channels), dtype=np.uint8 if self.image_type == "uint8" else np.float32)
        tables = self._tables(composite) if composite or self.image_type != "uint8" else None
        for top in range(0, h, _BLOCK_ROWS):
            rows, target = image[top : top + _BLOCK_ROWS], out[top : top + _BLOCK_ROWS]
            if tables is None:  # uint8 without compositing: the pixels as they are
                target[..., :channels] = rows
            elif composite:
                alpha = rows[..., 3].astype(np.uint16)
                for k in range(3):
                    index = rows[..., k].astype(np.uint16)
                    index <<= 8
                    index |= alpha
                    target[..., k] = tables[k][index]
            else:
                target[..., :channels] = tables[0][rows]
            if self.with_mask:
                target[..., -1] = rows[..., 3] > 0
        return out


_TABLES: dict[tuple[ServedPixels, bool], np.ndarray] = {}


def _serve(rgba: torch.Tensor, alpha_color: torch.Tensor | None, image_type: str) -> torch.Tensor:
    if image_type == "uint8":
        return uint8_colours(rgba, alpha_color)
    return float_colours(rgba, alpha_color)
