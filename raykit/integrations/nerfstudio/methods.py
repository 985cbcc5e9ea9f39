"""The ``nerfacto-raykit`` and ``splatfacto-raykit`` methods: nerfstudio's nerfacto and splatfacto
with raykit's datamanagers and the ``raykit-data`` dataparser.

Registered under nerfstudio's ``nerfstudio.method_configs`` entry point (pyproject.toml). The specs
are built on first access (module ``__getattr__``), because nerfstudio's method configs import its
model and pipeline modules, which import torchvision: importing this module needs neither. So is
``RaykitPipeline`` (nerfacto-raykit's pipeline: nerfstudio's ``VanillaPipeline`` that feeds each
training step's per-ray losses back to the ray datamanager, ``RaykitDataManager.observe_outputs``,
which draws by them with ``sampling="loss"`` and ignores them otherwise).
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["METHODS", "method_spec"]

# method name -> (stock nerfstudio method it copies, description)
METHODS: dict[str, tuple[str, str]] = {
    "nerfacto-raykit": ("nerfacto", "nerfacto with rays from raykit's RayLoader (a raykit store as --data)"),
    "splatfacto-raykit": (
        "splatfacto",
        "splatfacto with images from raykit's ImageLoader (a raykit store as --data)",
    ),
}
_ATTRIBUTES = {"nerfacto_raykit": "nerfacto-raykit", "splatfacto_raykit": "splatfacto-raykit"}


def method_spec(name: str) -> Any:
    """The ``MethodSpecification`` of ``name`` (a key of :data:`METHODS`)."""
    from nerfstudio.configs.method_configs import method_configs
    from nerfstudio.plugins.types import MethodSpecification

    from raykit.integrations.nerfstudio.dataparser import RaykitDataParserConfig
    from raykit.integrations.nerfstudio.image_datamanager import (
        RaykitImageDataManagerConfig,
        splatfacto_on_levels,
    )
    from raykit.integrations.nerfstudio.ray_datamanager import RaykitDataManagerConfig

    stock, description = METHODS[name]
    config: Any = copy.deepcopy(method_configs[stock])
    config.method_name = name
    old: Any = config.pipeline.datamanager
    parser = RaykitDataParserConfig(load_3D_points=True)
    if stock == "nerfacto":
        config.pipeline.datamanager = RaykitDataManagerConfig(
            dataparser=parser,
            train_num_rays_per_batch=old.train_num_rays_per_batch,
            eval_num_rays_per_batch=old.eval_num_rays_per_batch,
        )
        config.pipeline._target = _pipeline_class()  # feeds back per-ray losses (sampling="loss")
    else:
        model = config.pipeline.model
        config.pipeline.datamanager = RaykitImageDataManagerConfig(
            dataparser=parser,
            cache_images_type=old.cache_images_type,
            num_downscales=model.num_downscales,
            resolution_schedule=model.resolution_schedule,
        )
        model._target = splatfacto_on_levels
    return MethodSpecification(config=config, description=description)


def _pipeline_class() -> type:
    """``RaykitPipeline``, made once (its base imports torchvision); found by this module's name."""
    if "RaykitPipeline" not in globals():
        from nerfstudio.pipelines.base_pipeline import VanillaPipeline

        class RaykitPipeline(VanillaPipeline):
            """``VanillaPipeline`` whose training step also calls the datamanager's ``observe_outputs``."""

            def get_train_loss_dict(self, step: int) -> Any:
                outputs, loss_dict, metrics_dict = super().get_train_loss_dict(step)
                observe = getattr(self.datamanager, "observe_outputs", None)
                if observe is not None:
                    observe(self.model, outputs)
                return outputs, loss_dict, metrics_dict

        RaykitPipeline.__qualname__ = "RaykitPipeline"  # saved configs and pickles name it here
        globals()["RaykitPipeline"] = RaykitPipeline
    return globals()["RaykitPipeline"]


def __getattr__(attribute: str) -> Any:
    if attribute == "RaykitPipeline":
        return _pipeline_class()
    if attribute in _ATTRIBUTES:
        return method_spec(_ATTRIBUTES[attribute])
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
