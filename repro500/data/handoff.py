"""Handing samples from DataLoader workers to the training process without copying them.

A full-resolution EWA sample is 56.6 MB.  Read the usual way in a DataLoader worker it is
copied from the page cache into the worker's memory, then into shared memory for the trip to
the training process, whose pages have to be allocated, mapped and freed again for every
sample: on a 2-core machine that cost 3 to 5 times the CPU of the read itself (the figures are
in docs/data.md).  A sample stored as plain native float32 in its file
(:func:`h5files.sample_offset`) needs none of it.  :func:`file_tensor` maps the sample's bytes
in the page cache as a private, copy-on-write mapping (writing to the tensor never changes
the file).  Inside a DataLoader worker the tensor travels as the file's path and identity and
the sample's address, and the training process maps the same pages from its own descriptor of
the file (opened once): nothing is copied.  The pages are read once, by whatever first reads
the tensor (the detection model's normalisation).  What stays in the worker is the part that
can wait on a disk: it pages the sample in (``MADV_POPULATE_READ``, Linux 5.14+) before the
sample is handed over, so a file that is not in the page cache is read in the workers, not in
the training step.

torch's own hand-over passes every tensor, however small, as a file descriptor, which costs a
round trip to the worker each; :func:`inline` marks small tensors (a sample's boxes and
labels) to travel as their values instead.

A worker's sample that was changed there (in place, by torch or through numpy) no longer
matches the file: it travels the usual way, in shared memory.  Where the bytes cannot be mapped
(the filesystem does not support it, or the sample's address is not 4-byte aligned) they are
read with ``pread`` into a tensor (in shared memory inside a worker, as torch's collate would
allocate it).  :func:`empty_tensor` gives such a tensor, for h5py to read a sample HDF5 has to
decode.

A mapped sample follows its file while it lives.  A file truncated after it was opened is one
clear error (InvalidInput) when a sample past its new end is asked for, and a file replaced
under the same path while a worker still reads the old one is an error in the training
process; but truncating a file while samples mapped from it are in use gets the process killed
by SIGBUS, and writing into the file in place changes samples already loaded, as with any
memory-mapped reader.  Replace data files by writing a new file and renaming it
(``repro500 data generate`` does), never in place.
"""

from __future__ import annotations

import copy
import errno
import math
import mmap
import os
import sys
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch
from torch.multiprocessing.reductions import reduce_tensor
from torch.utils.data import get_worker_info

from repro500.errors import InvalidInput

# Linux >= 5.14: fault the range's pages in, reading them from the disk first where needed.
# Python's mmap module has no name for it before 3.13.
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22) if sys.platform.startswith("linux") else None


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
    info = os.fstat(fd)
    sample = tensor.as_subclass(_FileSample)
    sample._file = (os.path.abspath(name), (info.st_dev, info.st_ino), offset, shape, sample._version)
    return sample


