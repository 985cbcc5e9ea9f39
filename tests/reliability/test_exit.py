"""Clean process exits: no native thread pool left running when the interpreter tears down.

The abort ("terminate called without an active exception", status 134) happens when a native thread
still runs at interpreter exit: it needs the GIL, Python ends it with ``pthread_exit`` inside a C++
destructor, and the C++ runtime calls ``std::terminate``. These tests pin the promises that keep that
from happening (docs/reliability.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raykit.store import open_store

from .conftest import subprocess_env

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc (Linux)")

_THREADS = """
import os, sys
from raykit.store.table import read_camera_table
data = open(sys.argv[1], "rb").read()
before = len(os.listdir("/proc/self/task"))
table = read_camera_table(data, "cameras.parquet")
print(before, len(os.listdir("/proc/self/task")), table.num_rows)
"""


def test_camera_table_read_starts_no_native_threads(stores: dict[str, Any]) -> None:
    # ``pq.read_table`` scans on Arrow's thread pool, whose workers drop the last reference to the
    # Python buffer after the call returned; at interpreter exit that aborted 4 runs in 5 under load.
    path = Path(stores["zarr"].url) / "cameras.parquet"
    out = subprocess.run(
        [sys.executable, "-c", _THREADS, str(path)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    before, after, rows = (int(v) for v in out.stdout.split())
    assert rows == len(open_store(stores["zarr"].url).table.names)
    assert after == before, f"reading the camera table started {after - before} native threads"


@pytest.mark.slow
@pytest.mark.parametrize("command", [["info"], ["validate"]])
def test_cli_exit_status_is_trustworthy(stores: dict[str, Any], command: list[str]) -> None:
    # Repeated runs: the abort was intermittent (5 of 6 ``raykit info`` runs at load 1.7).
    for _ in range(4):
        out = subprocess.run(
            [sys.executable, "-m", "raykit", *command, stores["zarr"].url],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert "terminate called" not in out.stderr
