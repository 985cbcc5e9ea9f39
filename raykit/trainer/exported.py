"""An export read back: :func:`load_export` checks every file against the manifest (sizes, checksums,
and every field its readers use) before anything is used; a mismatch raises :class:`ExportError`
naming the file (the format: :mod:`raykit.trainer.export`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raykit.errors import ExportError
from raykit.fileio import record_size, sha256_bytes
from raykit.safe_io import UntrustedFileError, loads_json, read_bounded, safe_path
from raykit.trainer.checkpoint import check_state
from raykit.trainer.config import TrainConfig
from raykit.trainer.export import (
    CONFIG_FILE,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    MANIFEST_FILE,
    MODEL_FILE,
    read_export_json,
    unflatten_state,
)

__all__ = ["ExportedModel", "load_export"]


@dataclass(frozen=True)
class ExportedModel:
    """An export read back and checked: its manifest, training config and model/sampler state."""

    path: Path
    manifest: dict[str, Any]
    config: TrainConfig
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def store_fingerprint(self) -> str:
        return str(self.manifest["store_fingerprint"])

    @property
    def world_from_source(self) -> np.ndarray:
        """(4, 4) float64: the store's frame, in which the model lives, from the capture's frame."""
        return np.asarray(self.manifest["scene"]["world_from_source"], dtype=np.float64)

    @property
    def eval(self) -> dict[str, Any] | None:
        """The run's eval figures for the exported step (``eval.json``'s ``splits``), if recorded."""
        return self.manifest.get("eval")

    @property
    def eval_protocol(self) -> dict[str, Any] | None:
        """The ``protocol`` block of those figures; None for figures (or exports) from before the
        community protocol, whose ``psnr`` is the float figure."""
        return self.manifest.get("eval_protocol")


def _checked_bytes(path: Path, entry: Mapping[str, Any]) -> bytes:
    """File ``path`` of an export, read only as a regular file of the recorded size, then checked."""
    size = record_size(entry)  # {"size", "sha256"}, or the {"bytes", "sha256"} of older exports
    if size is None:
        raise ExportError(
            f"{path.parent / MANIFEST_FILE}: files.{path.name}: expected a size, got {dict(entry)!r}"[:300]
        )
    try:
        data = read_bounded(path, size=size)
    except UntrustedFileError as exc:
        raise ExportError(f"{exc}; export the run again") from None
    except OSError as exc:
        raise ExportError(f"{path}: missing or unreadable export file ({exc})") from None
    if len(data) != size or sha256_bytes(data) != entry.get("sha256"):
        raise ExportError(
            f"{path}: corrupt export file: expected {size} bytes with sha256 "
            f"{entry.get('sha256')}, got {len(data)} bytes with sha256 {sha256_bytes(data)}; "
            "export the run again"
        )
    return data


def load_export(path: str | os.PathLike[str]) -> ExportedModel:
    """Read an export, checking every file against the manifest's sizes and checksums.

    Raises:
        ExportError: not an export, a newer format version, or a missing, truncated or modified file.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load

    root = Path(path)
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file():
        raise ExportError(f"{root}: not a raykit model export (no {MANIFEST_FILE})")
    manifest = read_export_json(manifest_path)
    if not isinstance(manifest, dict) or manifest.get("format") != EXPORT_FORMAT:
        raise ExportError(f"{manifest_path}: not a raykit model export manifest")
    version = manifest.get("version")
    if not isinstance(version, int) or version > EXPORT_VERSION:
        raise ExportError(
            f"{manifest_path}: export format version {version!r} is newer than this raykit reads "
            f"({EXPORT_VERSION}); upgrade raykit"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(entry, dict) for entry in files.values()):
        raise ExportError(f"{manifest_path}: expected a 'files' object of {{name: {{size, sha256}}}}")
    missing = [name for name in (MODEL_FILE, CONFIG_FILE) if name not in files]
    if missing:
        raise ExportError(f"{manifest_path}: manifest lists no {', '.join(missing)}")
    paths = {}
    for name in files:
        try:
            paths[name] = safe_path(root, name, where=str(manifest_path))
        except UntrustedFileError as exc:
            raise ExportError(str(exc)) from None
        if "/" in name or name.startswith("."):
            raise ExportError(f"{manifest_path}: file name {name!r} is not a file of the export")
    _check_manifest(manifest, str(manifest_path))
    data = {name: _checked_bytes(paths[name], entry) for name, entry in files.items()}
    try:
        config = TrainConfig.from_dict(loads_json(data[CONFIG_FILE], str(root / CONFIG_FILE)))
        flat = load(data[MODEL_FILE])
    except (TypeError, ValueError, SafetensorError) as exc:
        text = " ".join(str(exc).split())[:300]
        raise ExportError(
            text if text.startswith(str(root)) else f"{root}: unreadable export contents: {text}"
        ) from None
    layout = manifest["state"]
    if len(flat) != layout["n_tensors"]:
        raise ExportError(
            f"{manifest_path}: state.n_tensors is {layout['n_tensors']}, {MODEL_FILE} holds {len(flat)}"
        )
    state = unflatten_state(flat, layout["values"], layout["empty"])
    check_state(state, str(root / MODEL_FILE), error=ExportError)
    return ExportedModel(path=root, manifest=manifest, config=config, state=state)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value)


