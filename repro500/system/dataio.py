"""``repro500 io``: read throughput of repro500's data formats (the NERSC BoF's I/O bottleneck).

The data: ``repro500 data generate classification`` samples (uint8 images, channels first), in
a scratch directory, written once per process in every layout compared:

* ``chunked``: what the generator writes (chunks of about 256 KiB of samples);
* ``contiguous``: the same bytes unchunked (how many real data sets are stored);
* ``gzip``: chunked and compressed as ``--compression gzip`` writes it (level 4, byte shuffle);

each as one file or as several files holding consecutive samples.  Each configuration reads
every sample once through a torch DataLoader over a per-sample HDF5 reader (files opened lazily
in each worker, as the trainer's loaders do for data too large to hold in memory):
sequential order, random order with replacement, or a shuffled epoch (a permutation), with 0
(the main process) to N worker processes, from a cold or a warm page cache.

Cold: every file's pages are dropped with ``posix_fadvise(POSIX_FADV_DONTNEED)`` (the files were
synced when written, so their pages are clean) and ``mincore`` checks what stayed resident; the
record says how cold the read really was.  The machine-wide ``/proc/sys/vm/drop_caches`` is not
written: on a shared machine it would slow everyone's work (a file's own pages are enough).

The raw read of the same bytes (``os.read`` of each file, 4 MiB at a time, cold and warm) is
the ceiling a format is compared with.  Correctness: every sample delivered is checked against
the generator's (an integer sum per sample, which no reordering changes): ``read_mismatches``
must be 0, the recipe's acceptance.
"""

from __future__ import annotations

import atexit
import ctypes
import mmap
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.capture.hardware import usable_cpus
from repro500.errors import UsageError

FORMATS = ("contiguous", "chunked", "gzip")
ACCESS = ("sequential", "random", "shuffled")
CACHES = ("cold", "warm")
CHUNK_BYTES = 256 * 1024
READ_BLOCK = 4 << 20
_prepared: dict[tuple[Any, ...], Path] = {}


@dataclass
class IoConfig:
    samples: int = 2048
    size: str = "128x128"
    formats: list[str] = field(default_factory=lambda: list(FORMATS))
    files: list[int] = field(default_factory=lambda: [1, 4])
    access: list[str] = field(default_factory=lambda: list(ACCESS))
    workers: list[int] = field(default_factory=lambda: sorted({0, min(4, usable_cpus())}))
    caches: list[str] = field(default_factory=lambda: list(CACHES))
    batch_size: int = 32
    scratch: str | None = None

    @classmethod
    def from_recipe(cls, system: dict[str, Any], mutable: dict[str, Any]) -> IoConfig:
        if int(mutable.get("nproc") or 1) > 1:
            raise UsageError("repro500 io reads with DataLoader workers on one process; leave --nproc out")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(system) - known)
        if unknown:
            raise UsageError(f"unknown io option(s) {unknown}; known: {', '.join(sorted(known))}")
        return cls(**system)

    def ids(self) -> list[tuple[str, int, str, int, str]]:
        return [(f, n, a, w, c) for f in self.formats for n in self.files for a in self.access
                for w in self.workers for c in self.caches]


def config_id(fmt: str, files: int, access: str, workers: int, cache: str) -> str:
    return f"{fmt}.{files}f.{access}.w{workers}.{cache}"


def check(config: IoConfig) -> list[str]:
    for name, values, allowed in (("format", config.formats, FORMATS), ("access", config.access, ACCESS),
                                  ("cache", config.caches, CACHES)):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            raise UsageError(f"unknown {name} {bad[0] if bad else '(none given)'!r}; known: {', '.join(allowed)}")
    if config.samples < 1 or config.batch_size < 1 or any(n < 1 for n in config.files) or any(w < 0 for w in config.workers):
        raise UsageError("samples, batch size and file counts must be at least 1, workers at least 0")
    if any(n > config.samples for n in config.files):
        raise UsageError(f"more files than samples ({max(config.files)} > {config.samples})")
    from repro500.data.classification import parse_size

    try:
        parse_size(config.size)
    except ValueError as err:
        raise UsageError(f"--image-size: {err}") from None
    names = ["read_mismatches"]
    for fmt, files, access, workers, cache in config.ids():
        prefix = config_id(fmt, files, access, workers, cache)
        names += [f"{prefix}.bytes_per_s", f"{prefix}.samples_per_s"]
    names += [f"raw.{fmt}.{files}f.{cache}.bytes_per_s" for fmt in config.formats for files in config.files
              for cache in config.caches]
    return names


