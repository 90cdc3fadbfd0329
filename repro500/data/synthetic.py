"""The synthetic classification data set in memory: no file, samples made on demand (and kept,
up to ``KEPT_BYTES`` a split, for the next epoch and the next repeat in the same process).

Sample ``i`` of a split is exactly sample ``i`` of a file that ``repro500 data generate
classification`` writes with the same seed and parameters (classification.py), so a run
on the in-memory data and a run on the file see the same images.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from repro500.data.classification import (
    ClassificationGenerator,
    ClassificationParams,
    parse_size,
)
from repro500.data.normstats import Moments, safe_std
from repro500.errors import InvalidInput

DEFAULT_SAMPLES = {"train": 1024, "eval": 512}
STATS_SAMPLES = 64  # normalisation statistics come from the first train samples
_KNOWN = {"samples", "train_samples", "eval_samples", "classes", "channels", "size", "noise"}
# Images a split keeps once drawn, per (parameters, seed, split), and how many splits a process
# keeps: a sample takes 0.3 ms to draw (16x16, 2-core Xeon at 2.5 GHz) and every epoch and every
# repeat of a run reads the same ones; the default 1,024 + 512 samples of 32x32 take 4.5 MiB.
KEPT_BYTES = 32 * 2**20
KEPT_SPLITS = 4


class _Drawn:
    """A split's generator and the images it has drawn, kept up to KEPT_BYTES (those past it are
    drawn again each time they are read)."""

    def __init__(self, params: ClassificationParams, seed: int, split: str) -> None:
        self.generator = ClassificationGenerator(params, seed, split)
        self._images: dict[int, np.ndarray] = {}
        self._room = KEPT_BYTES // (params.channels * params.height * params.width)

    def __getstate__(self) -> dict[str, Any]:
        # a loader worker started by spawn gets the generator, not the kept images: it keeps its own
        return {**self.__dict__, "_images": {}}

    def image(self, index: int) -> np.ndarray:
        image = self._images.get(index)
        if image is None:
            image = self.generator.sample(index)["images"]
            image.flags.writeable = False
            if len(self._images) < self._room:
                self._images[index] = image
        return image


@functools.lru_cache(maxsize=KEPT_SPLITS)
def _drawn(params: ClassificationParams, seed: int, split: str) -> _Drawn:
    return _Drawn(params, seed, split)


@functools.lru_cache(maxsize=KEPT_SPLITS)
def _normalisation(params: ClassificationParams, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, 1 / std) per channel, shaped to broadcast over an image, of the first train samples."""
    train = _drawn(params, seed, "train")
    moments = Moments()
    for i in range(STATS_SAMPLES):
        moments.add(train.image(i), 0)
    mean, std = moments.mean_std()
    return (np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1),
            (1.0 / safe_std(np.asarray(std))).astype(np.float32).reshape(-1, 1, 1))


class SyntheticClassification(Dataset):
    """(image float32 [C, H, W] normalised per channel, label int64 scalar), made on demand."""

    def __init__(self, split: str, seed: int = 0, params: dict[str, Any] | None = None) -> None:
        params = dict(params or {})
        unknown = set(params) - _KNOWN
        if unknown:
            raise InvalidInput(
                f"unknown synthetic-classification parameters {sorted(unknown)}: use {sorted(_KNOWN)}"
            )
        size = params.get("size")
        try:
            h, w = parse_size(None if size is None else str(size))
            gen_params = ClassificationParams(
                classes=int(params.get("classes", 10)), channels=int(params.get("channels", 3)),
                height=h, width=w, noise=float(params.get("noise", ClassificationParams.noise)),
            )
        except ValueError as err:
            raise InvalidInput(f"bad synthetic-classification parameters: {err}") from None
        n = params.get("samples", params.get(f"{split}_samples", DEFAULT_SAMPLES[split]))
        if int(n) < 1:
            raise InvalidInput(f"synthetic-classification needs at least 1 {split} sample, not {n}")
        self.samples = int(n)
        self._drawn = _drawn(gen_params, int(seed), split)
        self.generator = self._drawn.generator
        self._mean, self._inv_std = _normalisation(gen_params, int(seed))
        self.info = {
            "task": "classification",
            "num_classes": gen_params.classes,
            "in_channels": gen_params.channels,
            "sample_shape": [gen_params.channels, h, w],
            "num_targets": None,
            "class_names": self.generator.attrs()["class_names"],
            "params": gen_params.as_dict(),
        }

    def __len__(self) -> int:
        return self.samples

    def sample_labels(self) -> np.ndarray:
        """Every sample's class without drawing its image (sampling bias)."""
        return np.fromiter((self.generator.label(i) for i in range(self.samples)), dtype=np.int64, count=self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.samples:
            raise IndexError(f"sample {index} is out of range (0..{self.samples - 1})")
        image = (self._drawn.image(index).astype(np.float32) - self._mean) * self._inv_std
        return torch.from_numpy(image), torch.tensor(self.generator.label(index), dtype=torch.int64)
