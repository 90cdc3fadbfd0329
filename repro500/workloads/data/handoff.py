"""Handing large samples from DataLoader workers to the training process cheaply.

A DataLoader worker passes tensors to the main process in shared memory: with torch's
``file_descriptor`` sharing strategy (Linux's default) only a file descriptor travels.  What
costs is filling the shared memory.  A full-resolution EWA sample is 56.6 MB, 13,824 pages
of 4 KiB (shared memory gets no huge pages); reading it with h5py and letting torch copy it
into shared memory touches every byte three times.  Here a sample stored as plain bytes in
the file goes from the page cache into a memfd in the kernel (``sendfile``): one copy, no
page of it mapped in the worker; the main process maps the memfd as it would any shared
tensor.  What that gains, and what is left (allocating and freeing the shared pages), is
measured by bench/loader.py; the figures are in docs/data.md.

:func:`file_tensor` is that path (with ``pread`` where a memfd cannot be used);
:func:`empty_tensor` gives a tensor for h5py to read into, in shared memory inside a worker.
"""

from __future__ import annotations

import math
import os

import torch
from torch.utils.data import get_worker_info

from repro500.errors import InvalidInput


def empty_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 tensor to read a sample into; in a DataLoader worker it is allocated in shared
    memory, as torch's own collate would, so handing it over copies nothing."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch.float32)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * 4)
    return torch.empty(0, dtype=torch.float32).set_(storage, 0, shape)


def file_tensor(fd: int, offset: int, shape: tuple[int, ...], name: str) -> torch.Tensor:
    """The float32 tensor of ``shape`` stored as native-order bytes at ``offset`` of file ``fd``.

    *name* is the file's path, for the message when the file is shorter than the sample
    (truncated since it was opened): InvalidInput, never a short or garbage tensor.
    """
    nbytes = math.prod(shape) * 4
    if get_worker_info() is not None and _memfd_usable():
        out = os.memfd_create("repro500-sample", os.MFD_CLOEXEC)
        try:
            os.ftruncate(out, nbytes)
            done = 0
            while done < nbytes:
                sent = os.sendfile(out, fd, offset + done, nbytes - done)
                if sent == 0:
                    raise _truncated(name, offset, nbytes)
                done += sent
            # torch's own way of rebuilding a received tensor; it maps the memfd and keeps its own fd
            storage = torch.UntypedStorage._new_shared_fd_cpu(out, nbytes)
        finally:
            os.close(out)
        return torch.empty(0, dtype=torch.float32).set_(storage, 0, shape)
    tensor = empty_tensor(shape)
    view = memoryview(tensor.numpy()).cast("B")
    done = 0
    while done < nbytes:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise _truncated(name, offset, nbytes)
        done += got
    return tensor


def _truncated(name: str, offset: int, nbytes: int) -> InvalidInput:
    return InvalidInput(f"{name}: cannot be read (a sample at byte {offset}, {nbytes} bytes, lies past "
                        "the end of the file): the file is corrupt or truncated")


def _memfd_usable() -> bool:
    # With the file_system strategy torch would copy an fd-backed storage into its own.
    return (
        hasattr(os, "memfd_create")
        and hasattr(torch.UntypedStorage, "_new_shared_fd_cpu")
        and torch.multiprocessing.get_sharing_strategy() == "file_descriptor"
    )
