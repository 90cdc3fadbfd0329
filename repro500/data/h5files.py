"""Which HDF5 files make up one split of a data set, and reading them lazily.

A data set path may be a file, a list of files, a directory or a glob pattern.  For a
split (``train`` or ``eval``) the files are chosen in this order:

1. a directory that holds an entry named after the split (``train``; ``eval``, ``val`` or
   ``test``), as a file ``<split>.h5`` / ``.hdf5`` or a sub-directory of files: that entry;
2. otherwise all the files; those that carry a ``split`` attribute (generated files) are
   kept when it matches, and it is an error if files carry one but none match;
3. files without a ``split`` attribute (real data such as ``climo_YYYY.h5``) are split by
   sample: the last ``eval_fraction`` (default 0.1) of their samples, in file order, is
   ``eval`` and the rest ``train``.

Files are ordered by name, except shards of one generated data set (same generator,
seed, split and parameters), which are ordered by their ``sample_offset`` attribute, so
shards read back in the order one pass would have written them; overlapping or repeated
shards are refused.

h5py handles are not fork-safe: :class:`LazyFiles` records only paths and sample counts
when built, and each process (each DataLoader worker) opens its own handles the first time
it reads.  It also keeps a plain read-only file descriptor per file and process, so a sample
stored uncompressed and whole (:func:`sample_offset`) is read with one system call.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from repro500.data.layout import attr_str
from repro500.errors import InvalidInput

SPLIT_NAMES = {"train": ("train",), "eval": ("eval", "val", "test")}
H5_SUFFIXES = (".h5", ".hdf5", ".he5")
DEFAULT_EVAL_FRACTION = 0.1

PathSpec = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def open_h5(path: str | Path) -> Any:
    """Open an HDF5 file read-only; unreadable or corrupt files raise InvalidInput."""
    import h5py

    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise InvalidInput(f"{path} does not exist") from None
    except OSError as err:
        raise InvalidInput(f"{path} is not a readable HDF5 file (corrupt or truncated?): {short_error(err)}") from None


# What h5py raises for damaged metadata: OSError ("bad heap pointer"), KeyError ("Unable
# to synchronously open object (address undefined)") and ValueError/RuntimeError from
# garbled shapes, types or strings, at open, on a dataset lookup or on a read.
H5_ERRORS = (OSError, KeyError, ValueError, RuntimeError)


def short_error(err: BaseException) -> str:
    """The first line of an error message, without KeyError's quotes, at most 200 characters."""
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    text = text.splitlines()[0] if text else type(err).__name__
    return text[:200]


@contextlib.contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Turn h5py's errors inside the block into one InvalidInput sentence naming ``path``."""
    try:
        yield
    except H5_ERRORS as err:
        raise InvalidInput(
            f"{path}: cannot be read ({short_error(err)}): the file is corrupt or truncated"
        ) from None


def _files_in(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in H5_SUFFIXES)


def expand(path: PathSpec) -> list[Path]:
    """Every HDF5 file a path spec names (file, directory, glob, or a list of them)."""
    if isinstance(path, (list, tuple)):
        out: list[Path] = []
        for item in path:
            out.extend(expand(item))
        if not out:
            raise InvalidInput("the list of data files is empty: give at least one HDF5 file")
        return out
    text = os.fspath(path)  # type: ignore[arg-type]
    p = Path(text)
    if p.is_dir():
        files = _files_in(p)
        if not files:
            raise InvalidInput(f"{p} holds no HDF5 files (*.h5, *.hdf5): generate some with `repro500 data generate`")
        return files
    if p.is_file():
        return [p]
    if any(ch in text for ch in "*?["):
        files = [Path(f) for f in sorted(glob.glob(text)) if Path(f).is_file()]
        if not files:
            raise InvalidInput(f"no files match {text}: check the pattern")
        return files
    raise InvalidInput(f"{p} does not exist: check the data path (or generate it with `repro500 data generate`)")


def split_entry(path: PathSpec, split: str) -> Path | None:
    """``<dir>/<split>`` (file or directory) when ``path`` is a directory that has one."""
    if isinstance(path, (list, tuple)):
        return None
    p = Path(os.fspath(path))  # type: ignore[arg-type]
    if not p.is_dir():
        return None
    for name in SPLIT_NAMES[split]:
        if (p / name).is_dir():
            return p / name
        for suffix in H5_SUFFIXES:
            if (p / f"{name}{suffix}").is_file():
                return p / f"{name}{suffix}"
    return None


@dataclass
class FilePart:
    """The samples [start, stop) of one file that belong to the split."""

    path: Path
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def _shard_key(h5: Any) -> tuple[str, ...] | None:
    if "sample_offset" not in h5.attrs or "params" not in h5.attrs:
        return None
    return tuple(
        attr_str(h5, k) or "" for k in ("generator", "generator_version", "seed", "split", "params")
    )