def _check_manifest(manifest: Mapping[str, Any], where: str) -> None:
    """Raise ``ExportError`` (one line naming ``where`` and the field) unless every field the export's
    readers use has its type and range: an edited ``export.json`` is refused before it is used."""

    def need(ok: bool, field: str, expected: str) -> None:
        if not ok:
            value = manifest
            for part in field.split("."):
                value = value.get(part) if isinstance(value, Mapping) else None  # type: ignore[assignment]
            raise ExportError(f"{where}: {field}: expected {expected}, got {value!r}"[:300])

    step = manifest.get("step")
    need(isinstance(step, int) and not isinstance(step, bool) and step >= 0, "step", "an integer >= 0")
    fingerprint = manifest.get("store_fingerprint")
    need(isinstance(fingerprint, str) and len(fingerprint) == 64, "store_fingerprint", "64 hex digits")
    scene: Any = manifest.get("scene")
    need(isinstance(scene, Mapping), "scene", "an object")
    world = scene.get("world_from_source")
    matrix = np.asarray(world, dtype=object) if isinstance(world, list) else None
    need(
        matrix is not None and matrix.shape == (4, 4) and all(_number(v) for v in matrix.ravel()),
        "scene.world_from_source",
        "a finite 4x4 matrix",
    )
    need(
        abs(float(np.linalg.det(np.asarray(world, dtype=np.float64)[:3, :3]))) > 1e-12,
        "scene.world_from_source",
        "an invertible transform",
    )
    for key in ("near", "far"):
        need(
            scene.get(key) is None or (_number(scene[key]) and scene[key] >= 0),
            f"scene.{key}",
            "a number >= 0 or null",
        )
    if scene.get("near") is not None and scene.get("far") is not None:
        need(scene["near"] < scene["far"], "scene.far", "more than scene.near")
    aabb = scene.get("aabb")
    need(
        aabb is None or (isinstance(aabb, list) and len(aabb) == 6 and all(_number(v) for v in aabb)),
        "scene.aabb",
        "6 finite numbers or null",
    )
    need(isinstance(manifest.get("run", {}), Mapping), "run", "an object")
    evaluation: Any = manifest.get("eval")
    need(evaluation is None or isinstance(evaluation, Mapping), "eval", "an object or null")
    for split, figures in (evaluation or {}).items():
        ok = (
            isinstance(figures, Mapping)
            and _number(figures.get("psnr"))
            and isinstance(figures.get("images"), list)
        )
        ok = ok and all(
            isinstance(im, Mapping) and isinstance(im.get("name"), str) for im in figures["images"]
        )
        need(ok, f"eval.{split}", "{psnr: number, images: [{name}, ...]}")
    protocol: Any = manifest.get("eval_protocol")  # absent in exports from before the community protocol
    need(
        protocol is None or (isinstance(protocol, Mapping) and isinstance(protocol.get("name"), str)),
        "eval_protocol",
        "an object with a name, or null",
    )
    state: Any = manifest.get("state")
    need(isinstance(state, Mapping), "state", "an object")
    need(isinstance(state.get("values"), Mapping), "state.values", "an object")
    need(
        isinstance(state.get("empty"), list) and all(isinstance(p, str) for p in state["empty"]),
        "state.empty",
        "a list of names",
    )
    n = state.get("n_tensors")
    need(isinstance(n, int) and not isinstance(n, bool) and n >= 0, "state.n_tensors", "an integer >= 0")
