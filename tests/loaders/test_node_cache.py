"""``ImageLoader(cache="node")``: one decoded-image cache per machine, real processes and real kills.

Every test points ``RAYKIT_NODE_CACHE_DIR`` at its own folder, which the child processes inherit.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from raykit.converters import convert
from raykit.errors import ConfigError
from raykit.loaders import ImageLoader
from raykit.loaders.node_cache import NODE_CACHE_PREFIX, NodeImageCache

DATA = Path(__file__).resolve().parents[1] / "data" / "plant_capture"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ten plant photos at 1/4 (160 x 128) in an images-layout store."""
    out = tmp_path_factory.mktemp("node") / "plant.zarr"
    with pytest.warns(Warning, match="scaled uniformly"):
        convert(DATA, out, layout="images", downscale=4, progress=False)
    return out


def caches(shm: Path) -> list[Path]:
    return sorted(shm.glob(NODE_CACHE_PREFIX + "*"))


def batches(loader: ImageLoader, epochs: int) -> list[tuple[tuple[str, ...], torch.Tensor]]:
    return [(b.names, b.images.clone()) for _ in range(epochs) for b in loader]


def test_same_batches_and_state_as_a_process_cache(store: Path, shm: Path) -> None:
    for world_size in (1, 2):
        for rank in range(world_size):
            options = {"seed": 4, "world_size": world_size, "rank": rank, "batch_size": 2, "crop": (64, 64)}
            with (
                ImageLoader(store, "train", **options) as own,
                ImageLoader(store, "train", cache="node", **options) as node,
            ):
                want, got = batches(own, 2), batches(node, 2)
                assert [n for n, _ in want] == [n for n, _ in got]
                assert all(torch.equal(a, b) for (_, a), (_, b) in zip(want, got, strict=True))
                assert own.state_dict() == node.state_dict()
    assert caches(shm) == []  # the last user removed it


def test_a_second_loader_decodes_nothing(store: Path, shm: Path) -> None:
    with ImageLoader(store, "train", cache="node") as first:
        batches(first, 1)
        with ImageLoader(store, "train", cache="node", seed=9) as second:
            batches(second, 2)
            assert second.cache.shared.decoded == 0
            assert first.cache.shared.decoded == first.cache_stats().items == len(first)
        assert len(caches(shm)) == 1
    assert caches(shm) == []


def test_bad_cache_is_one_line(store: Path) -> None:
    with pytest.raises(ConfigError, match=r"cache: expected 'process' or 'node', got 'disk'"):
        ImageLoader(store, "train", cache="disk")


RANK = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from raykit.loaders import ImageLoader
    store, rank, world, meet = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])

    def barrier(word):  # what torchrun's ranks do around training: meet, then go on
        (meet / f"{word}-{rank}").touch()
        while len(list(meet.glob(f"{word}-*"))) < world:
            time.sleep(0.02)

    with ImageLoader(store, "train", cache="node", rank=rank, world_size=world, seed=1) as loader:
        barrier("start")
        names = [list(b.names) for _ in range(3) for b in loader]
        barrier("end")
        print(json.dumps({"names": names, "decoded": loader.cache.shared.decoded}))
    """
)


def test_ranks_in_processes_decode_each_image_once_per_machine(
    store: Path, shm: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(store), str(r), "2", str(tmp_path)],
            stdout=subprocess.PIPE,
            env=env,
        )
        for r in range(2)
    ]
    results = [json.loads(run.communicate(timeout=120)[0]) for run in runs]
    assert all(run.returncode == 0 for run in runs)
    with ImageLoader(store, "train") as loader:
        n = loader.source.n_images
    assert sum(r["decoded"] for r in results) == n  # 3 epochs, 2 ranks: each image decoded once
    epoch0 = [{name for batch in r["names"][: len(r["names"]) // 3] for name in batch} for r in results]
    assert not (epoch0[0] & epoch0[1]) and len(epoch0[0]) == len(epoch0[1]) == n // 2  # disjoint shares
    assert caches(shm) == []


def FOUR(key: object) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of every entry of the caches made directly here."""
    return (4, 4, 3), np.dtype(np.uint8)


