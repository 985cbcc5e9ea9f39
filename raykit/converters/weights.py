"""``raykit add-component STORE temporal``: DyNeRF's ISG and IST weights of a multi-view video store as
its ``isg`` and ``ist`` components (``raykit.store.components``; drawn by ``RayLoader(sampling=
"temporal")``).

The store's own images are read camera by camera (``table.rig_camera``), each camera's frames in
``frame_index`` order, and :func:`raykit.temporal_weights.temporal_weights` computes the camera's
weights (float16 at level ``factor``); they are spilled to a file beside the store, so memory holds one
camera's frames and weights whatever the number of cameras, then both components are written, the
manifest last (``raykit.store.add_components``). Their options (``gamma``, ``shift``, ``alpha``,
``factor``) are recorded in each component's ``source``.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from raykit.errors import SourceError
from raykit.progress import progress as progress_bar
from raykit.store import ComponentInfo, RayStore, add_components, open_store
from raykit.temporal_weights import TemporalWeightsConfig, temporal_weights

__all__ = ["add_temporal_weights", "camera_frames"]

KINDS = ("isg", "ist")


def camera_frames(store: RayStore) -> dict[int, np.ndarray]:
    """Rig camera -> its camera-table rows in frame order.

    Raises:
        SourceError: the store has no camera and frame index per image, or a camera with a frame
            index twice (one line naming the store).
    """
    table = store.table
    rig, frame = table.rig_camera, table.frame_index
    if rig is None or frame is None or len(rig) == 0 or (rig < 0).any() or (frame < 0).any():
        raise SourceError(
            f"{store.url}: ISG/IST weights need a multi-view video store (camera and frame index per image)"
        )
    cameras: dict[int, np.ndarray] = {}
    for camera in np.unique(rig).tolist():
        rows = np.flatnonzero(rig == camera)
        rows = rows[np.argsort(frame[rows], kind="stable")]
        twice = np.flatnonzero(np.diff(frame[rows]) == 0)
        if len(twice):
            raise SourceError(f"{store.url}: camera {camera} has frame index {frame[rows[twice[0]]]} twice")
        cameras[int(camera)] = rows
    return cameras


def add_temporal_weights(
    store_path: str | Path, config: TemporalWeightsConfig | None = None, *, progress: bool = False
) -> RayStore:
    """Add the ``isg`` and ``ist`` components of the local store at ``store_path`` (see the module).

    Raises:
        SourceError: not a multi-view video store (:func:`camera_frames`), or a camera's frames of
            different sizes or under the level; the store is unchanged.
        ConfigError: a remote store, or one with the weights already.
    """
    config = TemporalWeightsConfig() if config is None else config
    store = open_store(store_path)
    cameras, table, factor = camera_frames(store), store.table, config.factor
    sizes = (table.height // factor) * (table.width // factor)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    root = Path(store.url)
    with tempfile.TemporaryDirectory(prefix=".raykit-weights-", dir=root.parent) as folder:
        spilled = {
            kind: np.lib.format.open_memmap(
                Path(folder) / f"{kind}.npy", "w+", np.float16, (max(1, int(offsets[-1])),)
            )
            for kind in KINDS
        }
        bar = progress_bar(cameras.items(), desc="temporal weights", unit="camera", disable=not progress)
        for camera, rows in bar:  # one camera's frames and weights held at a time
            frames = (np.ascontiguousarray(store.read_image(table.names[r])[..., :3]) for r in rows)
            try:
                weights = temporal_weights(frames, config)
            except SourceError as exc:
                raise SourceError(f"{store.url}: camera {camera}: {exc}") from None
            for kind in KINDS:
                values = getattr(weights, kind)
                for t, row in enumerate(rows.tolist()):
                    spilled[kind][offsets[row] : offsets[row + 1]] = values[t].reshape(-1)
            del weights
        for kind in KINDS:
            spilled[kind].flush()
        row_of = {name: i for i, name in enumerate(table.names)}

        def load(kind: str, name: str, height: int, width: int) -> np.ndarray:
            row = row_of[name]
            return np.asarray(spilled[kind][offsets[row] : offsets[row + 1]]).reshape(
                height // factor, width // factor
            )

        source = {"from": "the store's images", **asdict(config)}
        infos = [ComponentInfo(kind, "float16", source=source, factor=factor) for kind in KINDS]
        done = add_components(store.url, infos, load, progress=progress)
        spilled.clear()  # the memory maps closed before their folder goes
    return done