def inline(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, marked inside a DataLoader worker to reach the training process as its values
    (pickled bytes) rather than as shared memory: for small tensors, where torch's file
    descriptor round trip costs more than the bytes."""
    if get_worker_info() is None:
        return tensor
    return tensor.as_subclass(_Inline)


class _WorkerTensor(torch.Tensor):
    # Any operation on a worker's marked tensor returns a plain tensor (torch function dispatch
    # is off); pickles other than the DataLoader's, and deep copies, see a plain tensor.
    __torch_function__ = torch._C._disabled_torch_function_impl

    def __reduce_ex__(self, protocol: int) -> Any:
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        return copy.deepcopy(self.as_subclass(torch.Tensor), memo)


class _FileSample(_WorkerTensor):
    """A worker's tensor mapped from a data file, pickled for the DataLoader's queue as
    (path, identity, address, shape); it arrives as a plain tensor mapped from the same pages."""

    _file: tuple[str, tuple[int, int], int, tuple[int, ...], int]


class _Inline(_WorkerTensor):
    """A worker's small tensor, pickled for the DataLoader's queue as its values."""


def _reduce_file_sample(sample: _FileSample) -> Any:
    path, identity, offset, shape, version = sample._file
    plain = sample.as_subclass(torch.Tensor)
    if sample._version != version or _written(plain):  # no longer the file's bytes
        return reduce_tensor(plain)
    return _rebuild, (path, identity, offset, shape)


def _reduce_inline(tensor: _Inline) -> Any:
    return torch.from_numpy, (tensor.as_subclass(torch.Tensor).numpy(),)


def _rebuild(path: str, identity: tuple[int, int], offset: int, shape: tuple[int, ...]) -> torch.Tensor:
    fd = _files.fd(path, identity)
    tensor = _mapped(fd, offset, shape, path, populate=False)
    return tensor if tensor is not None else _read(fd, offset, shape, path)


# The queues between DataLoader workers and the training process pickle with ForkingPickler.
ForkingPickler.register(_FileSample, _reduce_file_sample)
ForkingPickler.register(_Inline, _reduce_inline)


class _OpenFiles:
    """The training process's read-only descriptors of the data files its workers map samples
    from, one per file, kept open for the life of the process (a training run reads the same
    files every epoch)."""

    def __init__(self) -> None:
        self._fds: dict[tuple[str, tuple[int, int]], int] = {}
        self._lock = threading.Lock()  # samples may be rebuilt in the pin-memory thread

    def fd(self, path: str, identity: tuple[int, int]) -> int:
        with self._lock:
            fd = self._fds.get((path, identity))
            if fd is None:
                try:
                    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                except OSError as err:
                    raise InvalidInput(f"{path}: cannot be opened ({err.strerror}); was it moved or deleted "
                                       "while being read?") from None
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) != identity:
                    os.close(fd)
                    raise InvalidInput(f"{path} was replaced by another file while it was being read; "
                                       "restart the run on the new file")
                self._fds[(path, identity)] = fd
            return fd


_files = _OpenFiles()


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
        _page_in(region, name, offset, nbytes)
    # torch.frombuffer keeps the mmap object alive as long as the tensor or a view of it lives
    flat = torch.frombuffer(region, dtype=torch.float32, count=nbytes // 4, offset=offset - start)
    return flat.view(shape)


def _page_in(region: mmap.mmap, name: str, offset: int, nbytes: int) -> None:
    """Wait until the mapping's pages are in memory (reading them from the disk if need be)."""
    if _MADV_POPULATE_READ is not None:
        try:
            region.madvise(_MADV_POPULATE_READ)
            return
        except OSError as err:
            if err.errno == errno.EFAULT:  # the file got shorter since it was checked
                raise _truncated(name, offset, nbytes) from None
            if err.errno != errno.EINVAL:
                raise InvalidInput(f"{name}: cannot be read (a sample at byte {offset}: {err.strerror})") from None
    if hasattr(mmap, "MADV_WILLNEED"):  # a kernel before 5.14, or not Linux: start the read, without waiting
        region.madvise(mmap.MADV_WILLNEED)


def _written(tensor: torch.Tensor) -> bool:
    """Whether a page under ``tensor`` was written in this process, so that it holds a private
    copy rather than the file's page.  /proc/self/pagemap gives one 64-bit entry a page: bit 63
    present, 62 swapped, 61 a file page.  torch's version counter misses writes made through
    numpy or ``.data``; this does not."""
    if tensor.nbytes == 0:
        return False
    page = mmap.PAGESIZE
    first = tensor.data_ptr() // page
    last = (tensor.data_ptr() + tensor.nbytes - 1) // page
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:  # not Linux: the version counter is all there is to go by
        return False
    try:
        entries = np.frombuffer(os.pread(fd, (last - first + 1) * 8, first * 8), dtype=np.uint64)
    finally:
        os.close(fd)
    in_memory = (entries >> np.uint64(62)) != 0
    file_page = ((entries >> np.uint64(61)) & np.uint64(1)) == 1
    return bool(np.any(in_memory & ~file_page))


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
