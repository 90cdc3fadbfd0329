"""Write a synthetic data set to HDF5: streaming, sharded, atomic and self-describing.

* Streaming: samples are generated and written one at a time, so memory does not grow
  with the number of samples.
* Sharded: ``shard=(i, K)`` writes the contiguous block of samples
  ``[floor(i N / K), floor((i + 1) N / K))``.  Sample ``j`` depends only on
  (seed, kind, split, parameters, j) (rng.py), so the K shard files, read in shard order,
  hold exactly the arrays of a one-pass file.  Loaders accept the list of shards.
* Atomic: the file is written under a temporary name next to ``out`` and renamed when it is
  complete (repro500.rundir.atomic); an interrupted run leaves no file at ``out``.
* Self-describing: root attributes record the generator, its version, the seed, the split,
  the parameters (JSON), the shard and the sample range; generated datasets carry their
  per-channel normalisation statistics.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from repro500 import __version__
from repro500.data.layout import GENERATOR_PREFIX, KINDS, SPLITS
from repro500.data.normstats import Moments
from repro500.data.progress import progress_bar
from repro500.data.rng import KIND_IDS, SPLIT_IDS
from repro500.data.spec import Generator
from repro500.errors import InvalidInput, ReproError, UsageError
from repro500.rundir import writable
from repro500.rundir.atomic import atomic_path

DEFAULT_SAMPLES = {"ewa": 16, "cosmo": 32, "classification": 1024}
OPTIONS = {  # generator parameters beyond size, seed and split, by kind
    "ewa": {"events_per_sample"},
    "cosmo": {"channels", "voxel_mpc", "mean_count", "fixed_amplitude"},
    "classification": {"classes", "channels", "noise"},
}
COMPRESSIONS = ("none", "gzip", "lzf")
_SMALL_CHUNK_BYTES = 256 * 1024  # small per-sample fields are chunked many samples at a time
# deflate's greatest ratio (a 258-byte match in about 2 bits); LZF's is lower: no compressed file
# of N bytes holds more than this many times N of data
_MAX_COMPRESSION = 1032
RNG_FORMULA = (
    "numpy.random.Generator(PCG64(SeedSequence(entropy=seed, "
    "spawn_key=(kind_id, split_id, sample_index, stream))))"
)


@dataclass
class GenerateResult:
    """What :func:`generate` wrote."""

    path: Path
    kind: str
    samples: int  # written to this file
    sample_offset: int  # index of its first sample in the whole data set
    samples_total: int  # of the whole data set (all shards)
    file_bytes: int
    time_s: float

    @property
    def mb_per_s(self) -> float:
        return self.file_bytes / 1e6 / self.time_s if self.time_s > 0 else float("inf")


def build_generator(
    kind: str,
    *,
    seed: int = 0,
    split: str = "train",
    size: str | None = None,
    options: dict[str, Any] | None = None,
) -> Generator:
    """The generator of ``kind`` with its parameters; bad values raise UsageError."""
    options = dict(options or {})
    if kind not in KINDS:
        raise UsageError(f"unknown data kind {kind!r}: choose one of {', '.join(KINDS)}")
    if split not in SPLITS:
        raise UsageError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
    if seed < 0:
        raise UsageError(f"seed {seed} is negative: use a non-negative integer")
    unknown = sorted(set(options) - OPTIONS[kind])
    if unknown:
        raise UsageError(f"options {unknown} do not apply to {kind} data (it takes {sorted(OPTIONS[kind])})")
    try:
        if kind == "ewa":
            from repro500.data import ewa

            h, w = ewa.parse_size(size)
            if "events_per_sample" in options:
                options["events_per_sample"] = tuple(options["events_per_sample"])
            return ewa.EwaGenerator(ewa.EwaParams(height=h, width=w, **options), seed, split)
        if kind == "cosmo":
            from repro500.data import cosmo

            return cosmo.CosmoGenerator(cosmo.CosmoParams(size=cosmo.parse_size(size), **options), seed, split)
        from repro500.data import classification

        h, w = classification.parse_size(size)
        params = classification.ClassificationParams(height=h, width=w, **options)
        return classification.ClassificationGenerator(params, seed, split)
    except (ValueError, TypeError) as err:
        raise UsageError(f"bad {kind} parameters: {err}") from None


def data_bytes(gen: Generator, samples: int, shard: tuple[int, int] = (0, 1)) -> int:
    """The bytes of sample data this shard of ``samples`` samples holds, uncompressed: computed from
    the generator's shapes alone, so an absurd size is known before a sample is drawn."""
    start, stop = shard_range(samples, *shard)
    return max(0, stop - start) * sum(_sample_bytes(spec) for spec in gen.datasets())


