"""Shared fixtures for store tests: tiny synthetic captures and a real HTTP server with range requests."""

from __future__ import annotations

import functools
import http.server
import io
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.cameras import Camera
from raykit.store import ImageRecord, SceneInfo

# (width, height, split, channels)
IMAGES = [
    (16, 12, "train", 4),
    (20, 10, "train", 3),
    (10, 10, "train", 4),
    (8, 8, "val", 4),
    (12, 9, "val", 3),
    (12, 9, "test", 4),
]


def _rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def make_records(seed: int = 0, images: list[tuple[int, int, str, int]] = IMAGES) -> list[ImageRecord]:
    """Random images with PINHOLE cameras and random poses; ``load`` is a picklable partial."""
    rng = np.random.default_rng(seed)
    records = []
    for i, (w, h, split, channels) in enumerate(images):
        pixels = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
        c2w = np.eye(4)
        c2w[:3, :3] = _rotation(rng)
        c2w[:3, 3] = rng.normal(size=3)
        camera = Camera("PINHOLE", w, h, (15.0 + i, 14.0, w / 2, h / 2), camera_id=i + 1)
        load = functools.partial(np.array, pixels)
        # Names deliberately not in split order, so table order (split, name) differs from input order.
        records.append(ImageRecord(f"im{9 - i}", split, camera, c2w, 0.5, 4.0 + i, f"mem://{i}", load))
    return records


@pytest.fixture(scope="session")
def records() -> list[ImageRecord]:
    return make_records()


@pytest.fixture(scope="session")
def record_factory() -> Any:
    """``make_records(seed, images)`` for tests that need their own capture."""
    return make_records


@pytest.fixture(scope="session")
def scene() -> SceneInfo:
    wfs = np.diag([2.0, 2.0, 2.0, 1.0])
    wfs[:3, 3] = [0.1, -0.2, 0.3]
    return SceneInfo(
        world_frame="test frame",
        world_from_source=wfs,
        transform_method="test",
        transform_params={"scale": 2.0},
        bounds=((-1, -1, -1), (1, 1, 1)),
        near=0.5,
        far=10.0,
    )


class RangeRequestHandler(http.server.SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` plus single byte-range requests (``bytes=a-b``, ``a-``, ``-n``)."""

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def send_head(self) -> Any:
        spec = self.headers.get("Range")
        path = self.translate_path(self.path)
        if spec is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", spec.strip())
        if match is None:
            self.send_error(416)
            return None
        first, last = match.groups()
        if first == "":
            start, end = max(size - int(last), 0), size - 1
        else:
            start, end = int(first), min(int(last) if last else size - 1, size - 1)
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read(max(end - start + 1, 0))
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return io.BytesIO(data)


@pytest.fixture(scope="session")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """(directory, base URL) of a real HTTP server on 127.0.0.1 serving that directory."""
    root = tmp_path_factory.mktemp("http")
    handler = functools.partial(RangeRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
