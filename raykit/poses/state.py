"""The output folder of pose estimation, its record ``poses.json`` (what ran, on what, how long) and
the summary of the result (:class:`PoseSummary`).

Each stage is recorded with a key (its inputs and options) when it starts and marked done when it
finishes; ``poses.json`` is rewritten atomically after each change. A stage whose recorded key equals
the current one and that is done is skipped. Starting a stage discards the records and outputs of
every later stage (they depend on it). The model and the undistorted capture are built in hidden
scratch folders and renamed into place, so ``OUT/sparse/0`` is either complete or absent.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError, ResumeError
from raykit.fileio import atomic_write_json, replace_dir, sha256_bytes
from raykit.poses import sfm

__all__ = ["MAX_LISTED", "STAGES", "STATE_FILE", "PoseState", "PoseSummary", "listing", "pose_cache"]

STATE_FILE = "poses.json"
STATE_VERSION = 1
STAGES = ("frames", "features", "matching", "mapping", "undistort")
_RESTART_NEEDED = ("frames", "features")  # their work is expensive: never discarded without restart=True
_OUTPUTS = {
    "frames": ("images",),
    "features": ("database.db",),
    "matching": (),
    "mapping": ("sparse", ".mapping"),
    "undistort": ("undistorted", ".undistorted.partial"),
}
MAX_LISTED = 30  # names listed in one message at most


def pose_cache(dst: Path) -> Path:
    """The pose cache folder of ``convert --from photos|video`` for the store ``dst``: ``<dst>.poses``."""
    return dst.with_name(dst.name + ".poses")


def _key_hash(key: Any) -> str:
    return sha256_bytes(json.dumps(key, sort_keys=True).encode())[:16]


def _changes(old: Any, new: Any) -> str:
    """Which recorded fields differ, e.g. ``max_features 8192 -> 1000, photo files``."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return "inputs differ"
    parts = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            simple = all(isinstance(v, str | int | float | bool) for v in (old.get(name), new.get(name)))
            label = "photo files (names, sizes or times)" if name == "files" else name
            parts.append(f"{label} {old.get(name)} -> {new.get(name)}" if simple else label)
    return ", ".join(parts) or "inputs differ"


@dataclass(frozen=True)
class PoseSummary:
    """What a pose estimation produced (also stored in ``OUT/poses.json``).

    Attributes:
        out: the output folder. given: number of photos. registered / unregistered: photo names.
        cameras, points: counts in the model. reprojection_error: mean, in pixels.
        matcher: the matcher used. single_camera: whether one camera was shared.
        seconds: wall time of each stage run now. skipped: stages finished by an earlier run.
        undistorted: ``out/undistorted`` holds the undistorted capture.
    """

    out: str
    given: int
    registered: tuple[str, ...]
    unregistered: tuple[str, ...]
    cameras: int
    points: int
    reprojection_error: float
    matcher: str
    single_camera: bool
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    undistorted: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoseSummary:
        """Inverse of :meth:`to_dict`."""
        data = dict(data)
        for key in ("registered", "unregistered", "skipped"):
            data[key] = tuple(data.get(key, ()))
        return cls(**data)

    def lines(self) -> list[str]:
        """Human-readable summary lines."""
        times = [f"{name} {s:.1f} s" for name, s in self.seconds.items()]
        times += [f"{name} skipped (done earlier)" for name in self.skipped]
        lines = [
            f"registered {len(self.registered)} of {self.given} photos; {self.cameras} camera(s), "
            f"{self.points} points, mean reprojection error {self.reprojection_error:.3f} px",
            f"matcher {self.matcher}, "
            + ("one shared camera" if self.single_camera else "one camera per photo"),
            "time: " + ", ".join(times),
            f"model: {Path(self.out) / 'sparse' / '0'} (photos: {Path(self.out) / 'images'})",
        ]
        if self.undistorted:
            lines.append(f"undistorted (PINHOLE): {Path(self.out) / 'undistorted'}")
        if self.unregistered:
            lines.append("not registered (left out): " + listing(self.unregistered))
        return lines


def listing(names: Any) -> str:
    """``a, b, c and N more``: at most MAX_LISTED names."""
    names = list(names)
    more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return ", ".join(names[:MAX_LISTED]) + more


