"""Loading strategies: how a store's layout becomes groups of rays for :class:`~raykit.loaders.RayLoader`.

A strategy is a function ``StrategyInputs -> GroupStage``: it builds the stages that read the split
and end in :class:`~raykit.loaders.stages.RawGroup` items (the batches' bounds and the slices holding
their rays); the loader then runs the strategy-independent stages (``Generate``, ``Prefetch``) after
it. ``RayLoader`` picks the strategy registered under the store's layout kind (:func:`layout_kind`).

Adding a strategy (e.g. a windowed shuffle over an images-layout store) is one module defining its
stages and its ``StrategyInputs -> GroupStage`` function, plus its line in :data:`STRATEGIES`; its
stages follow :class:`~raykit.loaders.stages.Stage` (``state_dict``/``load_state_dict`` of a
``{"epoch", "batch"}`` position at the group stage), so resuming, prefetching and multi-threaded
generation come with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raykit.errors import ConfigError
from raykit.loaders.chunked import chunk_groups
from raykit.loaders.stages import GroupStage, StrategyInputs

__all__ = ["STRATEGIES", "Strategy", "layout_kind", "strategy_for"]

Strategy = Callable[[StrategyInputs], GroupStage]

# Layout kind (the store manifest's ``layout.kind``; ``"rays"`` when absent) -> strategy.
STRATEGIES: dict[str, Strategy] = {"rays": chunk_groups}


def layout_kind(store: Any) -> str:
    """The layout kind of ``store`` (``"rays"``: shuffled ray chunks; also any non-store source)."""
    manifest = getattr(store, "manifest", None)
    layout = manifest.get("layout", {}) if isinstance(manifest, dict) else {}
    return str(layout.get("kind", "rays")) if isinstance(layout, dict) else "rays"


def strategy_for(store: Any) -> Strategy:
    """The strategy of ``store``'s layout kind.

    Raises:
        ConfigError: no strategy reads that layout kind.
    """
    kind = layout_kind(store)
    if kind not in STRATEGIES:
        raise ConfigError(
            f"loader: {getattr(store, 'url', 'store')}: no loading strategy for layout kind {kind!r} "
            f"(known: {', '.join(sorted(STRATEGIES))})"
        )
    return STRATEGIES[kind]
