"""Faults while a store is written: a second writer, a stale lock, Ctrl-C, a full disk or an I/O
error; and a checkpoint failing to save (docs/reliability.md)."""

from __future__ import annotations

import dataclasses
import errno
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import raykit.fileio
from raykit.errors import StoreNotFoundError
from raykit.locks import lock_path, read_lock
from raykit.store import open_store
from raykit.testing import render_scene, write_blender
from raykit.trainer.checkpoint import (
    CheckpointMeta,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

from .conftest import build_store, subprocess_env
from .paused import start_paused


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Blender capture of the built-in scene (tiny)."""
    return write_blender(render_scene("tiny"), tmp_path_factory.mktemp("capture") / "blender")


def _raykit(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raykit", *args],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=timeout,
    )


def _convert(capture: Path, dst: Path, *extra: str) -> list[str]:
    return ["convert", str(capture), str(dst), "--no-progress", "--chunk-rays", "1024", *extra]


def _files(store: Path) -> dict[str, Any]:
    manifest = json.loads((store / "manifest.json").read_text())
    return {"fingerprint": manifest["content_fingerprint"], "files": manifest["files"]}


_HOLD = """
import sys, time
from raykit.locks import store_lock
with store_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_second_writer_is_refused_and_a_stale_lock_reported_and_taken_over(
    capture: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "store"
    owner = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(dst)], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "locked"
        out = _raykit(*_convert(capture, dst))
        assert out.returncode == 2
        assert f"pid {owner.pid} on host {socket.gethostname()}" in out.stderr
        assert "another process is writing this store" in out.stderr
    finally:
        owner.send_signal(signal.SIGKILL)  # killed: its lock stays behind
        owner.wait()
    assert lock_path(dst).exists() and read_lock(lock_path(dst))["pid"] == owner.pid
    out = _raykit(*_convert(capture, dst))  # the stale lock is reported and taken over
    assert out.returncode == 0, out.stderr
    assert f"stale lock {lock_path(dst)} left by pid {owner.pid} on host {socket.gethostname()}" in out.stderr
    assert _raykit("validate", str(dst)).returncode == 0
    assert not lock_path(dst).exists()


@pytest.mark.slow
def test_two_converts_at_once_one_wins(capture: Path, tmp_path: Path) -> None:
    dst = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "raykit", *_convert(capture, dst)],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=subprocess_env(),
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=180), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "another process is writing this store" in loser or "a store already exists" in loser
    assert _raykit("validate", str(dst)).returncode == 0


def test_ctrl_c_during_convert_exits_promptly_and_resumes_to_the_same_bytes(
    capture: Path, tmp_path: Path
) -> None:
    straight = tmp_path / "straight"
    assert _raykit(*_convert(capture, straight)).returncode == 0
    dst = tmp_path / "store"
    # Ctrl-C once the first shard is recorded (the child waits there for it: no race to lose)
    proc, _ = start_paused(f"{dst}.partial/tasks/*.json", _convert(capture, dst), subprocess_env())
    proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    code = proc.wait(timeout=60)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert code == 130 and time.monotonic() - t0 < 10, stderr
    assert "raykit: interrupted" in stderr and "Traceback" not in stderr
    with pytest.raises(StoreNotFoundError, match="interrupted write"):
        open_store(dst)
    assert not lock_path(dst).exists()
    assert _raykit(*_convert(capture, dst)).returncode == 0
    assert _files(dst) == _files(straight)


def _inject(monkeypatch: pytest.MonkeyPatch, code: int, after: int) -> list[str]:
    """Make the ``after``-th file sync (and every later one) fail with ``code``, as a full disk or a
    failing device reports at ``fsync``; returns the paths it failed on."""
    real = raykit.fileio.fsync_path
    calls: list[str] = []
    failed: list[str] = []

    def fsync(path: Any) -> None:
        calls.append(str(path))
        if len(calls) >= after:
            failed.append(str(path))
            raise OSError(code, os.strerror(code), str(path))
        real(path)

    for name in ("raykit.store.write.commit", "raykit.store.write.rays", "raykit.store.write.images"):
        importlib.import_module(name)  # every module that syncs files is loaded, then patched
    for name, module in list(sys.modules.items()):
        if name.startswith("raykit.") and getattr(module, "fsync_path", None) is real:
            monkeypatch.setattr(module, "fsync_path", fsync)
    return failed


@pytest.mark.parametrize(("code", "after"), [(errno.ENOSPC, 3), (errno.EIO, 12)])
def test_disk_full_or_io_error_during_conversion(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, code: int, after: int
) -> None:
    dst = tmp_path / "store"
    failed = _inject(monkeypatch, code, after)
    with pytest.raises(OSError) as info:
        build_store(dst, "zarr")
    assert info.value.errno == code and failed and info.value.filename == failed[0]
    with pytest.raises(StoreNotFoundError):  # nothing that looks like a store
        open_store(dst)
    assert not lock_path(dst).exists()
    monkeypatch.undo()
    build_store(dst, "zarr")  # the space is back: the rerun completes (resuming the partial)
    open_store(dst, verify=True)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_failed_checkpoint_leaves_the_previous_one_intact(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, code: int
) -> None:
    meta = CheckpointMeta(4, {}, {}, {}, "fingerprint", "0")
    first = {"field": {"w": torch.arange(6.0)}}
    save_checkpoint(tmp_path, meta, first)
    failed = _inject(monkeypatch, code, 1)
    with pytest.raises(OSError) as info:
        save_checkpoint(tmp_path, dataclasses.replace(meta, step=8), {"field": {"w": torch.zeros(6)}})
    assert info.value.errno == code and failed
    monkeypatch.undo()
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name.endswith("4")
    _, tensors = load_checkpoint(latest)
    assert torch.equal(tensors["field"]["w"], first["field"]["w"])
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.endswith(".tmp")]
