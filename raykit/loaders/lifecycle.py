"""Process hygiene of loaders: release at interpreter exit, and the ``__main__`` guard check.

**Exit.** A loader runs a producer thread, generation threads and (``num_workers > 0``) worker
processes. A thread still inside native code (torch, Arrow) when the interpreter finalises is ended by
``pthread_exit`` inside a C++ frame and the process aborts with status 134 ("terminate called without an
active exception"), losing the script's own exit status. Every loader is therefore registered here and
closed by a hook that runs at the start of interpreter shutdown, before ``concurrent.futures`` joins its
pools and long before finalisation: the loader's threads stop and are joined, its workers are shut down.

**Spawned workers re-run ``__main__``.** ``multiprocessing``'s ``spawn`` (the only start method that is
safe with threads and torch) imports the main script in each worker. Code at a script's top level
outside ``if __name__ == "__main__":`` then runs again there and starts loaders of its own;
:func:`check_main_guard` finds that case before anything starts and says what to change.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

from raykit.errors import ConfigError

__all__ = ["check_main_guard", "close_all", "register", "unguarded_main_line"]

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_LOCK = threading.Lock()


def register(loader: Any) -> None:
    """Close ``loader`` (anything with ``close()``) at interpreter exit if it is still alive then."""
    with _LOCK:
        _LIVE.add(loader)


def close_all() -> None:
    """Close every registered loader that is still alive (errors are ignored: the process is ending)."""
    with _LOCK:
        loaders = list(_LIVE)
    for loader in loaders:
        with contextlib.suppress(Exception):
            loader.close()


def _is_main_test(node: ast.expr) -> bool:
    """Whether ``node`` is ``__name__ == "__main__"`` (either order)."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)):
        return False
    sides = [node.left, node.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    texts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and texts == ["__main__"]


def _guarded_lines(source: str) -> list[tuple[int, int]]:
    """Line ranges ``(first, last)`` of the bodies of ``if __name__ == "__main__":`` blocks."""
    ranges = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.body:
            ranges.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno))
    return ranges


def unguarded_main_line() -> tuple[str, int] | None:
    """``(script, line)`` when the caller is being run by a main script's top-level code outside an
    ``if __name__ == "__main__":`` block (code a spawned worker would run again), else ``None``.

    Interactive sessions, ``python -c``, ``python -m package`` (spawn skips a package's ``__main__``)
    and scripts that cannot be read are never flagged.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path:
        return None
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return None  # ``python -m package``: spawn does not re-run a package's __main__
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        ranges = _guarded_lines(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    if any(first <= line <= last for first, last in ranges):
        return None
    return str(path), line


def check_main_guard(num_workers: int) -> None:
    """Raise ``ConfigError`` if ``num_workers > 0`` worker processes would re-run the caller's script.

    Raises:
        ConfigError: naming the script and line, and what to change.
    """
    if num_workers <= 0:
        return
    found = unguarded_main_line()
    if found is None:
        return
    path, line = found
    raise ConfigError(
        f"loader: num_workers={num_workers} starts worker processes, and each one re-runs the top level "
        f"of {path} (Python's spawn start method); line {line}, which made this loader, is not under "
        f'`if __name__ == "__main__":`, so every worker would make its own. Move the script\'s top-level '
        f'code from line {line} on into an `if __name__ == "__main__":` block (see docs/loading.md), '
        "or use num_workers=0."
    )


# Runs when interpreter shutdown begins, before concurrent.futures joins its pools (threading's exit
# hooks run newest first, and concurrent.futures registered its own when imported, before this one);
# the public atexit hook is the fallback where that private hook does not exist.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(close_all)
else:  # pragma: no cover
    atexit.register(close_all)
