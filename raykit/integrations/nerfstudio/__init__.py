"""The nerfstudio plugin: ``raykit-data`` (dataparser), datamanagers on raykit's loaders, and the
``nerfacto-raykit`` / ``splatfacto-raykit`` methods (registered through nerfstudio's entry points;
see pyproject.toml and docs/integrations.md). Needs ``pip install "raykit[nerfstudio]"``."""

__all__: list[str] = []