def select(
    path: PathSpec,
    split: str,
    *,
    count: Callable[[Path, Any], int],
    eval_fraction: float = DEFAULT_EVAL_FRACTION,
) -> list[FilePart]:
    """The files and sample ranges of ``split`` (rules in the module docstring).

    ``count(path, h5)`` returns a file's number of samples and raises InvalidInput when
    the file is not in the expected layout (layout.SAMPLE_COUNTERS).
    """
    if split not in SPLIT_NAMES:
        raise InvalidInput(f"unknown split {split!r}: use train or eval")
    entry = split_entry(path, split)
    files = expand(entry if entry is not None else path)
    infos = []
    for f in files:
        with reading(f), open_h5(f) as h5:
            n = count(f, h5)
            infos.append((f, n, attr_str(h5, "split"), _shard_key(h5), int(h5.attrs.get("sample_offset", 0))))
    if entry is None and any(s is not None for _, _, s, _, _ in infos):
        if any(s is None for _, _, s, _, _ in infos):
            raise InvalidInput(
                f"{_describe(path)} mixes generated files (with a split) and files without one: "
                "put them in train/ and eval/ directories"
            )
        found = sorted({s for _, _, s, _, _ in infos})
        infos = [i for i in infos if i[2] == split]
        if not infos:
            raise InvalidInput(
                f"no {split} files in {_describe(path)} (its files are {', '.join(found)} data): "
                f"generate them with `repro500 data generate ... --split {split}`"
            )
    # plain files by name; shards of one generated data set together, by sample offset
    infos.sort(key=lambda i: (i[3] or (), i[4] if i[3] else 0, str(i[0])))
    _refuse_overlaps(infos)
    parts = [FilePart(f, 0, n) for f, n, _, _, _ in infos]
    if entry is None and all(s is None for _, _, s, _, _ in infos):
        parts = _holdout(parts, split, eval_fraction, path)
    if sum(len(p) for p in parts) == 0:
        raise InvalidInput(f"{_describe(path)} has no {split} samples")
    return parts


def _refuse_overlaps(infos: list[tuple[Path, int, Any, Any, int]]) -> None:
    last: dict[tuple[str, ...], tuple[int, Path]] = {}
    for f, n, _, key, offset in infos:
        if key is None:
            continue
        if key in last and offset < last[key][0]:
            raise InvalidInput(
                f"{f} and {last[key][1]} are overlapping shards of the same data set: pass each shard once"
            )
        last[key] = (offset + n, f)


def _holdout(parts: list[FilePart], split: str, eval_fraction: float, path: PathSpec) -> list[FilePart]:
    if not 0.0 < eval_fraction < 1.0:
        raise InvalidInput(f"eval_fraction {eval_fraction} must be between 0 and 1")
    total = sum(len(p) for p in parts)
    n_eval = max(1, int(round(total * eval_fraction)))
    if n_eval >= total:
        raise InvalidInput(f"{_describe(path)} has {total} samples: too few to hold out an eval part")
    cut = total - n_eval  # global index where eval begins
    out, offset = [], 0
    for p in parts:
        lo, hi = offset, offset + len(p)
        a, b = (lo, min(hi, cut)) if split == "train" else (max(lo, cut), hi)
        if b > a:
            out.append(FilePart(p.path, a - offset, b - offset))
        offset = hi
    return out


def _describe(path: PathSpec) -> str:
    if isinstance(path, (list, tuple)):
        return f"the {len(path)} given files"
    return os.fspath(path)  # type: ignore[arg-type]


def sample_offset(dset: Any, j: int) -> int | None:
    """Where sample ``j`` of ``dset`` lies in its file as plain float32 bytes, or None.

    Only where the file holds the sample exactly as numpy would: native-order float32, no
    filters (compression, shuffle, checksums), no external or virtual storage, and the sample
    stored whole, either in a contiguous dataset or as one chunk of one sample.  Anything else
    (and an unwritten chunk) is None: read it through h5py, which converts and decodes.
    """
    dtype = np.dtype(dset.dtype)
    if dtype != np.dtype(np.float32) or dtype.byteorder not in ("=", "|", "<" if np.little_endian else ">"):
        return None
    dcpl = dset.id.get_create_plist()
    if dcpl.get_nfilters() or dset.is_virtual or dcpl.get_external_count():
        return None
    sample_shape = dset.shape[1:]
    if dset.chunks is None:
        base = dset.id.get_offset()
        return None if base is None else int(base) + j * int(np.prod(sample_shape, dtype=np.int64)) * 4
    if dset.chunks == (1, *sample_shape):
        offset = dset.id.get_chunk_info_by_coord((j,) + (0,) * len(sample_shape)).byte_offset
        return None if offset is None else int(offset)
    return None


class LazyFiles:
    """Global sample index -> (open h5py.File, local index), opening files per process."""

    def __init__(self, parts: list[FilePart]) -> None:
        self.parts = parts
        self._ends = np.cumsum([len(p) for p in parts])
        self._handles: dict[int, Any] = {}
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def part_of(self, index: int) -> tuple[int, int]:
        """(part number, sample index within that part's file) of a global sample index."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} is out of range (0..{len(self) - 1})")
        k = int(np.searchsorted(self._ends, index, side="right"))
        before = int(self._ends[k - 1]) if k else 0
        return k, self.parts[k].start + index - before

    def locate(self, index: int) -> tuple[Any, int]:
        k, j = self.part_of(index)
        return self.handle(k), j

    def _own_process(self) -> None:
        if os.getpid() != self._pid:  # forked into a worker: never reuse the parent's handles
            self._handles, self._fds, self._pid = {}, {}, os.getpid()

    def handle(self, k: int) -> Any:
        self._own_process()
        h = self._handles.get(k)
        if h is None:
            h = open_h5(self.parts[k].path)
            self._handles[k] = h
        return h

    def fd(self, k: int) -> int:
        """A read-only file descriptor of part ``k``'s file, for :func:`sample_offset` reads."""
        self._own_process()
        fd = self._fds.get(k)
        if fd is None:
            fd = self._fds[k] = os.open(self.parts[k].path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return fd

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"], state["_fds"] = {}, {}  # handles never travel to another process
        return state

    def close(self) -> None:
        for h in self._handles.values():
            h.close()
        for fd in self._fds.values():
            os.close(fd)
        self._handles, self._fds = {}, {}