def acceptance(config: IoConfig) -> dict[str, dict[str, Any]]:
    return {"read_mismatches": {"target": 0.0, "direction": "lower", "tolerance": 0.0}}


# ----- the files ------------------------------------------------------------------------------
def prepare(config: IoConfig, seed: int) -> Path:
    """The scratch directory holding every layout (written once per process, removed at exit)."""
    key = (config.samples, config.size, tuple(config.formats), tuple(config.files), seed, config.scratch)
    if key in _prepared and _prepared[key].is_dir():
        return _prepared[key]
    import h5py
    import numpy as np

    from repro500.data.generate import generate

    root = Path(tempfile.mkdtemp(prefix="repro500-io-", dir=config.scratch))
    atexit.register(shutil.rmtree, root, True)
    source = root / "generated.h5"
    generate("classification", source, samples=config.samples, seed=seed, size=config.size)
    with h5py.File(source, "r") as h5:
        images = h5["images"][()]
    per_chunk = max(1, CHUNK_BYTES // int(np.prod(images.shape[1:])))
    layouts = {"contiguous": {}, "chunked": {"chunks": True},
               "gzip": {"chunks": True, "compression": "gzip", "compression_opts": 4, "shuffle": True}}
    for fmt in config.formats:
        for files in config.files:
            bounds = np.linspace(0, len(images), files + 1).astype(int)
            folder = root / f"{fmt}-{files}"
            folder.mkdir()
            for i in range(files):
                part = images[bounds[i]:bounds[i + 1]]
                path = folder / f"part-{i:03d}.h5"
                opts = dict(layouts[fmt])
                if opts.get("chunks"):
                    opts["chunks"] = (min(per_chunk, len(part)), *part.shape[1:])
                with h5py.File(path, "w") as h5:
                    h5.create_dataset("images", data=part, **opts)
                with open(path, "rb+") as fh:  # clean pages: posix_fadvise can then drop them
                    os.fsync(fh.fileno())
    np.save(root / "sums.npy", images.reshape(len(images), -1).astype(np.int64).sum(axis=1))
    source.unlink()
    _prepared[key] = root
    return root


def resident_fraction(path: Path) -> float | None:
    """The share of the file's pages in the page cache (``mincore``), None where it cannot be asked."""
    size = path.stat().st_size
    if size == 0:
        return 0.0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        # a private (copy-on-write) mapping is writable for ctypes, and maps the file's cached pages
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY) as mm:
            anchor = ctypes.c_ubyte.from_buffer(mm)
            status = libc.mincore(ctypes.addressof(anchor), size, vec)
            del anchor  # the mapping must not stay exported when it closes
        return None if status != 0 else sum(v & 1 for v in vec) / pages
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def evict(paths: list[Path]) -> dict[str, Any]:
    """Drop the files' pages; how much stayed resident afterwards (mean over the files)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped until they are written back
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    fractions = [resident_fraction(p) for p in paths]
    known = [f for f in fractions if f is not None]
    return {"method": "posix_fadvise(POSIX_FADV_DONTNEED)",
            "resident_after": sum(known) / len(known) if known else None}


# ----- reading --------------------------------------------------------------------------------
class H5Samples:
    """Sample i of consecutive files, read one at a time; files opened lazily in each process."""

    def __init__(self, paths: list[Path]) -> None:
        import h5py

        self.paths = [str(p) for p in paths]
        self.counts = []
        for path in self.paths:
            with h5py.File(path, "r", locking=False) as h5:
                self.counts.append(int(h5["images"].shape[0]))
        self.starts = [sum(self.counts[:i]) for i in range(len(self.counts))]
        self._open: dict[int, Any] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return sum(self.counts)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import bisect

        import h5py
        import torch

        if os.getpid() != self._pid:  # a DataLoader worker: its own handles, never its parent's
            self._open, self._pid = {}, os.getpid()
        k = bisect.bisect_right(self.starts, index) - 1
        if k not in self._open:
            # no HDF5 file lock: these files are never written while read, and a lock that another
            # process's handle holds (a worker forked while this one had the file open) refused opens
            self._open[k] = h5py.File(self.paths[k], "r", locking=False)
        return torch.from_numpy(self._open[k]["images"][index - self.starts[k]]), index

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": {}}


def _sampler(access: str, n: int, seed: int) -> Any:
    import torch
    from torch.utils.data import RandomSampler, SequentialSampler

    if access == "sequential":
        return SequentialSampler(range(n))
    gen = torch.Generator().manual_seed(seed)
    return RandomSampler(range(n), replacement=access == "random", num_samples=n, generator=gen)


def read_epoch(paths: list[Path], access: str, workers: int, batch_size: int, seed: int, sums: Any) -> dict[str, Any]:
    """One pass over every sample (as many draws with replacement): throughput and mismatches."""
    import torch
    from torch.utils.data import DataLoader

    dataset = H5Samples(paths)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=_sampler(access, len(dataset), seed),
                        num_workers=workers)
    delivered, mismatches = 0, 0
    started = time.perf_counter()
    for images, indices in loader:
        got = images.reshape(len(images), -1).to(torch.int64).sum(dim=1)
        mismatches += int((got != torch.from_numpy(sums[indices.numpy()])).sum())
        delivered += images.numel() * images.element_size()
    elapsed = time.perf_counter() - started  # worker start-up included: a training epoch pays it too
    return {"seconds": elapsed, "bytes": delivered, "samples": len(dataset),
            "bytes_per_s": delivered / elapsed, "samples_per_s": len(dataset) / elapsed, "mismatches": mismatches}


def raw_read(paths: list[Path]) -> dict[str, Any]:
    """The files' bytes read in order with os.read, no decoding: the ceiling of any format."""
    total, started = 0, time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while chunk := os.read(fd, READ_BLOCK):
                total += len(chunk)
        finally:
            os.close(fd)
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "bytes": total, "bytes_per_s": total / elapsed if elapsed > 0 else None}


