"""Self-contained model exports: ``raykit export RUN OUT`` writes one, :func:`load_export` reads it back.

An export is a directory that renders without the run directory (and, with cameras from a
``transforms.json``, without the store)::

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
rename). Reading checks every file's size and checksum first; a mismatch raises :class:`ExportError`
naming the file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import raykit
from raykit.errors import ExportError, RaykitError
from raykit.fileio import (
    UntrustedFileError,
    fsync_path,
    loads_json,
    read_bounded,
    read_json,
    safe_path,
    sha256_bytes,
)
from raykit.trainer.checkpoint import CheckpointMeta, check_state, latest_checkpoint, load_checkpoint
from raykit.trainer.config import TrainConfig

__all__ = [
    "CONFIG_FILE",
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "MANIFEST_FILE",
    "MODEL_FILE",
    "ExportedModel",
    "export_run",
    "flatten_state",
    "load_export",
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


def _read_json(path: Path) -> Any:
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
    evaluation = _read_json(run_dir / "eval.json") if (run_dir / "eval.json").is_file() else None
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


def _write_file(directory: Path, name: str, data: bytes) -> dict[str, Any]:
    path = directory / name
    path.write_bytes(data)
    fsync_path(path)
    return {"bytes": len(data), "sha256": sha256_bytes(data)}


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


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
    run_record = _read_json(run_dir / "run.json") if (run_dir / "run.json").is_file() else {}
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
        "scene": {"aabb": aabb, **scene},
        "run": run_record,
        "eval": evaluation["splits"] if matches and evaluation else None,
        "eval_protocol": evaluation.get("protocol") if matches and evaluation else None,
        "state": {"groups": sorted(groups), "values": values, "empty": empty, "n_tensors": len(flat)},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would make the export private to its writer
        model = canonical_safetensors(save(flat, metadata={"format": "pt", "raykit_export": EXPORT_FORMAT}))
        manifest["files"] = {
            MODEL_FILE: _write_file(tmp, MODEL_FILE, model),
            CONFIG_FILE: _write_file(tmp, CONFIG_FILE, _json_bytes(config.to_dict())),
        }
        _write_file(tmp, MANIFEST_FILE, _json_bytes(manifest))
        fsync_path(tmp)
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` is moved aside first and removed after."""
    old = None
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old.{os.getpid()}")
        os.rename(dst, old)
    os.rename(src, dst)
    fsync_path(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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


def _checked_bytes(path: Path, entry: Mapping[str, Any]) -> bytes:
    """File ``path`` of an export, read only as a regular file of the recorded size, then checked."""
    size = entry.get("bytes")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ExportError(
            f"{path.parent / MANIFEST_FILE}: files.{path.name}.bytes: expected a size, got {size!r}"
        )
    try:
        data = read_bounded(path, size=size)
    except UntrustedFileError as exc:
        raise ExportError(f"{exc}; export the run again") from None
    except OSError as exc:
        raise ExportError(f"{path}: missing or unreadable export file ({exc})") from None
    if len(data) != entry.get("bytes") or sha256_bytes(data) != entry.get("sha256"):
        raise ExportError(
            f"{path}: corrupt export file: expected {entry.get('bytes')} bytes with sha256 "
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
    manifest = _read_json(manifest_path)
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
        raise ExportError(f"{manifest_path}: expected a 'files' object of {{name: {{bytes, sha256}}}}")
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
