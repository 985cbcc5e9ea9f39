"""torch on first use: the core modules that hold numpy and torch code (conventions, camera models,
cameras) import without it, so what only needs their numpy side (``raykit validate``, ``raykit info``,
a loader's worker process, a converter reading a capture) starts without the seconds torch takes.

In such a module::

    if TYPE_CHECKING:
        import torch
    else:
        torch = lazy_torch(globals())

``torch.anything`` then imports torch and puts the real module in the module's globals in place of
the stand-in, so later uses cost nothing extra.
"""

from __future__ import annotations

import functools
import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from typing_extensions import TypeIs

__all__ = ["is_tensor", "lazy_attribute", "lazy_torch", "optional_module"]


class _LazyTorch:
    """Stands for ``torch`` in ``namespace`` until an attribute is first asked for."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self._namespace = namespace

    def __getattr__(self, name: str) -> Any:
        import torch

        self._namespace["torch"] = torch
        return getattr(torch, name)


def lazy_torch(namespace: dict[str, Any]) -> Any:
    """A stand-in for ``torch`` in the module whose ``globals()`` is ``namespace`` (see above)."""
    return _LazyTorch(namespace)


def is_tensor(value: Any) -> TypeIs[torch.Tensor]:
    """Whether ``value`` is a torch tensor, without importing torch (none exists before it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def lazy_attribute(package: str, modules: dict[str, str], namespace: dict[str, Any], name: str) -> Any:
    """A package's ``__getattr__``: ``name`` imported from its submodule ``modules[name]`` on first use
    and kept in ``namespace`` (the package's globals), so later lookups are plain.
    """
    if name not in modules:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{package}.{modules[name]}"), name)
    namespace[name] = value
    return value


@functools.cache
def optional_module(name: str) -> ModuleType | None:
    """The module ``name`` when it is installed, else None: for optional accelerators (OpenCV,
    simplejpeg) that a module uses when present; looked up once per name."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
