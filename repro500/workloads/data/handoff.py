"""Handing large samples from DataLoader workers to the training process without copying them.

A full-resolution EWA sample is 56.6 MB.  Read the usual way in a DataLoader worker it is
copied from the page cache into the worker's memory, then into shared memory for the trip to
the training process, whose pages have to be allocated, mapped and freed again for every
sample: on a 2-core machine that costs three times the CPU of the read itself (the figures
are in docs/data.md).  A sample stored as plain native float32 in its file
(:func:`h5files.sample_offset`) needs none of it.  :func:`file_tensor` maps the sample's bytes
in the page cache as a private, copy-on-write mapping (writing to the tensor never changes
the file).  Inside a DataLoader worker the tensor travels as the file's descriptor and the
sample's address, passed the way torch passes shared memory (``multiprocessing.reduction.DupFd``),
and the training process maps the same pages: nothing is copied.  The pages are read once, by
whatever first reads the tensor (the detection model's normalisation).  What stays in the
worker is the part that can wait on a disk: it asks the kernel for the sample's pages
(``MADV_POPULATE_READ``) before the sample is handed over, so a file that is not in the page
cache is read ahead in the workers, not in the training step.

Where the bytes cannot be mapped (the file's filesystem does not support it, or the sample's
address is not 4-byte aligned) they are read with ``pread`` into a tensor (in shared memory
inside a worker, as torch's collate would allocate it).  :func:`empty_tensor` gives such a
tensor, for h5py to read a sample HDF5 has to decode.

A file truncated after it was opened is one clear error (InvalidInput) when a sample past its
new end is asked for.  Truncating a file while samples mapped from it are still in use gets
the process killed by SIGBUS, as with any memory-mapped reader: replace data files by writing
a new file and renaming it (``repro500 data generate`` does), never in place.
"""

from __future__ import annotations

import math
import mmap
import os
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any

import torch
from torch.utils.data import get_worker_info

from repro500.errors import InvalidInput

# Linux >= 5.14: fault the range's pages in (reading them from disk first where needed).
# Python's mmap module has no name for it before 3.13.
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)


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
    (truncated since it was opened): InvalidInput, never a short or garbage tensor.  In a
    DataLoader worker the tensor's pages are in the page cache when this returns, and it is
    handed to the training process as a mapping of the same file (module docstring).
    """
    worker = get_worker_info() is not None
    tensor = _mapped(fd, offset, shape, name, populate=worker)
    if tensor is None:
        return _read(fd, offset, shape, name)
    if not worker:
        return tensor
    sample = tensor.as_subclass(_FileSample)
    sample._file = (fd, offset, shape, name, sample._version)
    return sample


class _FileSample(torch.Tensor):
    """A worker's tensor mapped from a data file; pickled for the trip to the training process
    as (descriptor, address, shape), it arrives there as a plain tensor mapped from the same
    pages.  Any operation on it returns a plain tensor (torch function dispatch is off).  Once
    changed in place by torch (its version counter moved), it no longer matches the file and
    travels the usual way, in shared memory.  Writes that bypass torch (through ``.numpy()``)
    are not seen: a worker-side transform must not change the sample through numpy in place."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    _file: tuple[int, int, tuple[int, ...], str, int]

    def __reduce_ex__(self, protocol: int) -> Any:
        # any pickler other than the DataLoader's gets the values, not a file descriptor
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)


def _reduce_file_sample(sample: _FileSample) -> Any:
    fd, offset, shape, name, version = sample._file
    if sample._version != version:  # changed in place in the worker
        return torch.multiprocessing.reductions.reduce_tensor(sample.as_subclass(torch.Tensor))
    return _rebuild, (DupFd(fd), offset, shape, name)


def _rebuild(dup: Any, offset: int, shape: tuple[int, ...], name: str) -> torch.Tensor:
    fd = dup.detach()
    try:
        tensor = _mapped(fd, offset, shape, name, populate=False)
        return tensor if tensor is not None else _read(fd, offset, shape, name)
    finally:
        os.close(fd)


# The queues between DataLoader workers and the training process pickle with ForkingPickler.
ForkingPickler.register(_FileSample, _reduce_file_sample)


def _mapped(fd: int, offset: int, shape: tuple[int, ...], name: str, *, populate: bool) -> torch.Tensor | None:
    """The sample mapped copy-on-write from the file, or None where it cannot be mapped."""
    nbytes = math.prod(shape) * 4
    if os.fstat(fd).st_size < offset + nbytes:
        raise _truncated(name, offset, nbytes)  # touching a page past the end would be SIGBUS
    if offset % 4 or nbytes == 0:
        return None
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        region = mmap.mmap(fd, offset - start + nbytes, flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
    except OSError:
        return None
    if populate:
        try:
            region.madvise(_MADV_POPULATE_READ)
        except OSError:  # a kernel before 5.14: start reading, without waiting
            region.madvise(mmap.MADV_WILLNEED)
    # torch.frombuffer keeps the mmap object alive as long as the tensor or a view of it lives
    flat = torch.frombuffer(region, dtype=torch.float32, count=nbytes // 4, offset=offset - start)
    return flat.view(shape)


def _read(fd: int, offset: int, shape: tuple[int, ...], name: str) -> torch.Tensor:
    tensor = empty_tensor(shape)
    nbytes = math.prod(shape) * 4
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
