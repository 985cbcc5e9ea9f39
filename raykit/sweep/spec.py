"""The sweep's SPEC: a TOML file naming captures, training configurations, seeds and the evaluation.

::

    seeds = [0, 1]                 # every run is repeated for each seed
    export = false                 # also export (and verify) each run's model

    [evaluation]                   # the protocol: metric compared, and the trainer's eval_* fields
    metric = "psnr"                # psnr, ssim, lpips (lower is better), ...: a column of eval.json
    splits = "test"                # -> TrainConfig.eval_splits; max_images -> eval_max_images, ...

    [train]                        # TrainConfig fields shared by every configuration
    steps = 2000

    [grid]                         # every combination of these values ...
    sampler = ["occupancy", "proposal"]

    [[configs]]                    # ... crossed with each listed configuration (default: one, empty)
    name = "small"
    hidden = 16

    [[captures]]
    path = "data/plant_capture"    # a capture raykit convert reads, photos, a video or a store;
    downscale = 2                  # relative to the SPEC's folder; other keys: ConvertConfig fields
    [[captures]]
    scene = "small"                # or the built-in procedural scene (tiny, small, realistic)

Everything is checked when the file is read: an unknown field, a value of the wrong type or out of
range, a missing capture, two entries that are the same, each one :class:`ConfigError` line that names
the SPEC and the entry, before anything runs. The runs are counted before any is made: a SPEC of more
than ``MAX_RUNS`` (10,000) runs (captures x configurations x seeds) is refused with its count; seeds
are integers in ``[0, SEED_MAX]`` (2**32 - 1: the trainer seeds its generators with
``seed * 1_000_003 + rank``, which must fit 64 bits). The SPEC itself is read bounded
(``fileio.read_bounded``, at most ``SPEC_LIMIT`` bytes, a regular file).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raykit.converters import ConvertConfig
from raykit.errors import ConfigError, RaykitError
from raykit.fileio import read_toml
from raykit.options import field_types, value_problem
from raykit.pipeline import fingerprint
from raykit.trainer import TrainConfig

__all__ = [
    "IDENTITY_SKIP",
    "MAX_RUNS",
    "SEED_MAX",
    "Capture",
    "Configuration",
    "SweepSpec",
    "config_hash",
    "load_spec",
]

# Fields the sweep sets itself (per run), never the SPEC.
SWEEP_SET = ("store", "out", "seed", "resume", "force", "progress")
# Fields that say where a run executes, not what it computes: left out of the config hash.
IDENTITY_SKIP = ("store", "out", "seed", "threads", "progress", "resume", "force")
# Capture keys that are not conversion options, and conversion options the sweep sets.
CAPTURE_KEYS = ("name", "path", "scene", "scene_seed", "camera_model")
CONVERT_SET = ("src", "dst", "profile", "progress", "overwrite", "threads", "workers", "scheduler")
SCENE_SIZES = ("tiny", "small", "realistic")
SCENE_CAMERAS = ("PINHOLE", "OPENCV")
TOP_KEYS = ("seeds", "export", "evaluation", "train", "grid", "configs", "captures")
LOWER_IS_BETTER = ("lpips", "loss", "mse")
MAX_RUNS = 10_000  # runs of one sweep (captures x configurations x seeds), counted before any is made
SEED_MAX = 2**32 - 1
SPEC_LIMIT = 16 << 20  # bytes of a SPEC file


@dataclass(frozen=True)
class Capture:
    """One capture: a path (a capture, photos, a video or a store) or a built-in scene, and the
    conversion options (``ConvertConfig`` fields) it is converted with."""

    name: str
    path: str = ""
    scene: str = ""
    scene_seed: int = 0
    camera_model: str = "PINHOLE"
    convert: tuple[tuple[str, Any], ...] = ()

    def key(self) -> str:
        """What makes two entries the same capture: source and options."""
        source = (
            {"path": self.path} if self.path else {"scene": [self.scene, self.scene_seed, self.camera_model]}
        )
        return fingerprint({**source, "convert": dict(self.convert)})


@dataclass(frozen=True)
class Configuration:
    """One trainer configuration: its name and every :class:`TrainConfig` field (store, out and seed
    are set per run)."""

    name: str
    train: TrainConfig

    @property
    def hash(self) -> str:
        return config_hash(self.train)


def config_hash(config: TrainConfig) -> str:
    """sha256 of the fields that decide what a run computes (not where it runs: ``IDENTITY_SKIP``)."""
    return fingerprint({k: v for k, v in config.to_dict().items() if k not in IDENTITY_SKIP})


@dataclass(frozen=True)
class SweepSpec:
    """A checked SPEC (see the module)."""

    path: str
    captures: tuple[Capture, ...]
    configs: tuple[Configuration, ...]
    seeds: tuple[int, ...]
    metric: str = "psnr"
    export: bool = False

    @property
    def higher_is_better(self) -> bool:
        return not any(word in self.metric.lower() for word in LOWER_IS_BETTER)


def _fail(spec: Path, entry: str, problem: str) -> ConfigError:
    return ConfigError(f"{spec}: {entry}: {problem}")


def _typed(spec: Path, where: str, key: str, value: Any, fields: dict[str, Any], known: str) -> Any:
    """``value`` of field ``key`` (entry ``where``), checked to be one of ``fields`` and of its type."""
    if key not in fields:
        raise _fail(spec, where, f"unknown field ({known})")
    if problem := value_problem(value, fields[key]):
        raise _fail(spec, where, problem)
    return value


def _name(spec: Path, where: str, name: Any) -> None:
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise _fail(spec, f"{where}.name", f"expected a non-empty string, got {name!r}")


def _unique(spec: Path, what: str, entries: list[Any], key: Any, same: str, twice: str) -> None:
    """Refuse two entries with one ``key`` (``same``) or one name (``twice``)."""
    for attribute, problem in ((key, same), (lambda e: e.name, twice)):
        seen: dict[Any, str] = {}
        for entry in entries:
            if (value := attribute(entry)) in seen:
                raise _fail(spec, f"{what} {entry.name!r}", problem.format(seen[value]))
            seen[value] = entry.name


def _train_values(spec: Path, entry: str, table: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """``table``'s TrainConfig values, each field known and of its type (float fields as floats)."""
    if not isinstance(table, dict):
        raise _fail(spec, entry, f"expected a table, got {table!r}")
    values = {}
    for key, value in table.items():
        if key in SWEEP_SET:
            raise _fail(spec, f"{entry}.{key}", "set by the sweep (seeds come from `seeds`), not by SPEC")
        _typed(spec, f"{entry}.{key}", key, value, fields, "not a TrainConfig field")
        values[key] = float(value) if float in typing.get_args(fields[key]) or fields[key] is float else value
    return values


