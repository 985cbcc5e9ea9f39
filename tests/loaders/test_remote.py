"""Remote stores over HTTP (a real server on 127.0.0.1) through the shared on-disk shard cache."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.loaders import RayLoader
from raykit.store import open_store


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def do_GET(self) -> None:
        self.requests.append(self.path)
        super().do_GET()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server(stores: dict[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """``(base URL, list of requested paths)`` serving the stores' parent directory."""
    root = Path(stores["zarr"].url).parent
    requests: list[str] = []
    handler = functools.partial(type("H", (_CountingHandler,), {"requests": requests}), directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", requests
    httpd.shutdown()
    thread.join()


@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_remote_store_through_disk_cache(
    stores: dict[str, Any], server: tuple[str, list[str]], tmp_path: Path, backend: str
) -> None:
    base, requests = server
    remote = open_store(f"{base}/{backend}")
    expected = [
        b.pid for b in RayLoader(stores[backend], "train", batch_size=100, seed=3, make_batch=lambda r: r)
    ]
    for workers in (0, 1):
        loader = RayLoader(
            remote,
            "train",
            batch_size=100,
            seed=3,
            disk_cache=tmp_path,
            num_workers=workers,
            cache_bytes=0,
            make_batch=lambda r: r,
        )
        got = [b.pid for b in loader]
        loader.close()
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)
        if workers == 0:
            shard_requests = [r for r in requests if "/c/" in r or r.endswith(".tar")]
            assert shard_requests and len(shard_requests) == len(
                set(shard_requests)
            )  # each shard fetched once
            requests.clear()
    assert not [r for r in requests if "/c/" in r or r.endswith(".tar")]  # the worker read the shared cache
    cached = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "manifest.json" for p in cached) and not [
        p for p in cached if p.name.endswith(".tmp")
    ]
