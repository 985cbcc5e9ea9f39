"""Deterministic train/val/test split rules.

A rule is given as a string (``--split``) or, from Python, a mapping ``split -> image names``:

* ``"auto"`` (default): the source's own splits when it has them (Blender: one file per split),
  otherwise ``"every:8"``;
* ``"every:N"``: sort the image names; the images at sorted index ``0, N, 2N, ...`` are ``test``, the
  rest ``train``. ``every:8`` is the Mip-NeRF 360 / LLFF protocol (``llffhold = 8``);
* ``"source"``: the source's own splits (an error for sources without them);
* ``"all"``: every image in ``train``;
* ``"test=FILE[,val=FILE][,train=FILE]"``: text files with one image name per line (blank lines and
  ``#`` comments ignored). Images in no list are ``train`` unless a ``train`` list is given, in which
  case every image must be listed. Names listed but absent from the capture, or listed twice, are
  errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from raykit.errors import ConfigError, SourceError

__all__ = ["DEFAULT_HOLDOUT", "assign_splits", "every_nth", "read_name_list"]

DEFAULT_HOLDOUT = 8
SplitSpec = str | Mapping[str, Sequence[str]] | None


def every_nth(names: Sequence[str], n: int) -> dict[str, str]:
    """Every ``n``-th image of the sorted names (starting with the first) -> ``test``, others ``train``."""
    if n < 2:
        raise ConfigError(f"split every:N: expected N >= 2, got {n}")
    return {name: "test" if i % n == 0 else "train" for i, name in enumerate(sorted(names))}


def read_name_list(path: Path) -> list[str]:
    """Image names from a text file, one per line (``#`` comments and blank lines skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read split list ({exc})") from None
    stripped = (line.strip() for line in lines)
    return [line.replace("\\", "/") for line in stripped if line and not line.startswith("#")]


def _parse_lists(spec: str) -> dict[str, list[str]]:
    lists: dict[str, list[str]] = {}
    for part in spec.split(","):
        split, sep, file = part.partition("=")
        if not sep or not split or not file:
            raise ConfigError(f"split: expected 'name=FILE[,name=FILE]', got {spec!r}")
        lists[split.strip()] = read_name_list(Path(file.strip()))
    return lists


def _from_lists(names: Sequence[str], lists: Mapping[str, Sequence[str]]) -> dict[str, str]:
    known = set(names)
    out: dict[str, str] = {}
    problems = []
    for split, listed in lists.items():
        for name in listed:
            if name not in known:
                problems.append(f"split {split!r}: image {name!r} is not in the capture")
            elif name in out:
                problems.append(f"split {split!r}: image {name!r} is already in split {out[name]!r}")
            else:
                out[name] = split
    default = None if "train" in lists else "train"
    for name in names:
        if name not in out:
            if default is None:
                problems.append(f"split: image {name!r} is in no split list")
            else:
                out[name] = default
    if problems:
        raise SourceError(problems)
    return out


def assign_splits(names: Sequence[str], source_splits: Sequence[str | None], spec: SplitSpec) -> list[str]:
    """The (I,) split of every image of (I,) unique ``names`` under rule ``spec`` (see the module
    docstring); ``source_splits``: the source's own split per image, or None where it has none."""
    has_source = len(names) > 0 and all(s is not None for s in source_splits)
    if spec is None or spec == "auto":
        spec = "source" if has_source else f"every:{DEFAULT_HOLDOUT}"
    if isinstance(spec, Mapping):
        table = _from_lists(names, spec)
    elif spec == "source":
        if not has_source:
            raise ConfigError("split 'source': this capture has no splits of its own; use every:N or lists")
        return [str(s) for s in source_splits]
    elif spec == "all":
        table = {name: "train" for name in names}
    elif spec.startswith("every:"):
        try:
            n = int(spec.removeprefix("every:"))
        except ValueError:
            raise ConfigError(f"split: expected every:N with an integer N, got {spec!r}") from None
        table = every_nth(names, n)
    elif "=" in spec:
        table = _from_lists(names, _parse_lists(spec))
    else:
        raise ConfigError(
            f"split: expected auto, source, all, every:N or name=FILE[,name=FILE], got {spec!r}"
        )
    return [table[name] for name in names]
