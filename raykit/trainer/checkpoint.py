"""Atomic checkpoints: weights (``state.pt``) plus JSON metadata (``meta.json``) in one directory.

Layout: ``RUN_DIR/checkpoints/step-00001234/{state.pt, meta.json}``. A checkpoint is written into a
hidden temporary directory beside it, every file fsynced, then renamed into place in one step, so a
crash at any moment leaves either the whole checkpoint or none of it (never a half-written one under
a real name). The newest complete checkpoint is the one with the highest step; older ones beyond
``keep`` are removed after the new one is in place.

The metadata holds everything besides tensors needed to continue exactly: config, step, loader
state, random generator states (base64), store fingerprint, raykit version and loop counters, and, as
an export's manifest does, the size and SHA-256 of ``state.pt`` (``files``) and the SHA-256 of its own
content (``meta_sha256``). Loading checks both before ``torch.load`` (``weights_only``) sees a byte,
reads ``state.pt`` only as a regular file of the recorded size inside the checkpoint, and checks what
it holds (a dict of state dicts of finite tensors): a flipped bit in the weights or the optimiser
state, a truncated, emptied or replaced file, each gives one :class:`ResumeError` line naming the file.
Checkpoints written before the record existed (no ``files``) still load, unverified.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from raykit.errors import ResumeError
from raykit.fileio import atomic_path, bytes_record, json_bytes, record_size, sha256_bytes
from raykit.safe_io import read_bounded, read_json, safe_path

__all__ = [
    "RESUMABLE_CHANGES",
    "CheckpointMeta",
    "check_resumable",
    "check_state",
    "decode_rng_state",
    "encode_rng_state",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
]

_PREFIX = "step-"
STATE_FILE, META_FILE = "state.pt", "meta.json"
_UNRECORDED_LIMIT = 16 << 30  # bytes of a state.pt written before checkpoints had a record


@dataclass(frozen=True)
class CheckpointMeta:
    """JSON half of a checkpoint."""

    step: int
    config: dict[str, Any]
    loader_state: dict[str, Any]
    rng_states: dict[str, str]
    store_fingerprint: str
    raykit_version: str
    extra: dict[str, Any] = field(default_factory=dict)
    # the record of state.pt, {"state.pt": {"size", "sha256"}} (older checkpoints: {"bytes", "sha256"}):
    # set by save_checkpoint, not compared
    files: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (``files`` once set)."""
        data = asdict(self)
        if not self.files:
            del data["files"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointMeta:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        types = {"step": int, "config": dict, "loader_state": dict, "rng_states": dict,
                 "store_fingerprint": str, "raykit_version": str, "extra": dict, "files": dict}  # fmt: skip
        unknown = sorted(set(data) - set(types))
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}")
        for key, kind in types.items():
            if key not in data and key not in ("extra", "files"):
                raise ValueError(f"field {key!r} missing")
            if key in data and (not isinstance(data[key], kind) or isinstance(data[key], bool)):
                raise ValueError(f"field {key!r}: expected {kind.__name__}, got {data[key]!r}"[:200])
        if data["step"] < 0:
            raise ValueError(f"field 'step': expected >= 0, got {data['step']}")
        return cls(**data)


def encode_rng_state(generator: torch.Generator) -> str:
    """A generator's state as base64 text (fits in JSON)."""
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")


