"""Recycled CPU batch buffers for :class:`~raykit.loaders.ImageLoader` (``BufferPool``).

A float batch of a 1080p image is 25-33 MB. Made by ``torch.empty`` it comes from the C heap, and
once freed it stays in the heap of the thread that made it until the next trim (glibc raises its mmap
threshold to the largest buffer freed, up to 32 MB): each rank of a node-cache run held about 50 MB of
freed batches (``benchmarks/bench_node.py``, BENCHMARKS.md). Made as its own anonymous mapping,
unmapped when freed, it pays fresh page faults and the kernel's zeroing of every page at every batch:
the cached loader ran 1.5-2.7x slower. A pool keeps both wins: each buffer is an anonymous mapping
(never in the heap), and a batch's buffer goes back to the pool when the last view of the batch is
gone (its tensors, their views and numpy views of them), to be filled again by a later batch; the pool
keeps at most ``keep`` free buffers and unmaps the rest, so its memory is the batches in flight plus
``keep``.

How the pool sees the last view go: the batch's tensor is ``torch.from_numpy`` of an array whose base
is a :class:`_Lease` (an ``__array_interface__`` over the pooled mapping); torch holds that array
until the tensor's storage is freed, and the lease's finaliser hands the mapping back.
"""

from __future__ import annotations

import mmap
import threading
import weakref
from collections import deque

import numpy as np
import torch

__all__ = ["POOLED_BYTES", "BufferPool"]

POOLED_BYTES = 1 << 20  # buffers at least this large come from the pool; smaller ones from torch.empty


class _Lease:
    """The base of one batch's array: the pooled ``block`` described as an array of ``shape``."""

    __slots__ = ("__array_interface__", "__weakref__", "block")

    def __init__(self, block: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.block = block
        self.__array_interface__ = {
            "shape": shape,
            "typestr": dtype.str,
            "data": (block.ctypes.data, False),
            "version": 3,
        }


class BufferPool:
    """Uninitialised CPU tensors whose memory is recycled once the last view of each is gone.

    Args:
        keep: free buffers kept for reuse (the rest are unmapped).
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._free: deque[np.ndarray] = deque()
        self._lock = threading.Lock()
        self.made = 0  # mappings made (a reused buffer makes none)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape``: a pooled buffer at least :data:`POOLED_BYTES` large
        (returned to the pool when its last view is gone), else a plain ``torch.empty``."""
        np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        nbytes = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        if nbytes < POOLED_BYTES:
            return torch.empty(shape, dtype=dtype)
        block = self._take(nbytes)
        lease = _Lease(block, tuple(shape), np_dtype)
        weakref.finalize(lease, _give_back, weakref.ref(self), block)
        return torch.from_numpy(np.asarray(lease))

    def _take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            for _ in range(len(self._free)):
                block = self._free.popleft()
                if block.nbytes == nbytes:
                    return block
                self._free.append(block)  # another size (another level or crop): kept, oldest first
            self.made += 1
        return np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE), dtype=np.uint8)

    def give_back(self, block: np.ndarray) -> None:
        """Keep ``block`` for reuse (dropping the oldest free buffer beyond ``keep``)."""
        with self._lock:
            self._free.append(block)
            while len(self._free) > self.keep:
                self._free.popleft()

    def clear(self) -> None:
        """Unmap every free buffer (buffers in use come back later, as usual)."""
        with self._lock:
            self._free.clear()

    @property
    def free(self) -> int:
        """Free buffers held."""
        return len(self._free)


def _give_back(pool: weakref.ref[BufferPool], block: np.ndarray) -> None:
    owner = pool()
    if owner is not None:
        owner.give_back(block)
