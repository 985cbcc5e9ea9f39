"""Remote stores on servers that ignore HTTP ``Range`` (Python's ``http.server``): never called corrupt.

Both backends, the stdlib server and a range-capable one, with and without a loader's disk cache: the
batches equal the local store's, and payload files cross the network whole at most once.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.errors import RangeIgnoredWarning
from raykit.loaders import RayLoader
from raykit.store import open_store

from .conftest import http_server

_KW: dict[str, Any] = dict(batch_size=200, seed=1, cache_bytes=0, make_batch=lambda r: r)


@pytest.mark.parametrize("cache", [False, True], ids=["memory", "disk_cache"])
@pytest.mark.parametrize("ranges", [False, True], ids=["stdlib_server", "range_server"])
@pytest.mark.parametrize("backend", ["zarr", "wds"])
def test_remote_reads_match_local(
    stores: dict[str, Any], tmp_path: Path, backend: str, ranges: bool, cache: bool
) -> None:
    local = stores[backend]
    expected = [(b.rgba, b.pid) for b in RayLoader(local, **_KW)]
    with http_server(Path(local.url).parent, ranges) as (base, requests):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            remote = open_store(f"{base}/{backend}")
            loader = RayLoader(remote, disk_cache=tmp_path / "cache" if cache else None, **_KW)
            got = [(b.rgba, b.pid) for b in loader]
            loader.close()
        payload = [(p, r) for p, r in requests if "/c/" in p or p.endswith(".tar")]
    assert len(got) == len(expected)
    for (a, b), (c, d) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)
    ignored = [w for w in caught if issubclass(w.category, RangeIgnoredWarning)]
    whole = Counter(p for p, r in payload if r is None or not ranges)
    if cache:  # whole shards, each fetched once, into the cache
        assert not ignored
        assert all(r is None for _, r in payload)
        assert set(whole.values()) == {1}
    elif ranges:  # true range reads, no fallback
        assert not ignored and payload and all(r is not None for _, r in payload)
    else:  # the stdlib server sent whole files: detected once, then every file fetched whole once
        assert len(ignored) == 1 and "ignores HTTP Range" in str(ignored[0].message)
        assert max(whole.values()) == 1