def decode_rng_state(text: str) -> torch.Tensor:
    """Inverse of :func:`encode_rng_state`: a uint8 tensor for ``Generator.set_state``."""
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.name.startswith(_PREFIX)
        and p.name[len(_PREFIX) :].isdigit()
        and not p.is_symlink()  # a checkpoint lies inside its run folder
        and (p / META_FILE).is_file()
    ]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint directory, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(
    run_dir: str | os.PathLike[str], meta: CheckpointMeta, tensors: dict[str, Any], keep: int = 2
) -> Path:
    """Write a checkpoint atomically and prune all but the ``keep`` newest; returns its directory."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{meta.step:08d}"
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    state = buffer.getbuffer()
    files = {STATE_FILE: bytes_record(state)}
    record = CheckpointMeta(**{**meta.__dict__, "files": files}).to_dict()
    with atomic_path(final, directory=True) as tmp:  # every file fsynced, then one rename
        (tmp / STATE_FILE).write_bytes(state)
        (tmp / META_FILE).write_bytes(json_bytes({**record, "meta_sha256": sha256_bytes(json_bytes(record))}))
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[CheckpointMeta, dict[str, Any]]:
    """Read a checkpoint directory, checked (see the module): (metadata, tensors)."""
    path = Path(path)
    meta_path, state_path = path / META_FILE, path / STATE_FILE
    try:
        data = read_json(safe_path(path, META_FILE))
        if isinstance(data, dict) and "meta_sha256" in data:
            recorded = data.pop("meta_sha256")
            if recorded != sha256_bytes(json_bytes(data)):
                raise ValueError("meta_sha256 does not match its content (damaged or edited)")
        meta = CheckpointMeta.from_dict(data)
    except (OSError, ValueError) as exc:
        raise ResumeError(_line(exc, meta_path, "unreadable checkpoint metadata")) from None
    entry = meta.files.get(STATE_FILE)
    try:
        if entry is not None:  # the record: size checked before reading, SHA-256 before unpickling
            size = record_size(entry) if isinstance(entry, dict) else None
            if size is None:
                raise ValueError(f"{meta_path}: expected files.{STATE_FILE} = {{size, sha256}}")
            raw = read_bounded(safe_path(path, STATE_FILE), size=size)
            if sha256_bytes(raw) != entry.get("sha256"):
                raise ValueError(
                    f"{state_path}: checksum mismatch (expected sha256 {str(entry.get('sha256'))[:12]}..., "
                    f"got {sha256_bytes(raw)[:12]}...): the checkpoint is damaged"
                )
        else:  # written before checkpoints had a record: a regular file, bounded
            raw = read_bounded(safe_path(path, STATE_FILE), limit=_UNRECORDED_LIMIT)
        tensors = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except (OSError, ValueError, TypeError, RuntimeError, EOFError, AttributeError) as exc:
        raise ResumeError(_line(exc, state_path, "unreadable checkpoint")) from None
    check_state(tensors, str(state_path), error=ResumeError)
    return meta, tensors


def _line(exc: BaseException, path: Path, problem: str) -> str:
    """One line naming ``path``: ``exc``'s message if it names a file already, else ``problem: exc``."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    line = text if text.startswith(str(path.parent)) else f"{path}: {problem}: {text}"
    return line[:400]


def check_state(tensors: Any, where: str, *, error: type[Exception] = ResumeError) -> None:
    """Raise ``error`` (one line naming ``where``) unless ``tensors`` is a dict (of groups, nested dicts
    allowed) whose tensors are all finite: what a checkpoint's or an export's state holds. Whether the
    groups fit the models is checked where they are loaded into them."""
    if not isinstance(tensors, dict):
        raise error(f"{where}: expected a dict of state groups, got {type(tensors).__name__}")
    stack: list[tuple[str, Any]] = list(tensors.items())
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{key}/{k}", v) for k, v in value.items()]
        elif isinstance(value, list | tuple):
            stack += [(f"{key}/{i}", v) for i, v in enumerate(value)]
        elif (
            isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and not bool(torch.isfinite(value).all())
        ):
            raise error(f"{where}: {key} holds NaN or infinite values; not loaded")


# Config fields that may differ between a checkpoint and the run resuming it: they change where the
# run writes, how often it reports, or how fast it runs, never the numbers it computes.
RESUMABLE_CHANGES = frozenset(
    {
        "store",
        "out",
        "resume",
        "force",
        "max_seconds",
        "log_every",
        "logger",
        "log_image_every_s",
        "ckpt_every",
        "keep_checkpoints",
        "eval_splits",
        "eval_chunk",
        "eval_max_images",
        "num_workers",
        "device",
        "threads",
        "progress",
    }
)


def check_resumable(
    meta: CheckpointMeta, store_fingerprint: str, config: dict[str, Any], force: bool, where: str
) -> None:
    """Refuse to resume against a different store or with different numerics unless ``force``.

    Raises:
        ResumeError: naming the checkpoint and every mismatch ("checkpoint has X, got Y").
    """
    problems = []
    if meta.store_fingerprint != store_fingerprint:
        problems.append(
            f"store fingerprint: checkpoint has {meta.store_fingerprint}, got {store_fingerprint}"
        )
    for key in sorted(set(meta.config) | set(config)):
        if key not in RESUMABLE_CHANGES and meta.config.get(key) != config.get(key):
            problems.append(f"config {key}: checkpoint has {meta.config.get(key)!r}, got {config.get(key)!r}")
    if problems and not force:
        raise ResumeError(
            f"{where}: cannot resume exactly: " + "; ".join(problems) + "; pass --force to resume anyway"
        )
