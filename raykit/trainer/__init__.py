"""raykit.trainer: a compact radiance field trained from a ray store.

``train(TrainConfig(store=..., out=...))`` trains, checkpoints and evaluates; ``render(run_dir)``
re-evaluates a run; ``compare(run_a, run_b)`` diffs two runs' metrics. Sampling strategies:
stratified, hierarchical (inverse CDF), occupancy grid (see ``raykit.trainer.samplers``) and proposal
networks (``raykit.trainer.proposal``), or ``auto`` (the default: one of them per scene space,
:data:`AUTO_SAMPLERS`); scene spaces box, contract and NDC (``raykit.trainer.space``).
``export_run(run_dir, out)`` writes a self-contained model, ``verify_export(out)`` checks it against
the run's evaluation and ``render_export(out, cameras, dir)`` renders from it alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raykit.lazy import lazy_attribute

if TYPE_CHECKING:
    from raykit.metrics import OLD_PROTOCOL, protocol_of
    from raykit.trainer.comparison import compare
    from raykit.trainer.config import AUTO_SAMPLERS, SAMPLERS, TrainConfig
    from raykit.trainer.deploy import render_export, verify_export
    from raykit.trainer.evaluate import render
    from raykit.trainer.export import export_run
    from raykit.trainer.exported import load_export
    from raykit.trainer.loop import train
    from raykit.trainer.sampling_map import SAMPLING_MAP

# module -> the public names it defines, imported on first use (PEP 562): ``raykit sweep``, ``raykit run``
# and their refusals read ``TrainConfig`` without the seconds torch takes to import.
_PUBLIC = {
    "comparison": ("compare",),
    "config": ("AUTO_SAMPLERS", "SAMPLERS", "TrainConfig"),
    "deploy": ("render_export", "verify_export"),
    "evaluate": ("render",),
    "export": ("export_run",),
    "exported": ("load_export",),
    "loop": ("train",),
    "sampling_map": ("SAMPLING_MAP",),
}
_MODULES = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = [
    "AUTO_SAMPLERS",
    "OLD_PROTOCOL",
    "SAMPLERS",
    "SAMPLING_MAP",
    "TrainConfig",
    "compare",
    "export_run",
    "load_export",
    "protocol_of",
    "render",
    "render_export",
    "train",
    "verify_export",
]


def __getattr__(name: str) -> Any:
    if name in ("OLD_PROTOCOL", "protocol_of"):
        import raykit.metrics

        value = getattr(raykit.metrics, name)
        globals()[name] = value
        return value
    return lazy_attribute(__name__, _MODULES, globals(), name)
