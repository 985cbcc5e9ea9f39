"""Process hygiene of loaders: release at interpreter exit.

A loader runs a producer thread, generation threads and (``num_workers > 0``) worker
processes. A thread still inside native code (torch, Arrow) when the interpreter finalises is ended by
``pthread_exit`` inside a C++ frame and the process aborts with status 134 ("terminate called without an
active exception"), losing the script's own exit status. Every loader is therefore registered here and
closed by a hook that runs at the start of interpreter shutdown, before ``concurrent.futures`` joins its
pools and long before finalisation: the loader's threads stop and are joined, its workers are ended
(:mod:`raykit.loaders.processes`; they never run the parent's ``__main__``, so no guard is needed).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from typing import Any

__all__ = ["close_all", "register"]

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


# Runs when interpreter shutdown begins, before concurrent.futures joins its pools (threading's exit
# hooks run newest first, and concurrent.futures registered its own when imported, before this one);
# the public atexit hook is the fallback where that private hook does not exist.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(close_all)
else:  # pragma: no cover
    atexit.register(close_all)
