"""Measurement code, kept out of the library: loader profiling (``raykit bench``), shuffle quality,
and the store-layout measurements of ``docs/format.md``.

Modules: ``mixing`` (``shuffle_quality``, the one figure of how well batches are mixed), ``loader``
(``run_bench``: rays/s by stage, cold and warm), ``layout`` (``python -m raykit.profiling.layout``:
bytes per ray, write time, read throughput), ``baselines`` (the two classic loaders the benchmark and
the demo compare against), ``cli`` (``raykit bench``). Library modules never import
from here; it sits above ``raykit.loaders`` in the layer order.
"""

from __future__ import annotations

__all__: list[str] = []
