"""Where the loader's ``loss`` sampling put the rays: a figure of training views beside their maps.

``write_sampling_map`` draws, for the training views the map favours most (at most ``views``), the view
and its map (``RayLoader.sampling_map``: draws per pixel relative to uniform, on a log2 scale) side by
side, as ``sampling_map.png`` in the run folder; the run report shows it. Nothing is written with
another sampling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from raykit.report import pyplot, save_figure

__all__ = ["SAMPLING_MAP", "write_sampling_map"]

SAMPLING_MAP = "sampling_map.png"
_CANDIDATES = 64  # views whose maps are compared to pick the most favoured


def write_sampling_map(loader: Any, store: Any, split: str, run_dir: Path, views: int = 3) -> Path | None:
    """Write ``run_dir / SAMPLING_MAP`` for the ``views`` training views of ``split`` whose maps draw
    the most rays a pixel (of the first ``_CANDIDATES``); return its path, or None without a map."""
    rows = [int(r) for r in store.split_rows(split)[:_CANDIDATES]]
    if not rows or loader.sampling_map(rows[0]) is None:
        return None
    scores = {row: float(loader.sampling_map(row).mean()) for row in rows}  # one full map held at a time
    chosen = sorted(rows, key=lambda row: -scores[row])[:views]
    maps = {row: loader.sampling_map(row) for row in chosen}
    plt = pyplot()

    fig, axes = plt.subplots(len(chosen), 2, figsize=(7, 3.2 * len(chosen)), squeeze=False)
    names = store.table.names
    for (left, right), row in zip(axes, chosen, strict=True):
        image = store.read_image(names[row])
        left.imshow(image)  # RGBA over the white figure
        left.set_title(f"{names[row]}", fontsize=9)
        shown = right.imshow(np.log2(np.maximum(maps[row], 1e-3)), cmap="magma", vmin=-2, vmax=3)
        right.set_title(f"rays per pixel vs uniform (log2), mean {maps[row].mean():.2f}x", fontsize=9)
        fig.colorbar(shown, ax=right, fraction=0.046)
        for ax in (left, right):
            ax.set_axis_off()
    return save_figure(fig, run_dir / SAMPLING_MAP, dpi=90)
