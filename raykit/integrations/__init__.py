"""raykit inside other trainers: a nerfstudio plugin (``raykit.integrations.nerfstudio``: the
``raykit-data`` dataparser, datamanagers on raykit's loaders, the ``nerfacto-raykit`` and
``splatfacto-raykit`` methods) and a gsplat adapter (``raykit.integrations.gsplat``).

``camera_map`` (raykit cameras -> nerfstudio's camera types and distortion vector) needs neither
package; the nerfstudio modules need ``pip install "raykit[nerfstudio]"``. See docs/integrations.md.
"""

__all__: list[str] = []
