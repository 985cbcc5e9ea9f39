"""Both layouts on S3-compatible object storage: a real moto server on loopback, read through s3fs."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raykit.converters import convert
from raykit.errors import ConfigError, StoreNotFoundError
from raykit.loaders import RayLoader
from raykit.store import open_store
from raykit.store.write import upload_store

_spec = importlib.util.spec_from_file_location("til", Path(__file__).with_name("test_images_layout.py"))
assert _spec is not None and _spec.loader is not None
_til = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_til)


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """A moto S3 server on 127.0.0.1 with bucket ``raykit``; fsspec and worker processes point at it.

    Skips the tests that use it when s3fs or moto's server is missing (both in the dev extra).
    """
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    import fsspec
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": endpoint,
        "FSSPEC_S3_KEY": "testing",
        "FSSPEC_S3_SECRET": "testing",
    }
    saved_env = {k: os.environ.get(k) for k in env}
    saved_conf = fsspec.config.conf.get("s3")
    os.environ.update(env)
    fsspec.config.conf["s3"] = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("raykit")
    yield fs
    server.stop()
    for k, v in saved_env.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    fsspec.config.conf.pop("s3", None) if saved_conf is None else fsspec.config.conf.__setitem__(
        "s3", saved_conf
    )


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _til._capture(tmp_path_factory.mktemp("capture"), n=6)


def _keys(loader: Any) -> list[torch.Tensor]:
    return [b.image * 10_000 + b.pixel[:, 1] * 100 + b.pixel[:, 0] for b in loader]


@pytest.mark.parametrize(("layout", "backend"), [("images", "zarr"), ("images", "wds"), ("rays", "zarr"),
                                                 ("rays", "wds")])  # fmt: skip
def test_convert_to_s3_and_load(s3, capture: Path, tmp_path: Path, layout: str, backend: str) -> None:
    url = f"s3://raykit/{layout}-{backend}"
    options = {"layout": layout, "backend": backend, "near": 0.1, "far": 9.0, "chunk_rays": 512}
    remote = convert(capture, url, **options)
    local = convert(capture, tmp_path / "local", **options)
    assert remote.url == url and remote.fingerprint == local.fingerprint
    assert sorted(s3.ls(f"raykit/{layout}-{backend}", detail=False))  # objects are there
    for name in local.images("train"):
        assert np.array_equal(remote.read_image(name), local.read_image(name))
    kw = {"window_images": 2} if layout == "images" else {"mix_chunks": 2}
    expected = _keys(RayLoader(local, "train", 256, seed=2, **kw))
    plain = _keys(RayLoader(url, "train", 256, seed=2, **kw))
    cached = _keys(RayLoader(url, "train", 256, seed=2, disk_cache=tmp_path / "c", **kw))
    for got in (plain, cached):
        assert len(got) == len(expected) and all(
            torch.equal(a, b) for a, b in zip(got, expected, strict=True)
        )
    assert any((tmp_path / "c").rglob("*.tar" if backend == "wds" else "c/*"))
    with pytest.raises(ConfigError, match="already exists"):
        convert(capture, url, **options)


def test_upload_writes_the_manifest_last_and_refuses_partial(s3, capture: Path, tmp_path: Path) -> None:
    local = convert(capture, tmp_path / "s", layout="images", near=0.1, far=9.0)
    order = upload_store(Path(local.url), "s3://raykit/ordered")
    assert order[-1] == "manifest.json" and sorted(order) == sorted([*local.files, "manifest.json"])
    assert open_store("s3://raykit/ordered").fingerprint == local.fingerprint
    for rel in local.files:  # an upload interrupted before its manifest
        s3.put_file(str(Path(local.url) / rel), f"raykit/unfinished/{rel}")
    with pytest.raises(StoreNotFoundError, match="not a raykit store"):
        open_store("s3://raykit/unfinished")
    again = convert(capture, "s3://raykit/ordered", layout="images", near=0.1, far=9.0, overwrite=True)
    assert again.fingerprint == local.fingerprint
