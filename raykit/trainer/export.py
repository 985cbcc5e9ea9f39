"""Self-contained model exports: ``raykit export RUN OUT`` writes one, :func:`load_export` reads it back.

An export is a directory that renders without the run directory (and, with cameras from a
``transforms.json``, without the store); :mod:`raykit.trainer.exported` reads it back::

    OUT/model.safetensors   every tensor of the checkpoint's model and sampler state, key "GROUP/NAME"
                            (e.g. "field/planes.0", "grid/density"); all groups except optimiser state
    OUT/config.json         the run's TrainConfig (builds the models, chooses the sampler and scene mapping)
    OUT/export.json         the manifest, written last

The manifest holds the format and its version, the raykit version, the checkpoint step, the store's
fingerprint, the scene (box, ``world_from_source`` of the store, the store's near/far range for new
cameras), the run record (``run.json``), the run's eval figures for that step (``eval.json``), the
layout of the state (non-tensor values, empty groups) and the size and SHA-256 of every other file.

The state is exported generically: whatever groups the checkpoint holds besides optimiser state
(groups named ``optimizer`` or ``scaler``, or ending in ``_optimizer`` / ``_scaler``) are written
tensor by tensor, nested dicts flattened with ``/``. A new sampler's or scene mapping's state therefore
exports without changes here; :func:`raykit.trainer.evaluate.models_from_state` builds the models from it.

Writes are atomic (a hidden temporary directory beside OUT, every file fsynced, manifest last, one
folder swap: ``raykit.fileio.atomic_path``). Every file's record is ``{"size", "sha256"}``; reading
checks each file's size and checksum first (older exports' ``{"bytes", "sha256"}`` too); a mismatch
raises :class:`ExportError` naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

import raykit
from raykit.errors import ExportError, RaykitError
from raykit.fileio import atomic_path, bytes_record, json_bytes
from raykit.safe_io import UntrustedFileError, read_json, safe_path
from raykit.trainer.checkpoint import CheckpointMeta, latest_checkpoint, load_checkpoint
from raykit.trainer.config import TrainConfig

__all__ = [
    "CONFIG_FILE",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "MANIFEST_FILE",
    "MODEL_FILE",
    "export_run",
    "flatten_state",
    "read_export_json",
    "unflatten_state",
]

EXPORT_FORMAT = "raykit-model"
EXPORT_VERSION = 1
MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MANIFEST_FILE = "export.json"
_TRAINING_ONLY = ("optimizer", "scaler")


def _training_only(group: str) -> bool:
    return any(group == name or group.endswith("_" + name) for name in _TRAINING_ONLY)


def flatten_state(
    state: Mapping[str, Any], prefix: str = ""
) -> tuple[dict[str, torch.Tensor], dict[str, Any], list[str]]:
    """Nested dicts of tensors -> ``(tensors, values, empty)`` keyed by ``/``-joined paths.

    ``tensors`` holds contiguous CPU copies, ``values`` the JSON-able non-tensor leaves and ``empty``
    the paths of empty dicts, so :func:`unflatten_state` restores the same structure.

    Raises:
        ExportError: a key containing ``/`` or a leaf that is neither a tensor nor JSON-able.
    """
    tensors: dict[str, torch.Tensor] = {}
    values: dict[str, Any] = {}
    empty: list[str] = []
    for key, value in state.items():
        if not isinstance(key, str) or "/" in key:
            raise ExportError(f"state key {prefix}{key!r}: expected a string without '/'")
        path = prefix + key
        if isinstance(value, Mapping):
            if not value:
                empty.append(path)
                continue
            sub = flatten_state(value, path + "/")
            tensors.update(sub[0])
            values.update(sub[1])
            empty += sub[2]
        elif isinstance(value, torch.Tensor):
            tensors[path] = value.detach().to("cpu", copy=True).contiguous()
        else:
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ExportError(f"state entry {path}: not a tensor and not JSON-able ({exc})") from exc
            values[path] = value
    return tensors, values, empty


def unflatten_state(
    tensors: Mapping[str, torch.Tensor], values: Mapping[str, Any], empty: list[str]
) -> dict[str, Any]:
    """Inverse of :func:`flatten_state`."""
    root: dict[str, Any] = {}
    leaves: list[tuple[str, Any]] = [*tensors.items(), *values.items(), *((p, {}) for p in empty)]
    for path, value in leaves:
        *parents, last = path.split("/")
        node = root
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return root


def read_export_json(path: Path) -> Any:
    """A JSON record of a run or an export: a regular file inside its folder, bounded
    (``fileio.safe_path``, ``fileio.read_json``)."""
    try:
        return read_json(safe_path(path.parent, path.name))
    except UntrustedFileError as exc:
        raise ExportError(str(exc)) from None
    except OSError as exc:
        raise ExportError(f"{path}: unreadable: {exc}") from None


def _pick_checkpoint(run_dir: Path) -> tuple[Path, dict[str, Any] | None]:
    """The checkpoint the run's eval.json refers to (else the newest) and that eval, if it matches."""
    evaluation = read_export_json(run_dir / "eval.json") if (run_dir / "eval.json").is_file() else None
    if evaluation is not None and not isinstance(evaluation, dict):
        raise ExportError(f"{run_dir / 'eval.json'}: expected a JSON object")
    named = None
    if evaluation and evaluation.get("checkpoint"):
        try:  # a name recorded in a file: it must stay inside the run folder
            named = safe_path(run_dir, evaluation["checkpoint"], where=str(run_dir / "eval.json"))
        except UntrustedFileError as exc:
            raise ExportError(str(exc)) from None
    checkpoint = (
        named if named is not None and (named / "meta.json").is_file() else latest_checkpoint(run_dir)
    )
    if checkpoint is None:
        raise ExportError(f"{run_dir}: no checkpoint to export (expected {run_dir}/checkpoints/step-*)")
    return checkpoint, evaluation


