"""What a synthetic generator writes: one HDF5 dataset per field, one row per sample."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class DatasetSpec:
    """One HDF5 dataset of shape (N, *sample_shape); each sample is one chunk.

    ``stats_axis`` names the channel axis (within a sample) over which per-channel
    normalisation statistics are accumulated while writing; None for no statistics.
    ``fill`` is the value of unused entries (e.g. -1 for padded box rows).
    """

    name: str
    sample_shape: tuple[int, ...]
    dtype: str
    stats_axis: int | None = None
    fill: float | None = None


class Generator(Protocol):
    """A synthetic data set whose sample ``i`` depends only on (seed, kind, split, params, i)."""

    kind: str
    version: int
    seed: int
    split: str

    def datasets(self) -> list[DatasetSpec]: ...

    def attrs(self) -> dict[str, Any]: ...

    def sample(self, index: int) -> dict[str, np.ndarray]: ...
