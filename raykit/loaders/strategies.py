"""Loading strategies: how a split's recorded layout becomes groups of rays for ``RayLoader``.

:data:`STRATEGIES` maps the layout (``RayStore.layout(split)``) to its strategy: ``"rays"``
(:mod:`raykit.loaders.chunked`; also any chunk source that is not a store) and ``"images"``
(:mod:`raykit.loaders.windowed`). Adding a strategy is one module and its line there.
"""

from __future__ import annotations

from typing import Any, Protocol

from raykit.errors import ConfigError
from raykit.loaders.cache import ChunkCache
from raykit.loaders.chunked import RAYS
from raykit.loaders.config import LoaderConfig
from raykit.loaders.source import ChunkSource
from raykit.loaders.stages import GroupStage, StrategyInputs
from raykit.loaders.windowed import WINDOW
from raykit.store import IMAGES_LAYOUT, RAYS_LAYOUT, RawRays, RayStore

__all__ = ["STRATEGIES", "Strategy", "layout_of", "strategy_for"]


class Strategy(Protocol):
    """One layout's source, plan, cache, read-ahead and stages (ending in
    :class:`~raykit.loaders.stages.RawGroup` items). ``name`` is recorded in the loader state as
    ``"strategy"`` (but ``"rays"``), ``state_fields(plan)`` must match exactly on resuming; ``steps``
    are the steps its stages time (``RayLoader.seconds``)."""

    name: str
    steps: tuple[str, ...]

    def source(self, store: RayStore | ChunkSource, cfg: LoaderConfig) -> ChunkSource: ...

    def plan(self, source: Any, cfg: LoaderConfig, rank: int, world_size: int) -> Any: ...

    def cache(self, cfg: LoaderConfig, source: Any, plan: Any) -> ChunkCache[RawRays]: ...

    def group_rays(self, cfg: LoaderConfig) -> int: ...

    def lookahead(self, plan: Any, num_workers: int) -> int: ...

    def state_fields(self, plan: Any) -> dict[str, Any]: ...

    def groups(self, inputs: StrategyInputs) -> GroupStage: ...


# The split's recorded layout (``RayStore.layout``) -> strategy.
STRATEGIES: dict[str, Strategy] = {RAYS_LAYOUT: RAYS, IMAGES_LAYOUT: WINDOW}


def layout_of(store: RayStore | ChunkSource, split: str) -> str:
    """The recorded layout of ``split`` (``"rays"`` for a chunk source, or a split the store lacks:
    its source then says so)."""
    if isinstance(store, RayStore) and split in store.splits:
        return store.layout(split)
    return RAYS_LAYOUT


def strategy_for(store: RayStore | ChunkSource, split: str) -> Strategy:
    """The strategy of ``split``'s recorded layout.

    Raises:
        ConfigError: no strategy reads that layout.
    """
    layout = layout_of(store, split)
    if layout not in STRATEGIES:
        raise ConfigError(
            f"loader: {getattr(store, 'url', 'store')}: split {split!r} has layout {layout!r}, which no "
            f"loading strategy reads (known: {', '.join(sorted(STRATEGIES))})"
        )
    return STRATEGIES[layout]