def _warm(paths: list[Path]) -> None:
    raw_read(paths)


def run(config: IoConfig, seed: int, *, first: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    import numpy as np

    root = prepare(config, seed)
    sums = np.load(root / "sums.npy")
    metrics: dict[str, Any] = {}
    configs, raws, colder = [], [], []
    for fmt in config.formats:
        for files in config.files:
            paths = sorted((root / f"{fmt}-{files}").glob("*.h5"))
            for cache in config.caches:
                state = evict(paths) if cache == "cold" else (_warm(paths) or {"method": "read once before"})
                raw = {"id": f"raw.{fmt}.{files}f.{cache}", **raw_read(paths), "cache": state,
                       "file_bytes": sum(p.stat().st_size for p in paths)}
                raws.append(raw)
                metrics[f"{raw['id']}.bytes_per_s"] = raw["bytes_per_s"]
                for access in config.access:
                    for workers in config.workers:
                        state = evict(paths) if cache == "cold" else (_warm(paths) or {"method": "read once before"})
                        if cache == "cold" and (state.get("resident_after") or 0) > 0.1:
                            colder.append(config_id(fmt, files, access, workers, cache))
                        got = read_epoch(paths, access, workers, config.batch_size, seed, sums)
                        ident = config_id(fmt, files, access, workers, cache)
                        got.update(id=ident, format=fmt, files=files, access=access, workers=workers, cache=cache,
                                   cache_state=state, file_bytes=raw["file_bytes"],
                                   of_raw=got["bytes_per_s"] / raw["bytes_per_s"] if raw["bytes_per_s"] else None)
                        configs.append(got)
                        metrics[f"{ident}.bytes_per_s"] = got["bytes_per_s"]
                        metrics[f"{ident}.samples_per_s"] = got["samples_per_s"]
    metrics["read_mismatches"] = sum(c["mismatches"] for c in configs)
    notes = [f"cold cache not reached for {', '.join(colder[:5])} (pages stayed resident)"] if colder else []
    doc = {"measure": "io", "samples": config.samples, "image_size": config.size, "batch_size": config.batch_size,
           "scratch": str(root.parent), "configs": configs, "raw": raws, "notes": notes}
    return metrics, doc
