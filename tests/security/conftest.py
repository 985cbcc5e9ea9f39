"""Fixtures of the security suite: small real stores, and a way to forge what a received folder holds.

Every case reads a folder that someone else made: its records are rewritten and re-signed (the
manifest digest recomputed) so that only the checks against the folder's own content can catch them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raykit.cameras import Camera
from raykit.store import ImageRecord, SceneInfo, write_store
from raykit.store.files import json_digest

WIDTH, HEIGHT = 12, 8
SECRET = b"secret: nothing outside the received folder may be read\n"


def _pixels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)


def build_store(path: Path, backend: str = "zarr", layout: str = "rays") -> Path:
    """4 train and 2 test images of 12x8 pixels, 64 rays a chunk, 2 chunks a shard."""
    camera = Camera("PINHOLE", WIDTH, HEIGHT, (14.0, 14.0, WIDTH / 2, HEIGHT / 2))
    records = []
    for i in range(6):
        c2w = np.eye(4)
        c2w[:3, 3] = (0.1 * i, 0.0, 3.0)
        split = "train" if i < 4 else "test"
        load = functools.partial(_pixels, i)
        records.append(ImageRecord(f"img_{i}.png", split, camera, c2w, 0.5, 6.0, f"mem://{i}", load))
    write_store(
        path, records, scene=SceneInfo(), backend=backend, chunk_rays=64, shard_chunks=2, layout=layout
    )
    return path


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("security-stores")
    stores = {backend: build_store(root / backend, backend) for backend in ("zarr", "wds")}
    stores["images"] = build_store(root / "images", "zarr", layout="images")
    return stores


@pytest.fixture()
def received(tmp_path: Path, pristine: dict[str, Path]) -> Any:
    """``received(kind)``: a fresh copy of a small store (``zarr``, ``wds``, or ``images``: zarr, images
    layout) in ``tmp_path/store``, and beside it (outside the store) ``tmp_path/secret`` (a file no
    read of the store may touch)."""

    def make(backend: str = "zarr") -> Path:
        dst = tmp_path / "store"
        shutil.copytree(pristine[backend], dst)
        (tmp_path / "secret").write_bytes(SECRET)
        return dst

    return make


def resign(store: Path, edit: Any) -> None:
    """Apply ``edit(manifest)`` to ``store``'s manifest and recompute its digest (a forged manifest)."""
    manifest = json.loads((store / "manifest.json").read_text())
    edit(manifest)
    manifest.pop("manifest_digest", None)
    manifest["manifest_digest"] = json_digest(manifest)
    (store / "manifest.json").write_text(json.dumps(manifest))


def payload_files(store: Path) -> list[str]:
    """The store's payload files (shards), relative names; an images-layout store's image files first."""
    manifest = json.loads((store / "manifest.json").read_text())
    files = [rel for rel in manifest["files"] if "/" in rel and not rel.endswith(".json")]
    return sorted(files, key=lambda rel: "/images/" not in rel)


def secret_digest() -> str:
    return hashlib.sha256(SECRET).hexdigest()


def replace_with(path: Path, kind: str, target: Path) -> None:
    """Put a symlink to ``target``, a FIFO, or a symlink to /dev/zero in place of ``path``."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        os.symlink("/dev/zero", path)
    else:
        os.symlink(target, path)


# A run of a few steps of a tiny model: seconds on one CPU thread.
TINY_TRAIN = {
    "steps": 4, "batch_size": 128, "levels": 2, "base_resolution": 8, "max_resolution": 16, "features": 2,
    "hidden": 16, "n_samples": 16, "occ_resolution": 16, "occ_update_every": 2, "occ_warmup_steps": 2,
    "march_steps": 32, "log_every": 1, "ckpt_every": 2, "threads": 1, "device": "cpu", "sampler": "occupancy",
}  # fmt: skip


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, pristine: dict[str, Path]) -> dict[str, Path]:
    """A run of 4 steps on the zarr store (checkpoints at steps 2 and 4) and its export."""
    from raykit.trainer import export_run, train
    from raykit.trainer.config import TrainConfig

    root = tmp_path_factory.mktemp("security-run")
    run = train(TrainConfig(store=str(pristine["zarr"]), out=str(root / "run"), **TINY_TRAIN))
    export_run(run, root / "export")
    return {"root": root, "run": Path(run), "export": root / "export", "store": pristine["zarr"]}


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """``raykit ARGV`` in this process: (exit status, non-empty output lines)."""
    from raykit.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    return code, [line for line in (captured.out + captured.err).splitlines() if line.strip()]