def _label(values: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in values.items())


def _configurations(spec: Path, data: dict[str, Any], evaluation: dict[str, Any]) -> list[Configuration]:
    fields = field_types(TrainConfig, ())
    base = _train_values(spec, "train", data.get("train", {}), fields)
    grid_table = data.get("grid", {})
    if not isinstance(grid_table, dict):
        raise _fail(spec, "grid", f"expected a table of lists, got {grid_table!r}")
    grid: dict[str, list[Any]] = {}
    for key, values in grid_table.items():
        if not isinstance(values, list) or not values:
            raise _fail(spec, f"grid.{key}", f"expected a non-empty list of values, got {values!r}")
        grid[key] = [_train_values(spec, f"grid.{key}", {key: v}, fields)[key] for v in values]
    entries = data.get("configs", [{}])
    if not isinstance(entries, list) or not entries:
        raise _fail(spec, "configs", "expected a non-empty array of tables ([[configs]])")
    configs: list[Configuration] = []
    for index, entry in enumerate(entries):
        where = f"configs[{index}]"
        if not isinstance(entry, dict):
            raise _fail(spec, where, f"expected a table, got {entry!r}")
        entry = dict(entry)
        name = entry.pop("name", None)
        _name(spec, where, name)
        where = f"configs[{index}] {name!r}" if name else where
        own = _train_values(spec, where, entry, fields)
        overlap = sorted(set(own) & set(grid))
        if overlap:
            raise _fail(spec, where, f"{', '.join(overlap)} also in [grid]")
        for combo in itertools.product(*grid.values()) if grid else [()]:
            point = dict(zip(grid, combo, strict=True))
            label = ",".join(p for p in (name or "", _label(point)) if p) or _label(own) or "default"
            values = {**base, **evaluation, **own, **point}
            try:
                config = TrainConfig(**values)
            except (RaykitError, TypeError, ValueError) as exc:
                raise _fail(spec, f"configuration {label!r}", str(exc).replace("\n", " ")) from exc
            configs.append(Configuration(label, config))
    same = "the same configuration as {!r}"
    _unique(spec, "configuration", configs, lambda c: c.hash, same, "name used twice")
    return configs


