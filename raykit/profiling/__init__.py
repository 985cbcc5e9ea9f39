"""Measurement code, kept out of the library: loader profiling (``raykit bench``), shuffle quality,
and the store-layout measurements of ``docs/format.md``.

Modules: ``mixing`` (``shuffle_quality``, the one figure of how well batches are mixed), ``loader``
(``run_bench``: rays/s by stage, cold and warm), ``layout`` (``python -m raykit.profiling.layout``:
bytes per ray, write time, read throughput), ``baselines`` (the two classic loaders the benchmark and
the demo compare against), ``cli`` (``raykit bench``). It sits above ``raykit.loaders`` in the layer
order; the pipeline and the demo import the names below from the package (imported on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raykit.lazy import lazy_attribute

if TYPE_CHECKING:
    from raykit.profiling.baselines import baseline_cached_images, baseline_precomputed_rays
    from raykit.profiling.loader import run_bench

# module -> the public names it defines (imported on first use: they import torch)
_PUBLIC = {
    "baselines": ("baseline_cached_images", "baseline_precomputed_rays"),
    "loader": ("run_bench",),
}
_MODULES = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = ["baseline_cached_images", "baseline_precomputed_rays", "run_bench"]


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _MODULES, globals(), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