def least_file_bytes(gen: Generator, samples: int, shard: tuple[int, int] = (0, 1), compression: str = "none") -> int:
    """The fewest bytes the file of these samples can have: all their data uncompressed; compressed,
    no filter shrinks data more than deflate's greatest ratio."""
    raw = data_bytes(gen, samples, shard)
    return raw if compression == "none" else raw // _MAX_COMPRESSION


def most_file_bytes(gen: Generator, samples: int, shard: tuple[int, int] = (0, 1)) -> int:
    """The most bytes the file of these samples can need, compressed or not: their data, the padding
    of each dataset's last chunk, and room for HDF5's metadata (attributes, chunk index)."""
    raw = data_bytes(gen, samples, shard)
    padding = sum(max(_SMALL_CHUNK_BYTES, _sample_bytes(spec)) for spec in gen.datasets())
    return raw + padding + raw // 100 + 2**20


def _sample_bytes(spec: Any) -> int:
    return int(np.prod(spec.sample_shape, dtype=object)) * np.dtype(spec.dtype).itemsize


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/K"`` -> (i, K) with 0 <= i < K."""
    head, sep, tail = text.partition("/")
    if not sep or not head.strip().isdigit() or not tail.strip().isdigit():
        raise UsageError(f"shard {text!r} is not i/K (e.g. 0/4 for the first of four shards)")
    i, k = int(head), int(tail)
    if k < 1 or i >= k:
        raise UsageError(f"shard {text!r} is out of range: i/K needs 0 <= i < K")
    return i, k


def shard_range(samples: int, index: int, count: int) -> tuple[int, int]:
    """The contiguous block [start, stop) of shard ``index`` of ``count``."""
    return index * samples // count, (index + 1) * samples // count


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    # The generators' matrix products are small: with several BLAS threads on a busy
    # machine they spend more time synchronising than computing (measured 5x slower).
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # threadpoolctl is optional: only speed depends on it
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