def _captures(spec: Path, data: dict[str, Any]) -> list[Capture]:
    entries = data.get("captures")
    if not isinstance(entries, list) or not entries:
        raise _fail(spec, "captures", "expected a non-empty array of tables ([[captures]])")
    convert_fields = field_types(ConvertConfig, CONVERT_SET)
    captures = []
    for index, entry in enumerate(entries):
        where = f"captures[{index}]"
        if not isinstance(entry, dict):
            raise _fail(spec, where, f"expected a table, got {entry!r}")
        path, scene = entry.get("path"), entry.get("scene")
        if (path is None) == (scene is None):
            raise _fail(spec, where, "expected one of path (a capture or store) or scene (built-in)")
        name = entry.get("name")
        _name(spec, where, name)
        options: dict[str, Any] = {}
        for key, value in entry.items():
            if key in CAPTURE_KEYS:
                continue
            if key in CONVERT_SET:
                raise _fail(spec, f"{where}.{key}", "set by the sweep, not by SPEC")
            known = "not a capture key or ConvertConfig field"
            options[key] = _typed(spec, f"{where}.{key}", key, value, convert_fields, known)
        try:
            ConvertConfig(src="x", dst="y", **options)
        except (RaykitError, TypeError, ValueError) as exc:
            raise _fail(spec, where, str(exc).replace("\n", " ")) from exc
        if path is not None:
            if not isinstance(path, str) or not path:
                raise _fail(spec, f"{where}.path", f"expected a path, got {path!r}")
            resolved = (spec.parent / path).resolve()
            if not resolved.exists():
                raise _fail(spec, f"{where}.path", f"{resolved}: capture not found")
            capture = Capture(
                name or resolved.name, path=str(resolved), convert=tuple(sorted(options.items()))
            )
        else:
            if scene not in SCENE_SIZES:
                raise _fail(
                    spec, f"{where}.scene", f"expected one of {', '.join(SCENE_SIZES)}, got {scene!r}"
                )
            seed, camera = entry.get("scene_seed", 0), entry.get("camera_model", "PINHOLE")
            if value_problem(seed, int):
                raise _fail(spec, f"{where}.scene_seed", f"expected an integer, got {seed!r}")
            if camera not in SCENE_CAMERAS:
                raise _fail(
                    spec,
                    f"{where}.camera_model",
                    f"expected one of {', '.join(SCENE_CAMERAS)}, got {camera!r}",
                )
            capture = Capture(
                name or f"scene-{scene}",
                scene=scene,
                scene_seed=seed,
                camera_model=camera,
                convert=tuple(sorted(options.items())),
            )
        captures.append(capture)
    same, twice = "the same capture as {!r}", "name used twice (set `name`)"
    _unique(spec, "capture", captures, Capture.key, same, twice)
    return captures