class PoseState:
    """The record of one output folder; see the module docstring."""

    def __init__(self, out: Path, data: dict[str, Any], restart: bool, progress: bool = False) -> None:
        self.out, self.data, self.restart, self.progress = out, data, restart, progress
        self.seconds: dict[str, float] = {}

    @classmethod
    def open(cls, out: Path, kind: str, src: Path, restart: bool, progress: bool = False) -> PoseState:
        """Open (or create) the record of ``out`` for input ``src`` of ``kind`` (``photos``/``video``).

        Raises:
            ConfigError: ``out`` is a file, or a non-empty folder without ``poses.json``.
            ResumeError: ``out`` holds work on another input and ``restart`` is False; unreadable record.
        """
        source = {"kind": kind, "path": str(src.resolve())}
        path = out / STATE_FILE
        if out.exists() and not out.is_dir():
            raise ConfigError(f"{out}: exists and is not a folder")
        if not path.is_file():
            if out.is_dir() and any(out.iterdir()):
                raise ConfigError(
                    f"{out}: folder exists and was not made by raykit poses (no {STATE_FILE}); choose a new "
                    "or empty folder"
                )
            out.mkdir(parents=True, exist_ok=True)
            record = {"version": STATE_VERSION, "source": source, "images": None, "stages": {}}
            state = cls(out, record, restart, progress)
            state.save()
            return state
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") != STATE_VERSION or not isinstance(data.get("stages"), dict):
                raise ValueError(f"expected version {STATE_VERSION} with stages")
        except (OSError, ValueError) as exc:
            raise ResumeError(
                f"{path}: cannot read the pose record ({exc}); delete {out} to start over"
            ) from None
        state = cls(out, data, restart, progress)
        if data.get("source") != source:
            state._stale(STAGES[0], f"was made from {data.get('source', {}).get('path')}, not {src}")
            data["source"] = source
            state.save()
        return state

    def save(self) -> None:
        atomic_write_json(self.out / STATE_FILE, self.data)

    def _remove(self, stage: str) -> None:
        for name in _OUTPUTS[stage]:
            path = self.out / name
            if name == "images" and self.data.get("images") not in ("frames", "copy", "link"):
                continue  # never the user's own photo folder
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
        if stage == "frames":
            self.data["images"] = None

    def _stale(self, stage: str, why: str) -> None:
        """Discard ``stage`` and everything after it (needs ``restart`` for the expensive stages)."""
        later = STAGES[STAGES.index(stage) :]
        if not self.restart and any(s in self.data["stages"] for s in later if s in _RESTART_NEEDED):
            raise ResumeError(
                f"{self.out}: {why}; pass --overwrite (restart=True) to discard it and start over"
            )
        for name in later:
            self.data["stages"].pop(name, None)
            self._remove(name)
        if stage == STAGES[0]:
            self._remove("frames")

    def begin(self, stage: str, key: Any, force: bool = False) -> bool:
        """True when ``stage`` must run (then later stages are discarded); False when done with ``key``."""
        record = self.data["stages"].get(stage)
        if record is not None and record["key"] == key and record["done"] and not force:
            return False
        if record is not None and record["key"] != key:
            self._stale(stage, f"holds {stage} of other photos or options ({_changes(record['key'], key)})")
        for name in STAGES[STAGES.index(stage) + 1 :]:
            self.data["stages"].pop(name, None)
            self._remove(name)
        if stage in ("mapping", "undistort"):
            self._remove(stage)
        self.data["stages"][stage] = {"key": key, "done": False}
        self.save()
        return True

    def finish(self, stage: str, seconds: float, summary: dict[str, Any] | None = None) -> None:
        record = self.data["stages"][stage]
        record["done"], record["seconds"] = True, seconds
        self.seconds[stage] = seconds
        if summary is not None:
            self.data["summary"] = summary
        self.save()

    def key(self, stage: str) -> str:
        """A short hash of ``stage``'s recorded key (chains a stage to the ones it depends on)."""
        return _key_hash(self.data["stages"][stage]["key"])

    def summary(self) -> PoseSummary:
        """The recorded summary with this run's stage times and the stages skipped as done earlier."""
        stages = self.data["stages"]
        skipped = [s for s in STAGES if stages.get(s, {}).get("done") and s not in self.seconds]
        undistorted = bool(stages.get("undistort", {}).get("done"))
        summary = {**self.data["summary"], "seconds": dict(self.seconds), "skipped": skipped}
        return PoseSummary.from_dict({**summary, "undistorted": undistorted})

    def make_frames_folder(self) -> None:
        """An empty ``OUT/images`` for frames cut from a video."""
        self._remove("frames")
        images = self.out / "images"
        if images.exists() or images.is_symlink():
            raise ConfigError(
                f"{images}: exists and holds photos raykit did not put there; choose another OUT"
            )
        images.mkdir()
        self.data["images"] = "frames"
        self.save()

    def link_images(self, photos: Path) -> None:
        """Make ``OUT/images`` refer to ``photos``: a symbolic link, else (unsupported) a copy."""
        images = self.out / "images"
        target = photos.resolve()
        if images.exists() and images.resolve() == target:
            if self.data.get("images") is None:
                self.data["images"] = "link" if images.is_symlink() else "source"
                self.save()
            return
        if self.data.get("images") == "copy" and images.is_dir():
            return  # copied from this source before (a changed source was discarded on open)
        self._remove("frames")
        if images.exists() or images.is_symlink():
            raise ConfigError(
                f"{images}: exists and holds photos raykit did not put there; choose another OUT"
            )
        try:
            os.symlink(target, images, target_is_directory=True)
            self.data["images"] = "link"
        except OSError:
            shutil.copytree(target, images, symlinks=False)
            self.data["images"] = "copy"
        self.save()

    def write_model(self, model: Any) -> None:
        """Write a pycolmap reconstruction to ``OUT/sparse/0`` (binary) via a scratch folder."""
        final = self.out / "sparse" / "0"
        scratch = self.out / "sparse" / ".0.partial"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        model.write(scratch)
        replace_dir(scratch, final)

    def write_undistorted(self, photos: Path, threads: int, progress: bool) -> None:
        """Undistorted images and PINHOLE model into ``OUT/undistorted`` via a scratch folder."""
        scratch = self.out / ".undistorted.partial"
        shutil.rmtree(scratch, ignore_errors=True)
        sfm.undistort(self.out / "sparse" / "0", photos, scratch, threads=threads, progress=progress)
        replace_dir(scratch, self.out / "undistorted")