def _store_scene(store_path: str, meta: CheckpointMeta) -> dict[str, Any]:
    """The store's frame and near/far range (for new cameras); the store must be the run's."""
    from raykit.store import open_store

    try:
        store = open_store(store_path)
    except RaykitError as exc:
        raise ExportError(f"{store_path}: cannot open the run's store ({exc}); pass --store PATH") from exc
    if store.fingerprint != meta.store_fingerprint:
        raise ExportError(
            f"{store_path}: store fingerprint {store.fingerprint} differs from the run's "
            f"{meta.store_fingerprint}; pass the run's store with --store PATH"
        )
    near, far = np.asarray(store.table.near), np.asarray(store.table.far)
    near, far = near[np.isfinite(near)], far[np.isfinite(far)]
    return {
        "world_from_source": np.asarray(store.world_from_source, dtype=np.float64).tolist(),
        "near": float(near.min()) if near.size else None,
        "far": float(far.max()) if far.size else None,
    }


def _field_kind(config: TrainConfig, groups: dict[str, Any]) -> dict[str, Any]:
    """The field's kind and, for a time-conditioned field, the time range its views span (renders at
    other times read the edge of the time planes)."""
    time_range = groups.get("field", {}).get("time_range")
    return {"field": config.field, "time_range": None if time_range is None else time_range.tolist()}


def _write_file(directory: Path, name: str, data: bytes) -> dict[str, Any]:
    (directory / name).write_bytes(data)  # fsynced by atomic_path before the folder appears
    return bytes_record(data)


def export_run(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    store: str | None = None,
    force: bool = False,
) -> Path:
    """Export a run's evaluated (else newest) checkpoint to ``out``; returns ``out``.

    Args:
        run_dir: a directory written by ``raykit train``.
        out: the export directory to create.
        store: the run's store when it moved (default: the path recorded in the run's config).
        force: replace an existing ``out`` (an earlier export, or an empty directory).

    Raises:
        ExportError: no checkpoint, unreadable run files, a store that is not the run's, or ``out``
            exists (without ``force``).
    """
    from safetensors.torch import save

    run_dir, out = Path(run_dir), Path(out)
    if out.exists() and not force:
        raise ExportError(f"{out}: already exists; pass --force to replace it")
    if out.exists() and not (out.is_dir() and ((out / MANIFEST_FILE).is_file() or not any(out.iterdir()))):
        raise ExportError(f"{out}: exists and is not a raykit model export; refusing to replace it")
    checkpoint, evaluation = _pick_checkpoint(run_dir)
    try:
        meta, tensors = load_checkpoint(checkpoint)
    except RaykitError as exc:
        raise ExportError(str(exc)) from exc
    config = TrainConfig.from_dict(meta.config)
    groups = {k: v for k, v in tensors.items() if not _training_only(k)}
    flat, values, empty = flatten_state(groups)
    run_record = read_export_json(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
    scene = _store_scene(store or config.store, meta)
    aabb = run_record.get("aabb")
    if aabb is None and "aabb" in groups.get("field", {}):
        aabb = groups["field"]["aabb"].tolist()
    matches = evaluation is not None and evaluation.get("step") == meta.step
    manifest: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "raykit_version": raykit.__version__,
        "step": meta.step,
        "checkpoint": checkpoint.name,
        "store_fingerprint": meta.store_fingerprint,
        "scene": {"aabb": aabb, **scene, **_field_kind(config, groups)},
        "run": run_record,
        "eval": evaluation["splits"] if matches and evaluation else None,
        "eval_protocol": evaluation.get("protocol") if matches and evaluation else None,
        "state": {"groups": sorted(groups), "values": values, "empty": empty, "n_tensors": len(flat)},
    }
    with atomic_path(out, directory=True) as tmp:  # every file fsynced, then one folder swap
        model = canonical_safetensors(save(flat, metadata={"format": "pt", "raykit_export": EXPORT_FORMAT}))
        manifest["files"] = {
            MODEL_FILE: _write_file(tmp, MODEL_FILE, model),
            CONFIG_FILE: _write_file(tmp, CONFIG_FILE, json_bytes(config.to_dict())),
        }
        _write_file(tmp, MANIFEST_FILE, json_bytes(manifest))
    return out


def canonical_safetensors(data: bytes) -> bytes:
    """``data`` (a safetensors file) with its JSON header's ``__metadata__`` keys sorted: safetensors
    writes that map in hash order, which differs between processes, so two exports of identical runs
    would differ in bytes. The header keeps its length (same keys and values, no whitespace added), so
    the tensors' offsets are unchanged."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    metadata = header.pop("__metadata__", None)
    ordered = ({"__metadata__": dict(sorted(metadata.items()))} if metadata is not None else {}) | header
    text = json.dumps(ordered, separators=(",", ":")).encode()
    if len(text) > n:  # not expected: keep what safetensors wrote
        return data
    return data[:8] + text + b" " * (n - len(text)) + data[8 + n :]