class _Interrupts:
    """Turn SIGINT/SIGTERM into a flag checked between samples, then KeyboardInterrupt.

    A KeyboardInterrupt raised while h5py runs a weakref callback is printed and dropped
    ("Exception ignored in ..."), so Ctrl-C would be lost about half the time; deferring it
    to the loop makes every interrupt stop the run and remove the partial file.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:  # respect an ignored signal
                    self._previous[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def check(self) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _filters(compression: str) -> dict[str, Any]:
    if compression == "none":
        return {}
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": 4, "shuffle": True}
    if compression == "lzf":
        return {"compression": "lzf", "shuffle": True}
    raise UsageError(f"unknown compression {compression!r}: choose one of {', '.join(COMPRESSIONS)}")


def file_attrs(gen: Generator, samples_total: int, start: int, shard: tuple[int, int]) -> dict[str, Any]:
    """The root attributes that make a generated file describe itself."""
    params = gen.params.as_dict()  # type: ignore[attr-defined]
    return {
        "kind": gen.kind,
        "generator": f"{GENERATOR_PREFIX}{gen.kind}",
        "generator_version": gen.version,
        "repro500_version": __version__,
        "seed": gen.seed,
        "split": gen.split,
        "params": json.dumps(params, sort_keys=True),
        "samples_total": samples_total,
        "sample_offset": start,
        "shard": f"{shard[0]}/{shard[1]}",
        "rng": RNG_FORMULA,
        "rng_kind_id": KIND_IDS[gen.kind],
        "rng_split_id": SPLIT_IDS[gen.split],
        **gen.attrs(),
    }


def generate(
    kind: str,
    out: str | Path,
    *,
    samples: int | None = None,
    seed: int = 0,
    split: str = "train",
    size: str | None = None,
    shard: tuple[int, int] = (0, 1),
    compression: str = "none",
    force: bool = False,
    progress: bool = False,
    options: dict[str, Any] | None = None,
    max_bytes: int | None = None,
) -> GenerateResult:
    """Generate ``samples`` samples of ``kind`` (this shard's part of them) into ``out``
    (``max_bytes``: see :func:`write`)."""
    gen = build_generator(kind, seed=seed, split=split, size=size, options=options)
    n = DEFAULT_SAMPLES[kind] if samples is None else samples
    return write(gen, out, samples=n, shard=shard, compression=compression, force=force, progress=progress,
                 max_bytes=max_bytes)


def write(
    gen: Generator,
    out: str | Path,
    *,
    samples: int,
    shard: tuple[int, int] = (0, 1),
    compression: str = "none",
    force: bool = False,
    progress: bool = False,
    max_bytes: int | None = None,
) -> GenerateResult:
    """Stream ``gen``'s samples of this shard into an HDF5 file at ``out``, atomically.

    ``max_bytes`` bounds the file (a reproduction passes the size its publication recorded): an
    uncompressed data set declaring more is refused before a sample is drawn, and writing stops
    (the partial file removed) as soon as the file grows past it, compressed or not.  Either way
    an uncompressed data set, or ``max_bytes``, must fit the free space before anything is written.
    """
    import h5py

    out = Path(out)
    _check_request(out, samples, force)
    filters = _filters(compression)
    start, count = _shard_block(samples, shard)
    _check_room(gen, out, samples, shard, compression, max_bytes)
    specs = gen.datasets()
    t0 = time.perf_counter()
    try:
        with atomic_path(out) as tmp:
            with (
                progress_bar(progress, f"{gen.kind} -> {out.name}", count) as advance,
                h5py.File(tmp, "w") as h5,
            ):
                for key, value in file_attrs(gen, samples, start, shard).items():
                    h5.attrs[key] = value
                dsets = _create_datasets(h5, specs, count, filters)
                moments = _write_samples(gen, specs, dsets, start, count, advance, tmp=tmp, out=out,
                                         max_bytes=max_bytes)
                _store_statistics(dsets, moments)
            if max_bytes is not None:  # HDF5 writes its last chunks and its metadata on close
                _check_growth(tmp, out, max_bytes)
    except OSError as err:
        from repro500.rundir.writable import reason

        raise ReproError(f"could not write {out}: {reason(err)}") from None
    elapsed = time.perf_counter() - t0
    return GenerateResult(
        path=out, kind=gen.kind, samples=count, sample_offset=start, samples_total=samples,
        file_bytes=out.stat().st_size, time_s=elapsed,
    )


def _check_request(out: Path, samples: int, force: bool) -> None:
    """Refuse, before anything is drawn, a data set of no samples or an ``out`` that is not free to write."""
    if samples < 1:
        raise UsageError(f"samples must be at least 1, not {samples}")
    if out.is_dir():
        raise InvalidInput(f"{out} is a directory: give a file name for --out (e.g. {out}/train.h5)")
    if out.exists() and not force:
        raise InvalidInput(f"{out} already exists: pass --force to replace it")


def _shard_block(samples: int, shard: tuple[int, int]) -> tuple[int, int]:
    """(first sample, number of samples) of this shard; an empty shard is refused."""
    start, stop = shard_range(samples, *shard)
    count = stop - start
    if count < 1:
        raise UsageError(f"shard {shard[0]}/{shard[1]} of {samples} samples is empty: use fewer shards")
    return start, count


def _write_samples(gen: Generator, specs: Sequence[Any], dsets: dict[str, Any], start: int, count: int,
                   advance: Callable[[], None], *, tmp: Path, out: Path, max_bytes: int | None) -> dict[str, Moments]:
    """Draw samples ``start`` .. ``start + count - 1`` one at a time into ``dsets``; return the
    running per-channel moments of each array that keeps statistics.  An interrupt, or the file
    at ``tmp`` growing past ``max_bytes``, stops it between samples."""
    moments = {spec.name: Moments() for spec in specs if spec.stats_axis is not None}
    with _one_blas_thread(), _Interrupts() as interrupts:
        for j in range(count):
            interrupts.check()
            sample = gen.sample(start + j)
            for spec in specs:
                dsets[spec.name][j] = sample[spec.name]
                if spec.name in moments:
                    moments[spec.name].add(sample[spec.name], spec.stats_axis)
            if max_bytes is not None:
                _check_growth(tmp, out, max_bytes)
            advance()
        interrupts.check()
    return moments


def _store_statistics(dsets: dict[str, Any], moments: dict[str, Moments]) -> None:
    """Each array's per-channel normalisation statistics, as attributes of its dataset."""
    for name, mom in moments.items():
        mean, std = mom.mean_std()
        dsets[name].attrs["channel_mean"] = mean
        dsets[name].attrs["channel_std"] = std
        dsets[name].attrs["stats_samples"] = mom.samples


def _create_datasets(h5: Any, specs: Sequence[Any], count: int, filters: dict[str, Any]) -> dict[str, Any]:
    """One HDF5 dataset per array of a sample, ``count`` samples long, chunked by small groups of samples."""
    dsets = {}
    for spec in specs:
        per_chunk = max(1, min(count, _SMALL_CHUNK_BYTES // max(_sample_bytes(spec), 1)))
        dsets[spec.name] = h5.create_dataset(
            spec.name,
            shape=(count, *spec.sample_shape),
            dtype=spec.dtype,
            chunks=(per_chunk, *spec.sample_shape),
            fillvalue=spec.fill,
            track_times=False,
            **filters,
        )
    return dsets


def _check_room(gen: Generator, out: Path, samples: int, shard: tuple[int, int], compression: str,
                max_bytes: int | None) -> None:
    """Refuse, before a sample is drawn, a data set that cannot fit ``max_bytes`` or the free space.

    A file that must hold more than ``max_bytes`` (:func:`least_file_bytes`: a 30000x30000 image
    of a publication that recorded 200 kB) is refused here, not after its first sample filled the
    memory; below that, :func:`_check_growth` stops the writing once the file passes ``max_bytes``.
    The free space must hold what the file can need (compressed data is known only by writing it:
    then ``max_bytes`` is what it can need; without one, it is not asked)."""
    least = least_file_bytes(gen, samples, shard, compression)
    if max_bytes is not None and least > max_bytes:
        raise InvalidInput(f"{out}: {samples:,} {gen.kind} samples of these parameters make a file of at least "
                           f"{least:,} bytes, more than the {max_bytes:,} bytes the data it recreates may take: refused "
                           "before generating")
    most = most_file_bytes(gen, samples, shard)
    needed = min(most, max_bytes) if max_bytes is not None else (most if compression == "none" else None)
    free = writable.free_bytes(out)
    if needed is not None and free is not None and needed > free:
        raise InvalidInput(f"{out} may need {needed:,} bytes but its file system has {free:,} free: "
                           "free some space or generate elsewhere")


def _check_growth(tmp: Path, out: Path, max_bytes: int) -> None:
    """Stop as soon as the file being written passes ``max_bytes`` (HDF5 holds up to a chunk per
    dataset in memory, so the check lags the samples by that much at most); the partial file is
    then removed by atomic_path and ``out`` is left as it was."""
    if os.stat(tmp).st_size > max_bytes:
        raise InvalidInput(f"{out} grew past {max_bytes:,} bytes, the most the data it recreates may take: "
                           "stopped and removed (its generator parameters do not describe that data)")
