"""Frozen configuration dataclasses whose fields generate a command's flags.

A command's options are written once, as fields made with ``option(default, help, ...)``; then
``add_arguments(parser, Config)`` builds the flags and ``from_args(Config, args)`` reads them back.
Field ``some_name`` becomes ``--some-name`` (or ``flag``), a ``bool`` field a ``--x/--no-x`` pair, an
``int | None`` field a flag of type ``int`` defaulting to ``None``; the help text gains the default
(unless it is ``None``: then the help says what that means). A numeric field's ``valid``
(a :class:`raykit.ranges.Range`) is its expected range: ``config_problems`` checks every such field
(the configs call it in ``__post_init__``, so a value from the command line, a JSON file or Python is
checked alike: ``--lr nan`` is refused before anything starts).
Used by ``TrainConfig``, ``ConvertConfig``, ``PoseOptions``, ``RunConfig`` and ``BenchConfig``; ``raykit run``
adds several configs' flags to one parser (``skip`` leaves out what it sets itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Collection
from typing import Any

from raykit.ranges import Range

__all__ = [
    "add_arguments",
    "add_command",
    "config_flags",
    "config_problems",
    "field_types",
    "from_args",
    "option",
    "value_problem",
    "with_keywords",
]


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    positional: bool = False,
    required: bool = False,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    group: str | None = None,
    valid: Range | None = None,
) -> Any:
    """A dataclass field that is also a command-line option (``add_argument``'s meanings, and):

    Args:
        flag: the flag's name when it is not ``--`` + the field name with dashes.
        group: fields of the same group are mutually exclusive on the command line.
        valid: the expected range of a numeric field (checked by :func:`config_problems`).
    """
    extra = {"flag": flag, "positional": positional, "required": required, "choices": choices,
             "metavar": metavar, "group": group, "valid": valid}  # fmt: skip
    return dataclasses.field(default=default, metadata={"help": help, **extra})


def _base_type(annotation: Any) -> Any:
    """``int | None`` -> int; ``float`` -> float."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def add_arguments(
    parser: argparse.ArgumentParser,
    config: type[Any],
    *,
    positional: tuple[str, ...] = (),
    required: tuple[str, ...] = (),
    skip: Collection[str] = (),
) -> None:
    """Add one argument per field of dataclass ``config`` whose metadata has a ``help``.

    ``positional`` and ``required`` name fields that are positional or required besides those whose
    ``option`` says so; fields in ``skip`` get no flag (a command that sets them itself).
    """
    hints = typing.get_type_hints(config)
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        meta = f.metadata
        if "help" not in meta or f.name in skip:
            continue
        target: Any = parser
        if meta.get("group"):
            if meta["group"] not in groups:
                groups[meta["group"]] = parser.add_mutually_exclusive_group()
            target = groups[meta["group"]]
        if meta.get("positional") or f.name in positional:
            target.add_argument(f.name, help=meta["help"], metavar=meta.get("metavar"))
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        kind = _base_type(hints[f.name])
        if kind is bool:
            target.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default, help=meta["help"]
            )
            continue
        kwargs: dict[str, Any] = {"type": kind, "dest": f.name, "help": meta["help"]}
        if meta.get("required") or f.name in required:
            kwargs["required"] = True
        else:
            kwargs["default"] = f.default
            if f.default is not None:  # a None default says what it means in the help text
                kwargs["help"] = f"{meta['help']} (default: {f.default})"
        for key in ("choices", "metavar"):
            if meta.get(key) is not None:
                kwargs[key] = meta[key]
        target.add_argument(flag, **kwargs)


def from_args(config: type[Any], args: argparse.Namespace, skip: Collection[str] = (), **fixed: Any) -> Any:
    """The ``config`` instance described by parsed arguments: each option field the arguments carry,
    except those in ``skip`` (left at their defaults), then ``fixed`` (extra attributes are ignored)."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(config)
        if "help" in f.metadata and f.name not in skip and hasattr(args, f.name)
    }
    return config(**{**values, **fixed})


def config_flags(config: Any, skip: Collection[str] = ()) -> list[str]:
    """The flags that set every field of ``config`` differing from its default (``--x``/``--no-x`` for
    booleans; positional fields and those in ``skip`` left out): ``add_arguments``'s inverse."""
    flags: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in skip or f.metadata.get("positional") or value == f.default:
            continue
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif value is not None:
            flags.append(f"{flag}={value}")
    return flags


def config_problems(config: Any) -> list[str]:
    """One line per field of dataclass instance ``config`` outside its ``valid`` range or ``choices``
    (``--lr: expected a finite number > 0, got nan``), in field order."""
    problems = []
    for f in dataclasses.fields(config):
        value, name = getattr(config, f.name), "--" + f.name.replace("_", "-")
        valid, choices = f.metadata.get("valid"), f.metadata.get("choices")
        if valid is not None and (problem := valid.problem(name, value)):
            problems.append(problem)
        elif choices is not None and value not in choices:
            problems.append(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
    return problems


def with_keywords(config: Any, keywords: dict[str, Any], what: str, fixed: Collection[str] = ()) -> Any:
    """``config`` with the fields named by ``keywords`` replaced: a function whose keywords are a config's
    fields takes ``**keywords`` and calls this, so each option is written once, in the config. A
    keyword that is no field (or is one of ``fixed``) raises ``TypeError``, as Python does for ``what``.
    """
    names = {f.name for f in dataclasses.fields(config)} - set(fixed)
    unknown = sorted(set(keywords) - names)
    if unknown:
        raise TypeError(
            f"{what} got unexpected keyword argument(s) {', '.join(map(repr, unknown))} "
            f"(its keywords are the fields of {type(config).__name__})"
        )
    return dataclasses.replace(config, **keywords)


def add_command(
    subparsers: Any,
    name: str,
    help: str,
    func: Callable[[argparse.Namespace], int],
    *,
    description: str | None = None,
    config: type[Any] | None = None,
    **flags: Any,
) -> argparse.ArgumentParser:
    """Add subcommand ``name`` (``help`` in the command list, ``description`` atop its own help), run
    by ``func(args)``; with ``config``, one flag per option field (``flags``: :func:`add_arguments`'s
    keywords). Returns its parser, for the flags the command adds itself."""
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=help, description=description)
    if config is not None:
        add_arguments(parser, config, **flags)
    parser.set_defaults(func=func)
    return parser


def value_problem(value: Any, annotation: Any) -> str | None:
    """None when ``value`` (from TOML or JSON) fits a field's ``annotation`` (``int``, ``float | None``, ...),
    else why not: the typed entry points (``raykit sweep``'s SPEC) check values as the flags' types do."""
    kinds = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    kind = kinds[0]
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind is str:
        ok = isinstance(value, str)
    else:  # pragma: no cover - every config field is one of the above
        ok = True
    name = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind, str(kind))
    return None if ok else f"expected {name}, got {value!r}"


def field_types(config: type[Any], skip: Collection[str] = ()) -> dict[str, Any]:
    """Each field of dataclass ``config`` but those in ``skip``: its type annotation."""
    hints = typing.get_type_hints(config)
    return {f.name: hints[f.name] for f in dataclasses.fields(config) if f.name not in skip}
