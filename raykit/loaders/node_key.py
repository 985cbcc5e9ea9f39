"""What a ``transform`` computes, as a digest: the part of a node cache's key
(:mod:`raykit.loaders.node_cache`) that tells two transforms apart by their code, not their name.

Two scripts whose ``transform`` are both ``__main__.transform`` but compute different pixels must not
share a cache, so a function is described by its bytecode, constants and names (nested functions and
comprehensions included), its defaults, the values its closure holds, and the values of the globals
its code names (functions among them described the same way, modules by name, arrays by their bytes);
``functools.partial`` and bound methods by their function and arguments; a callable object by its
class's ``__call__`` and its pickled state. What cannot be described so (a value that neither is one
of these nor pickles, e.g. a lock or a generator in a closure) makes the transform un-keyable: a
``ConfigError`` rather than a cache shared on a guess.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import types
from typing import Any

import numpy as np

from raykit.errors import ConfigError

__all__ = ["transform_key"]

_PLAIN = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis))


class _Unkeyable(Exception):
    pass


def transform_key(transform: Any) -> str:
    """A digest of what ``transform`` computes (``"none"`` for None); equal for the same code and
    values, different when either differs.

    Raises:
        ConfigError: a transform that holds something that cannot be described (module docstring).
    """
    if transform is None:
        return "none"
    try:
        described = _describe(transform, set())
    except (_Unkeyable, RecursionError) as exc:
        raise ConfigError(
            f"image loader: cache 'node' shares images between processes by what the transform computes, "
            f"and {transform!r} cannot be described ({exc}); use cache='process', or a transform whose "
            "closure and globals hold plain values"
        ) from None
    return hashlib.sha256(repr(described).encode()).hexdigest()


def _names(code: types.CodeType) -> set[str]:
    """The global (and attribute) names ``code`` and the code nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _code(code: types.CodeType, seen: set[int]) -> tuple[Any, ...]:
    return ("code", code.co_code, tuple(_describe(c, seen) for c in code.co_consts), code.co_names)


def _function(fn: types.FunctionType, seen: set[int]) -> tuple[Any, ...]:
    name = (fn.__module__, fn.__qualname__)
    if id(fn) in seen:  # recursion: the first visit describes it
        return ("function", *name)
    seen.add(id(fn))
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(_describe(cell.cell_contents, seen))
        except ValueError:  # an empty cell
            cells.append("<empty cell>")
    names = sorted(n for n in _names(fn.__code__) if n in fn.__globals__)
    globals_ = tuple((n, _describe(fn.__globals__[n], seen)) for n in names)
    defaults = (_describe(fn.__defaults__, seen), _describe(fn.__kwdefaults__, seen))
    return ("function", *name, _code(fn.__code__, seen), defaults, tuple(cells), globals_)


def _describe(value: Any, seen: set[int]) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(_describe(v, seen) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((_describe(k, seen), _describe(v, seen)) for k, v in value.items()))
    if isinstance(value, np.ndarray | np.generic):
        array = np.ascontiguousarray(value)
        return ("array", array.dtype.str, array.shape, hashlib.sha256(array.tobytes()).hexdigest())
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, types.CodeType):
        return _code(value, seen)
    if isinstance(value, types.FunctionType):
        return _function(value, seen)
    if isinstance(value, functools.partial):
        return ("partial", *(_describe(v, seen) for v in (value.func, value.args, value.keywords)))
    if isinstance(value, types.MethodType):
        return ("method", _describe(value.__func__, seen), _describe(value.__self__, seen))
    if isinstance(value, type | types.BuiltinFunctionType | np.ufunc | np.dtype):
        return ("named", getattr(value, "__module__", None), getattr(value, "__qualname__", repr(value)))
    try:
        state = hashlib.sha256(pickle.dumps(value, protocol=4)).hexdigest()
    except Exception as exc:  # pickling raises many kinds
        raise _Unkeyable(f"{type(value).__qualname__} {str(exc)[:120]}") from None
    call = vars(type(value)).get("__call__")  # the class's own; an inherited one is named by the class
    described = _describe(call, seen) if isinstance(call, types.FunctionType) else None
    return ("object", type(value).__module__, type(value).__qualname__, described, state)
