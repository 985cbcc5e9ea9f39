"""The node cache on a machine shared with other users (docs/reliability.md, "Shared machines"): its
folder is this user's and private, nothing planted in or around it is followed, waited on or served,
another user's folder is never used nor removed, and the key tells transforms apart by their code.

Every test points ``RAYKIT_NODE_CACHE_DIR`` at its own folder. The cases that need a folder owned by
another user (uid 12345) create it with ``os.chown`` and are skipped, inside the test, when not root.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from raykit.errors import ConfigError
from raykit.loaders import ImageLoader
from raykit.loaders.node_cache import NodeCacheError, NodeImageCache, node_cache_root, sweep_stale
from raykit.loaders.node_key import transform_key

ROOT = Path(__file__).resolve().parents[2]
OTHER_UID = 12345


@pytest.fixture
def images(pristine: dict[str, Path]) -> Path:
    return pristine["images"]


def cache_folder(store: Path, **options: Any) -> Path:
    """The folder a node-cached loader of ``store``'s train split uses (it is gone once closed)."""
    with ImageLoader(store, "train", cache="node", **options) as loader:
        folder = Path(loader.cache.shared.root)
        assert folder.is_dir()
    assert not folder.exists()
    return folder


def as_other_user(path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("making a folder of another user needs root")
    for item in [path, *path.rglob("*")]:
        os.chown(item, OTHER_UID, OTHER_UID, follow_symlinks=False)


def batches(loader: ImageLoader) -> list[torch.Tensor]:
    return [batch.images.clone() for _ in range(2) for batch in loader]


def test_the_folder_is_named_by_uid_and_made_private_whatever_the_umask(images: Path, shm: Path) -> None:
    old = os.umask(0)  # the worst umask: whatever the code asks for is what it gets
    try:
        with ImageLoader(images, "train", cache="node") as loader:
            batches(loader)
            folder = Path(loader.cache.shared.root)
            assert folder.parent == shm and folder.name.startswith(f"raykit-node-{os.getuid()}-")
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
            files = list(folder.iterdir())
            assert len(files) > 3  # users, admit.lock, entries and their locks
            assert all(stat.S_IMODE(f.lstat().st_mode) == 0o600 and f.is_file() for f in files)
    finally:
        os.umask(old)


def test_a_planted_open_folder_is_refused_in_one_line(images: Path, shm: Path) -> None:
    folder = cache_folder(images)
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    with pytest.raises(NodeCacheError, match=rf"{folder}: mode 0755 lets other users in") as caught:
        ImageLoader(images, "train", cache="node")
    assert "\n" not in str(caught.value)
    assert list(folder.iterdir()) == []  # nothing written into it


def test_a_folder_of_another_user_is_refused_and_untouched(images: Path, shm: Path) -> None:
    folder = cache_folder(images)
    folder.mkdir(mode=0o700)
    np.save(folder / "1_0.npy", np.full((8, 12, 3), 255, np.uint8))  # white pixels for root to train on
    (folder / "users").touch()
    as_other_user(folder)
    with pytest.raises(NodeCacheError, match=rf"{folder}: owned by uid {OTHER_UID}, not by this user"):
        ImageLoader(images, "train", cache="node")
    assert sorted(p.name for p in folder.iterdir()) == ["1_0.npy", "users"]
    assert folder.stat().st_uid == OTHER_UID


def test_a_symlinked_folder_is_refused_and_its_target_untouched(
    images: Path, shm: Path, tmp_path: Path
) -> None:
    folder = cache_folder(images)
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (target / "keep").write_bytes(b"mine")
    os.symlink(target, folder)
    with pytest.raises(NodeCacheError, match=rf"{folder}: a symbolic link or not a folder"):
        ImageLoader(images, "train", cache="node")
    sweep_stale(shm)  # nor does the cleanup follow it
    assert [p.name for p in target.iterdir()] == ["keep"] and (target / "keep").read_bytes() == b"mine"
    assert folder.is_symlink()


def entry(key: object) -> tuple[tuple[int, ...], np.dtype]:
    return (4, 4, 3), np.dtype(np.uint8)


def test_symlinked_lock_files_are_refused_and_their_targets_never_made(shm: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    cache = NodeImageCache("locks", 1 << 20, entry)
    os.symlink(victim, cache.root / "admit.lock")
    with pytest.raises(NodeCacheError, match=r"admit.lock: a symbolic link"):
        cache.put((1, 0), np.zeros((4, 4, 3), np.uint8))
    os.symlink(victim, cache.root / "lock-1_1")
    with pytest.raises(NodeCacheError, match=r"lock-1_1: a symbolic link"):
        cache.get_or_load((1, 1), lambda: np.zeros((4, 4, 3), np.uint8))
    cache.close()
    folder = cache.root
    folder.mkdir(mode=0o700)
    os.symlink(victim, folder / "users")
    with pytest.raises(NodeCacheError, match=r"users: a symbolic link"):
        NodeImageCache("locks", 1 << 20, entry)
    assert not victim.exists()


FIFOS = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import numpy as np
    from raykit.loaders.node_cache import NodeCacheError, NodeImageCache, node_cache_root, sweep_stale

    entry = lambda key: ((4, 4, 3), np.dtype(np.uint8))
    seen = {}
    def attempt(case, action):
        try:
            action()
            seen[case] = "used"
        except NodeCacheError as exc:
            seen[case] = str(exc)

    cache = NodeImageCache("fifo", 1 << 20, entry)
    for name in ("admit.lock", "1_0.npy", "lock-1_1"):
        os.mkfifo(cache.root / name)
    attempt("admit.lock", lambda: cache.put((1, 2), np.zeros((4, 4, 3), np.uint8)))
    attempt("1_0.npy", lambda: cache.get((1, 0)))
    attempt("lock-1_1", lambda: cache.get_or_load((1, 1), lambda: np.zeros((4, 4, 3), np.uint8)))
    root = cache.root
    cache.close()  # the last user: the folder goes, FIFOs and all
    os.mkdir(root, 0o700)
    os.mkfifo(root / "users")
    attempt("users", lambda: NodeImageCache("fifo", 1 << 20, entry))
    os.unlink(root / "users")
    os.rmdir(root)
    os.mkfifo(root)  # the folder itself, and a stale-looking name for the cleanup
    attempt("folder", lambda: NodeImageCache("fifo", 1 << 20, entry))
    attempt("cleanup", lambda: sweep_stale())
    print(json.dumps(seen))
    """
)


def test_a_planted_fifo_is_an_error_never_a_hang(shm: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", FIFOS], capture_output=True, text=True, env=env, timeout=300
    )  # a hang fails the test here (TimeoutExpired) instead of blocking the suite
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    for name in ("admit.lock", "1_0.npy", "lock-1_1", "users"):
        assert seen[name].endswith(f"{name}: a FIFO, expected a regular file; not used"), seen
    assert "a symbolic link or not a folder" in seen["folder"]
    assert seen["cleanup"] == "used"  # skipped it, without waiting on it


def test_a_wrong_shaped_entry_is_never_served(images: Path, shm: Path) -> None:
    with ImageLoader(images, "train", cache="process", batch_size=1) as own:
        want = batches(own)
    with ImageLoader(images, "train", cache="node", batch_size=1) as node:
        folder = Path(node.cache.shared.root)
        h, w, c = node.source.shape(0)
        planted = {  # level 1, positions 0..3: a 1x1 image, a wrong size, a wrong dtype, not an .npy
            "1_0.npy": np.ones((1, 1, c), np.uint8),
            "1_1.npy": np.full((h + 1, w, c), 255, np.uint8),
            "1_2.npy": np.zeros((h, w, c), np.float32),
        }
        for name, array in planted.items():
            np.save(folder / name, array)
        (folder / "1_3.npy").write_bytes(b"\x93NUMPY garbage")
        got = batches(node)
        assert node.cache.shared.refused == 4
    assert len(want) == len(got) > 0
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_a_planted_file_of_another_user_in_the_folder_is_refused(shm: Path) -> None:
    cache = NodeImageCache("owner", 1 << 20, entry)
    planted = cache.root / "1_0.npy"
    np.save(planted, np.zeros((4, 4, 3), np.uint8))
    as_other_user(cache.root)
    os.chown(cache.root, os.getuid(), os.getgid())  # the folder stays ours, the file is not
    with pytest.raises(NodeCacheError, match=rf"1_0.npy: owned by uid {OTHER_UID}"):
        cache.get((1, 0))
    cache.close()


def in_main(source: str) -> Any:
    """``transform`` as a script's ``__main__.transform`` defined by ``source``."""
    namespace: dict[str, Any] = {"__name__": "__main__", "np": np}
    exec(source, namespace)
    return namespace["transform"]


def test_transforms_of_one_name_but_different_code_get_different_caches(images: Path, shm: Path) -> None:
    flip = "def transform(image):\n    return np.ascontiguousarray(image[:, ::-1])\n"
    same = "def transform(image):\n    return np.ascontiguousarray(image[::-1])\n"
    scale = "SCALE = {}\ndef transform(image):\n    return (image // SCALE).astype(np.uint8)\n"
    keys = [transform_key(in_main(src)) for src in (flip, same, scale.format(2), scale.format(3))]
    assert len(set(keys)) == 4  # code, and the globals the code names
    assert transform_key(in_main(flip)) == keys[0]  # the same code again: the same cache
    bound = "def transform(image, k={}):\n    return (image // k).astype(np.uint8)\n"
    assert transform_key(in_main(bound.format(2))) != transform_key(in_main(bound.format(3)))
    loaders = [ImageLoader(images, "train", cache="node", transform=in_main(src)) for src in (flip, same)]
    with loaders[0] as first, loaders[1] as second:
        assert first.cache.shared.root != second.cache.shared.root
        a, b = batches(first), batches(second)
        assert not all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    with ImageLoader(images, "train", cache="process", transform=in_main(same)) as own:
        assert all(torch.equal(x, y) for x, y in zip(b, batches(own), strict=True))


class Holder:
    """A callable object holding something no description can hold."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, image: np.ndarray) -> np.ndarray:
        return image


def test_an_unkeyable_transform_is_refused_rather_than_shared(images: Path, shm: Path) -> None:
    lock = threading.Lock()
    for transform in (lambda image: image.copy() if not lock.locked() else image, Holder()):
        with pytest.raises(ConfigError, match=r"cache 'node' .* cannot be described .*use cache='process'"):
            ImageLoader(images, "train", cache="node", transform=transform)
    assert list(shm.iterdir()) == []
    offset = 3  # a lambda that closes over plain values is keyed by them
    keyed = [transform_key(lambda image, k=k: image + offset + k) for k in (1, 2)]
    assert keyed[0] != keyed[1]


def test_cleanup_removes_only_this_users_folders(shm: Path) -> None:
    mine = shm / f"raykit-node-{os.getuid()}-stale"
    theirs_by_name = shm / f"raykit-node-{OTHER_UID}-stale"
    old_format = shm / "raykit-node-0123456789abcdef01234567"
    for folder in (mine, theirs_by_name, old_format):
        folder.mkdir(mode=0o700)
        (folder / "users").touch(mode=0o600)  # unlocked: nobody holds them
    NodeImageCache("sweeper", 1 << 20, entry).close()
    assert not mine.exists()  # this user's own stale folder goes
    assert theirs_by_name.exists() and old_format.exists()
    disguised = shm / f"raykit-node-{os.getuid()}-disguised"  # our name, another user's folder
    disguised.mkdir(mode=0o700)
    (disguised / "users").touch(mode=0o600)
    as_other_user(disguised)
    assert sweep_stale() == [] and node_cache_root() == shm
    assert sorted(p.name for p in disguised.iterdir()) == ["users"]
