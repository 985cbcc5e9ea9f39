"""The splatting-style training loop of docs/loading.md runs as written and lowers its loss."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from raykit.converters import convert
from raykit.testing import render_scene, write_colmap

DOC = Path(__file__).resolve().parents[2] / "docs" / "loading.md"


def _loop_source() -> str:
    text = DOC.read_text()
    found = re.search(r"<!-- splatting-loop -->\n```python\n(.*?)```", text, re.S)
    assert found, "docs/loading.md lost its splatting-loop block"
    return found.group(1)


@pytest.fixture(scope="module")
def colmap_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("splat")
    write_colmap(render_scene("tiny", seed=0), root / "cap", n_points=200)
    convert(root / "cap", root / "store")
    return root / "store"


def test_docs_splatting_loop_trains(colmap_store: Path) -> None:
    namespace: dict[str, object] = {}
    exec(compile(_loop_source(), str(DOC), "exec"), namespace)
    losses, state = namespace["train"](colmap_store, steps=60)  # type: ignore[operator]
    per_epoch = state["n_batches"]  # one image per step
    assert len(losses) == 60 and all(np.isfinite(losses))
    assert np.mean(losses[-per_epoch:]) < 0.9 * np.mean(losses[:per_epoch])  # it learns
    assert state["kind"] == "images" and state["epoch"] * per_epoch + state["batch"] == 60