def _evaluation(spec: Path, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The compared metric, and the trainer's ``eval_*`` fields the [evaluation] table sets."""
    table = data.get("evaluation", {})
    if not isinstance(table, dict):
        raise _fail(spec, "evaluation", f"expected a table, got {table!r}")
    table = dict(table)
    metric = table.pop("metric", "psnr")
    if not isinstance(metric, str) or not metric:
        raise _fail(spec, "evaluation.metric", f"expected a metric name, got {metric!r}")
    fields = field_types(TrainConfig, ())
    values = {}
    for key, value in table.items():
        name = f"eval_{key}"
        if name not in fields:
            known = sorted(f.removeprefix("eval_") for f in fields if f.startswith("eval_"))
            raise _fail(
                spec, f"evaluation.{key}", f"unknown field (expected metric or one of {', '.join(known)})"
            )
        values.update(_train_values(spec, "evaluation", {name: value}, fields))
    return metric, values


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check SPEC (see the module); raise :class:`ConfigError` naming the first bad entry."""
    spec = Path(path)
    try:
        data = read_toml(spec, limit=SPEC_LIMIT)
    except FileNotFoundError as exc:
        raise ConfigError(f"{spec}: not found") from exc
    except (OSError, ValueError) as exc:  # fileio's refusals (a FIFO, a device, too large, bad TOML)
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(text if text.startswith(str(spec)) else f"{spec}: unreadable ({text})") from None
    for key in data:
        if key not in TOP_KEYS:
            raise _fail(spec, key, f"unknown field (expected one of {', '.join(TOP_KEYS)})")
    seeds = _seeds(spec, data.get("seeds", [0]))
    _count_runs(spec, data, len(seeds))
    export = data.get("export", False)
    if not isinstance(export, bool):
        raise _fail(spec, "export", f"expected true or false, got {export!r}")
    metric, evaluation = _evaluation(spec, data)
    configs = _configurations(spec, data, evaluation)
    captures = _captures(spec, data)
    return SweepSpec(str(spec), tuple(captures), tuple(configs), tuple(seeds), metric, export)


def _seeds(spec: Path, seeds: Any) -> list[int]:
    """The SPEC's seeds, each an integer the trainer accepts, none twice (checked in linear time)."""
    if not isinstance(seeds, list) or not seeds:
        raise _fail(spec, "seeds", f"expected a non-empty list of integers, got {seeds!r}"[:300])
    valid = next(f for f in dataclasses.fields(TrainConfig) if f.name == "seed").metadata.get("valid")
    seen: set[int] = set()
    for seed in seeds:
        if value_problem(seed, int):
            raise _fail(spec, "seeds", f"expected integers, got {seed!r}"[:300])
        if not 0 <= seed <= SEED_MAX or (valid is not None and not valid.contains(seed)):
            raise _fail(spec, "seeds", f"seed {seed} out of range (expected an integer in [0, {SEED_MAX}])")
        if seed in seen:
            raise _fail(spec, "seeds", f"seed {seed} listed twice")
        seen.add(seed)
    return seeds


def _count_runs(spec: Path, data: dict[str, Any], seeds: int) -> int:
    """The number of runs the SPEC makes, counted (not enumerated); more than ``MAX_RUNS`` is refused.
    A malformed [grid], configs or captures counts as one here and is refused when read."""
    grid, entries, captures = data.get("grid", {}), data.get("configs", [{}]), data.get("captures")
    points = math.prod(len(v) for v in grid.values() if isinstance(v, list)) if isinstance(grid, dict) else 1
    configs = points * (len(entries) if isinstance(entries, list) else 1)
    n_captures = len(captures) if isinstance(captures, list) else 1
    runs = n_captures * configs * seeds
    if runs > MAX_RUNS:
        raise _fail(
            spec,
            "runs",
            f"{n_captures} captures x {configs} configurations x {seeds} seeds = {runs} runs, more than "
            f"the {MAX_RUNS} one sweep accepts; split it into several sweeps",
        )
    return runs
