"""Fixtures of the fault-injection suite: small real stores written by ``raykit.store.write_store``."""

from __future__ import annotations

import contextlib
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
from raykit.store import ImageRecord, SceneInfo, open_store, write_store
from raykit.store.write import copy_store

WIDTH, HEIGHT = 24, 16


def synthetic_image(seed: int, height: int, width: int) -> np.ndarray:
    """(H, W, 4) uint8 seeded pixels (module level so records pickle)."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8)


def build_store(
    path: Path, backend: str = "zarr", n_train: int = 6, chunk_rays: int = 128, seed: int = 0, **kw: Any
) -> Any:
    """A store of ``n_train`` train and 2 test images of 24x16 pixels, 4 chunks per shard."""
    camera = Camera("PINHOLE", WIDTH, HEIGHT, (30.0, 31.0, WIDTH / 2, HEIGHT / 2))
    records = []
    for i in range(n_train + 2):
        c2w = np.eye(4)
        c2w[:3, 3] = (0.1 * i, -0.2 * i, 3.0)
        split = "train" if i < n_train else "test"
        load = functools.partial(synthetic_image, i, HEIGHT, WIDTH)
        records.append(ImageRecord(f"img_{i:03d}.png", split, camera, c2w, 0.5, 6.0, f"mem://{i}", load))
    return write_store(
        path,
        records,
        scene=SceneInfo(),
        backend=backend,
        chunk_rays=chunk_rays,
        shard_chunks=4,
        seed=seed,
        **kw,
    )


@pytest.fixture(scope="session")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``{"zarr": RayStore, "wds": RayStore}``: a Zarr store and its WebDataset copy (read-only use)."""
    root = tmp_path_factory.mktemp("reliability-stores")
    build_store(root / "zarr", "zarr")
    copy_store(root / "zarr", root / "wds", backend="wds")
    return {backend: open_store(root / backend) for backend in ("zarr", "wds")}


def subprocess_env() -> dict[str, str]:
    """The environment for child Python processes: this checkout first on ``PYTHONPATH``."""
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Python's static file handler (ignores ``Range``: answers 200 with the whole file), counting GETs."""

    requests: list[tuple[str, str | None]]

    def do_GET(self) -> None:
        self.requests.append((self.path, self.headers.get("Range")))
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _RangeHandler(_Handler):
    """The same plus single byte ranges (``bytes=a-b``, ``a-``, ``-n``) answered 206 with Content-Range."""

    def send_head(self) -> Any:
        spec, path = self.headers.get("Range"), self.translate_path(self.path)
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", (spec or "").strip())
        if match is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        first, last = match.groups()
        start = max(size - int(last), 0) if first == "" else int(first)
        end = size - 1 if first == "" or not last else min(int(last), size - 1)
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read(max(end - start + 1, 0))
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return io.BytesIO(data)


@contextlib.contextmanager
def http_server(root: Path, ranges: bool) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """``(base URL, requests as (path, Range header))`` of a real server on 127.0.0.1 serving ``root``;
    ``ranges=False`` is Python's stdlib server, which ignores ``Range``."""
    requests: list[tuple[str, str | None]] = []
    base = _RangeHandler if ranges else _Handler
    handler = functools.partial(type("H", (base,), {"requests": requests}), directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