HOLDER = textwrap.dedent(
    """
    import sys, time, numpy as np
    from raykit.loaders.node_cache import NodeImageCache
    cache = NodeImageCache("k", 1 << 20, lambda key: ((4, 4, 3), np.dtype(np.uint8)))
    cache.put((1, 0), np.ones((4, 4, 3), np.uint8))
    def stuck():
        (cache.root / f"tmp-{__import__('os').getpid()}-0-1_1.npy").write_bytes(b"half")
        print("decoding", flush=True)
        time.sleep(600)
    cache.get_or_load((1, 1), stuck)
    """
)


def test_a_rank_killed_while_decoding_neither_corrupts_nor_blocks_nor_leaves_the_cache(shm: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, env=env)
    assert child.stdout is not None and child.stdout.readline().strip() == b"decoding"
    survivor = NodeImageCache("k", 1 << 20, FOUR)
    assert survivor.get((1, 0)) is not None  # the child's image is there
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    value = survivor.get_or_load((1, 1), lambda: np.full((4, 4, 3), 7, np.uint8))  # the lock was dropped
    assert int(value[0, 0, 0]) == 7
    again = NodeImageCache("k", 1 << 20, FOUR)  # a new user removes the dead writer's temporary file
    assert list(again.root.glob("tmp-*")) == []
    again.close()
    survivor.close()
    assert caches(shm) == []


