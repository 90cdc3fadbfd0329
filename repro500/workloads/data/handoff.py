"""Handing large samples from DataLoader workers to the training process cheaply.

A DataLoader worker passes tensors to the main process in shared memory: with torch's
``file_descriptor`` sharing strategy (Linux's default) only a file descriptor travels.  What
costs is making the shared memory.  A full-resolution EWA sample is 56.6 MB, 13,824 pages
of 4 KiB (shared memory gets no huge pages), and writing it through a fresh mapping faults
every page into the worker: about 25 ms a sample on the project's VM, twice the time of
reading the sample from the page cache.  Writing the same bytes with ``pwrite`` into a memfd
fills the pages without mapping them into the worker (about 13 ms); the main process maps
them as it would any shared tensor.

:func:`filled_tensor` builds a float32 tensor plane by plane (along the first axis), so each
plane is computed in a small buffer that stays in the CPU cache and is then written once.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import get_worker_info

PlaneFiller = Callable[[int, np.ndarray], None]

_plane_buffers: dict[tuple[int, ...], np.ndarray] = {}  # per process, reused from sample to sample


def filled_tensor(shape: tuple[int, ...], fill_plane: PlaneFiller) -> torch.Tensor:
    """A float32 tensor of ``shape`` whose plane ``i`` is written by ``fill_plane(i, out)``.

    ``out`` is a writable float32 array of ``shape[1:]``.  In a DataLoader worker the tensor
    lives in shared memory (written with ``pwrite`` where the platform and torch's sharing
    strategy allow it), so handing it to the main process copies nothing.
    """
    if get_worker_info() is None:
        return _filled_in_place(torch.empty(shape, dtype=torch.float32), fill_plane)
    if not _memfd_usable():
        return _filled_in_place(_shared_empty(shape), fill_plane)
    plane = _plane_buffers.get(shape[1:])
    if plane is None:
        plane = _plane_buffers[shape[1:]] = np.empty(shape[1:], dtype=np.float32)
    nbytes = math.prod(shape) * 4
    fd = os.memfd_create("repro500-sample", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        for i in range(shape[0]):
            fill_plane(i, plane)
            _write_at(fd, memoryview(plane).cast("B"), i * plane.nbytes)
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)  # maps it; keeps its own fd
    finally:
        os.close(fd)
    return torch.empty(0, dtype=torch.float32).set_(storage, 0, shape)


def _memfd_usable() -> bool:
    # With the file_system strategy torch would copy an fd-backed storage into its own.
    return (
        hasattr(os, "memfd_create")
        and hasattr(torch.UntypedStorage, "_new_shared_fd_cpu")  # what torch itself rebuilds received tensors with
        and torch.multiprocessing.get_sharing_strategy() == "file_descriptor"
    )


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _shared_empty(shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 tensor in shared memory, as torch's own collate allocates it."""
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * 4)
    return torch.empty(0, dtype=torch.float32).set_(storage, 0, shape)


def _filled_in_place(out: torch.Tensor, fill_plane: PlaneFiller) -> torch.Tensor:
    arr = out.numpy()
    for i in range(arr.shape[0]):
        fill_plane(i, arr[i])
    return out
