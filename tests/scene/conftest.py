"""Shared renders of the tiny built-in scene (rendered once per test session)."""

from __future__ import annotations

import pytest

from raykit.testing import SceneData, render_scene


@pytest.fixture(scope="session")
def tiny_pinhole() -> SceneData:
    return render_scene("tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_opencv() -> SceneData:
    return render_scene("tiny", seed=0, camera_model="OPENCV")
