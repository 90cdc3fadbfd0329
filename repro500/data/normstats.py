"""Per-channel normalisation statistics: accumulated while generating, computed for real files.

Both paths use :class:`Moments` on the same strided sub-sample of each sample (at most
``MAX_VALUES_PER_CHANNEL`` values per channel), so a generated file's stored statistics and
the statistics the loader computes for a file without them are the same estimator.

Generated files carry ``channel_mean``, ``channel_std`` and ``stats_samples`` attributes on
the dataset they describe.  Files without them (the real ``climo_YYYY.h5``) get statistics
from up to ``STATS_SAMPLES`` evenly spaced samples, cached as JSON under
``repro500.capture.cache.cache_dir("data-stats")`` keyed by the file's path, size, inode and
modification time, so the scan happens once per file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from repro500.capture.cache import cache_dir
from repro500.rundir import atomic

MAX_VALUES_PER_CHANNEL = 65536
STATS_SAMPLES = 16


@dataclass
class Moments:
    """Running per-channel sums (float64) for a mean and a standard deviation."""

    total: np.ndarray | None = None
    total_sq: np.ndarray | None = None
    count: int = 0
    samples: int = 0
    _step: dict[tuple[int, ...], int] = field(default_factory=dict, repr=False)

    def add(self, sample: np.ndarray, axis: int) -> None:
        """Add one sample whose channel axis is ``axis``."""
        a = np.moveaxis(sample, axis, 0)
        rest = a.shape[1:]
        step = self._step.get(rest)
        if step is None:
            n = math.prod(rest)
            step = max(1, int((n / MAX_VALUES_PER_CHANNEL) ** (1.0 / max(len(rest), 1))))
            self._step[rest] = step
        sub = a[(slice(None),) + (slice(None, None, step),) * len(rest)]
        sub = sub.reshape(a.shape[0], -1).astype(np.float64)
        s, sq = sub.sum(axis=1), np.einsum("ij,ij->i", sub, sub)
        if self.total is None:
            self.total, self.total_sq = s, sq
        else:
            self.total += s
            self.total_sq += sq
        self.count += sub.shape[1]
        self.samples += 1

    def mean_std(self) -> tuple[list[float], list[float]]:
        if self.total is None or self.count == 0:
            raise ValueError("no samples were added")
        mean = self.total / self.count
        var = np.maximum(self.total_sq / self.count - mean * mean, 0.0)
        return mean.tolist(), np.sqrt(var).tolist()


def pool(stats: list[tuple[list[float], list[float], int]]) -> tuple[np.ndarray, np.ndarray]:
    """Combine (mean, std, samples) of several files into one mean and std per channel."""
    weights = np.array([n for _, _, n in stats], dtype=np.float64)
    means = np.array([m for m, _, _ in stats], dtype=np.float64)
    stds = np.array([s for _, s, _ in stats], dtype=np.float64)
    w = weights[:, None] / weights.sum()
    mean = (w * means).sum(axis=0)
    second = (w * (stds**2 + means**2)).sum(axis=0)
    std = np.sqrt(np.maximum(second - mean**2, 0.0))
    return mean, std


def safe_std(std: np.ndarray) -> np.ndarray:
    """Standard deviations usable as divisors (a constant channel is left unscaled)."""
    std = np.asarray(std, dtype=np.float64)
    return np.where(std > 0, std, 1.0)


def _cache_key(path: Path, dataset: str, axis: int) -> str:
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_ino}|{st.st_mtime_ns}|{dataset}|{axis}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def file_stats(path: Path, h5: Any, dataset: str, axis: int) -> tuple[list[float], list[float], int]:
    """(mean, std, samples) per channel of ``dataset`` in an open file; axis is within a sample."""
    dset = h5[dataset]
    if "channel_mean" in dset.attrs and "channel_std" in dset.attrs:
        n = int(dset.attrs.get("stats_samples", dset.shape[0]))
        return list(dset.attrs["channel_mean"]), list(dset.attrs["channel_std"]), max(n, 1)

    cache_file = cache_dir("data-stats") / f"{_cache_key(path, dataset, axis)}.json"
    if cache_file.is_file():
        try:
            cached = json.loads(cache_file.read_text())
            return cached["mean"], cached["std"], int(cached["samples"])
        except (ValueError, KeyError):
            pass  # a damaged cache entry is recomputed below
    moments = Moments()
    n = dset.shape[0]
    for i in np.unique(np.linspace(0, n - 1, num=min(n, STATS_SAMPLES)).round().astype(int)):
        moments.add(np.asarray(dset[int(i)]), axis)
    mean, std = moments.mean_std()

    with contextlib.suppress(OSError):  # an unwritable cache only costs the scan next time
        atomic.write_json(cache_file, {"path": str(path), "mean": mean, "std": std, "samples": n})
    return mean, std, n
