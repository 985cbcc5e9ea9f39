"""LPIPS trunk weights fetched once into torch hub's cache, checked by the sha256 prefix in their name,
from a real HTTP server on loopback (``raykit.metrics.TRUNK_URLS`` pointed at it); offline refuses with
one line."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import raykit.cli
import raykit.metrics
from raykit.metrics import LpipsWeightsError, lpips_weight_paths, reference_lpips

from ..data.oracles import cases


class _Server:
    """Serves ``root`` on 127.0.0.1 in a thread, counting the GET requests per path."""

    def __init__(self, root: Path) -> None:
        self.hits: dict[str, int] = {}
        hits = self.hits

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                hits[self.path] = hits.get(self.path, 0) + 1
                super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
        )
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[_Server]:
    (tmp_path / "served").mkdir()
    served = _Server(tmp_path / "served")
    yield served
    served.close()


@pytest.fixture(autouse=True)
def _torch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv(raykit.metrics.OFFLINE_ENV, raising=False)


def _serve(server: _Server, tmp_path: Path, state: dict[str, torch.Tensor], prefix: str | None = None) -> str:
    """Save ``state`` under a name carrying its sha256 prefix (or ``prefix``) and return its URL."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    name = f"alexnet-owt-{prefix or hashlib.sha256(data).hexdigest()[:8]}.pth"
    (tmp_path / "served" / name).write_bytes(data)
    return server.url(name)


def _cache() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints"


def test_fetched_once_checked_by_hash(
    server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _serve(server, tmp_path, {"features.0.weight": torch.arange(6.0)})
    monkeypatch.setitem(raykit.metrics.TRUNK_URLS, "alex", url)
    heads = tmp_path / "heads.pth"
    heads.write_bytes(b"heads")
    paths = lpips_weight_paths("alex", heads=heads)
    name = url.rsplit("/", 1)[1]
    assert (
        paths.trunk == _cache() / name
        and paths.trunk.read_bytes() == (tmp_path / "served" / name).read_bytes()
    )
    assert server.hits == {f"/{name}": 1}
    assert lpips_weight_paths("alex", heads=heads).trunk == paths.trunk
    assert server.hits == {f"/{name}": 1}  # the second call finds it in the cache
    assert sorted(p.name for p in _cache().iterdir()) == [name]


def test_wrong_hash_refused_nothing_kept(
    server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _serve(server, tmp_path, {"features.0.weight": torch.ones(3)}, prefix="0badf00d")
    monkeypatch.setitem(raykit.metrics.TRUNK_URLS, "alex", url)
    with pytest.raises(LpipsWeightsError) as err:
        lpips_weight_paths("alex", heads=tmp_path)
    message = str(err.value)
    assert (
        message.startswith(f"{url}: refused: its sha256 ") and "0badf00d" in message and "\n" not in message
    )
    assert list(_cache().iterdir()) == []  # neither the file nor a partial one
    monkeypatch.setitem(raykit.metrics.TRUNK_URLS, "alex", server.url("alexnet-owt-12345678.pth"))
    with pytest.raises(LpipsWeightsError, match=r"12345678\.pth: could not fetch LPIPS alex trunk weights"):
        lpips_weight_paths("alex", heads=tmp_path)  # 404: one line too


def test_offline_refuses_with_one_line(
    server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _serve(server, tmp_path, {"features.0.weight": torch.ones(3)})
    monkeypatch.setitem(raykit.metrics.TRUNK_URLS, "alex", url)
    monkeypatch.setenv(raykit.metrics.OFFLINE_ENV, "1")
    with pytest.raises(LpipsWeightsError) as err:
        lpips_weight_paths("alex", heads=tmp_path)
    expected = (
        f"{_cache() / url.rsplit('/', 1)[1]}: LPIPS alex trunk weights not found; download {url} to that path"
    )
    assert str(err.value).startswith(expected) and "offline" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setenv(raykit.metrics.OFFLINE_ENV, "0")
    with pytest.raises(LpipsWeightsError, match="not found; download"):
        lpips_weight_paths("alex", heads=tmp_path, offline=True)  # the argument wins over the variable
    assert server.hits == {}


def test_raykit_evaluate_fetches_once_and_offline_is_one_line(
    server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``raykit evaluate`` on a fresh machine: the trunk is fetched and LPIPS computed with it; offline it
    exits 2 with one line and writes nothing."""
    trunk, heads = cases.lpips_weights("alex", seed=8)
    url = _serve(server, tmp_path, trunk)
    monkeypatch.setitem(raykit.metrics.TRUNK_URLS, "alex", url)
    torch.save(heads, tmp_path / "heads.pth")
    gt, pred = cases.image(0), cases.noisy(cases.image(0), 1)
    for folder, pixels in (("gt", gt), ("pred", pred)):
        (tmp_path / folder).mkdir()
        Image.fromarray(pixels).save(tmp_path / folder / "r_0.png")
    out = tmp_path / "results.json"
    args = ["evaluate", str(tmp_path / "pred"), str(tmp_path / "gt"), "--output", str(out)]
    args.append(f"--lpips-alex-heads={tmp_path / 'heads.pth'}")
    assert raykit.cli.main([*args, "--offline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "LPIPS alex trunk weights not found" in err[0] and "offline" in err[0]
    assert not out.exists() and server.hits == {}
    assert raykit.cli.main(args) == 0
    results = json.loads(out.read_text())
    assert results["lpips_computed"] and results["protocol"]["lpips_status"] == "computed (alex)"
    a, b = (torch.from_numpy(np.ascontiguousarray(x))[None] for x in (pred, gt))
    expected = float(reference_lpips(a, b, "alex", trunk, heads)[0])
    assert results["images"][0]["lpips"] == pytest.approx(expected, abs=1e-5) and expected > 0
    assert raykit.cli.main([*args, "--offline"]) == 0  # now in the cache: offline is fine
    assert list(server.hits.values()) == [1]