def test_a_cache_whose_every_user_was_killed_is_removed_by_the_next(shm: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = HOLDER.replace(
        "cache.get_or_load((1, 1), stuck)", "print('decoding', flush=True); time.sleep(600)"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    assert child.stdout is not None and child.stdout.readline().strip() == b"decoding"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert len(caches(shm)) == 1  # nobody left to remove it
    other = NodeImageCache("another key", 1 << 20, FOUR)
    assert caches(shm) == [other.root]
    other.close()
    assert caches(shm) == []
    shutil.rmtree(shm)


def test_images_layout_rayloader_shares_the_machines_cache(store: Path, shm: Path) -> None:
    from raykit.loaders import RayLoader

    for world_size in (1, 2):
        for rank in range(world_size):
            options = {"batch_size": 512, "seed": 2, "num_workers": 0, "rank": rank, "world_size": world_size}
            with (
                RayLoader(store, "train", **options) as own,
                RayLoader(store, "train", cache="node", **options) as node,
            ):
                want = [b.rgb.clone() for _ in range(2) for b in own]
                got = [b.rgb.clone() for _ in range(2) for b in node]
                assert len(want) == len(got) > 0
                assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
                assert own.state_dict() == node.state_dict()
                assert len(caches(shm)) == 1
    assert caches(shm) == []


def test_node_cache_on_a_rays_split_is_one_line(tmp_path: Path) -> None:
    from raykit.loaders import RayLoader

    with pytest.warns(Warning, match="scaled uniformly"):
        rays = convert(DATA, tmp_path / "rays.zarr", downscale=8, progress=False)
    with pytest.raises(ConfigError, match=r"cache 'node' shares decoded images; split 'train' stores rays"):
        RayLoader(rays, "train", cache="node")


LOOPING = textwrap.dedent(
    """
    import sys
    from raykit.loaders import ImageLoader
    loader = ImageLoader(sys.argv[1], "train", cache="node", rank=1, world_size=2, seed=1)
    for epoch in range(1000):
        for batch in loader:
            print("batch", flush=True)
    """
)


def test_a_loader_rank_killed_mid_epoch_leaves_the_other_ranks_batches_and_no_cache(
    store: Path, shm: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", LOOPING, str(store)], stdout=subprocess.PIPE, env=env)
    assert child.stdout is not None and child.stdout.readline().strip() == b"batch"
    options = {"seed": 1, "rank": 0, "world_size": 2}
    with ImageLoader(store, "train", cache="node", **options) as node:
        first = batches(node, 1)
        os.kill(child.pid, signal.SIGKILL)  # the other rank dies while it reads and writes the cache
        child.wait()
        got = first + batches(node, 2)
    with ImageLoader(store, "train", **options) as own:
        want = batches(own, 3)
    assert [n for n, _ in want] == [n for n, _ in got]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(want, got, strict=True))
    assert caches(shm) == []


def test_an_unusable_cache_folder_is_one_line(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RAYKIT_NODE_CACHE_DIR", str(blocker))
    with pytest.raises(ConfigError, match=r"node cache: .*a file/raykit-node-\d+-\w+: cannot use it"):
        ImageLoader(store, "train", cache="node")


BUDGET = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from raykit.loaders import ImageLoader
    store, me, budget, meet = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])

    def barrier(word):
        (meet / f"{word}-{me}").touch()
        while len(list(meet.glob(f"{word}-*"))) < 2:
            time.sleep(0.02)

    with ImageLoader(store, "train", cache="node", cache_bytes=budget, components=(), seed=me) as loader:
        barrier("start")
        for _ in range(2):
            for batch in loader:
                pass
        barrier("end")  # both have asked for every image twice; neither has left
        stats = loader.cache_stats()
        sizes = [p.stat().st_size for p in loader.cache.shared.root.glob("*.npy")]
        print(json.dumps({"capacity": loader.cache.capacity, "bytes": stats.bytes, "items": stats.items,
                          "sizes": sizes}))
        barrier("measured")
    """
)


def test_one_byte_budget_for_every_process_of_the_machine(store: Path, shm: Path, tmp_path: Path) -> None:
    """docs/loading.md: ``cache="node"`` has one ``cache_bytes`` budget for the machine, not one per
    process: two processes that each want every image keep no more than ``cache_bytes`` together."""
    with ImageLoader(store, "train") as loader:
        h, w, c = loader.source.shape(0)
        n = loader.source.n_images
    budget = int(3.5 * (h * w * c + 128))  # 3 images (with their .npy headers) of the 10
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", BUDGET, str(store), str(me), str(budget), str(tmp_path)],
            stdout=subprocess.PIPE,
            env=env,
        )
        for me in range(2)
    ]
    results = [json.loads(run.communicate(timeout=300)[0]) for run in runs]
    assert all(run.returncode == 0 for run in runs)
    sizes = results[0]["sizes"]
    assert sorted(sizes) == sorted(results[1]["sizes"])  # one folder
    assert all(r["capacity"] == budget for r in results)
    assert sum(sizes) <= budget < sum(sizes) + sizes[0] and len(sizes) == 3 < n  # full, and no more
    assert all(r["bytes"] == sum(sizes) and r["items"] == 3 for r in results)  # the machine's count
    assert caches(shm) == []


ADMITTING = textwrap.dedent(
    """
    import fcntl, time, numpy as np
    from raykit.loaders.node_cache import NodeImageCache
    from raykit.loaders.node_folder import flocked
    cache = NodeImageCache("k", 1 << 20, lambda key: ((4, 4, 3), np.dtype(np.uint8)))
    with flocked(cache._folder, "admit.lock", cache.root, fcntl.LOCK_EX):
        print("admitting", flush=True)
        time.sleep(600)
    """
)


def test_a_process_killed_while_admitting_does_not_wedge_the_next(shm: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", ADMITTING], stdout=subprocess.PIPE, env=env)
    assert child.stdout is not None and child.stdout.readline().strip() == b"admitting"
    cache = NodeImageCache("k", 1 << 20, FOUR)
    lock = os.open(cache.root / "admit.lock", os.O_RDWR)
    with pytest.raises(BlockingIOError):  # the child holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(lock)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    cache.put((1, 0), np.full((4, 4, 3), 3, np.uint8))  # the kernel dropped the dead holder's lock
    assert int(cache.get((1, 0))[0, 0, 0]) == 3
    cache.close()
    assert caches(shm) == []
