"""torch Datasets over HDF5 files: EWA detection, cosmo regression, classification.

Real files and generated ones go through the same code (layout.py).  Reads are lazy: a
dataset holds file paths and sample counts, and every DataLoader worker opens its own
h5py handles on its first read (h5files.LazyFiles).  Images are normalised per channel
with statistics from the files (normstats.py), except EWA images: they are returned as
stored, cheap to hand over from a DataLoader worker (handoff.py), and the detection model
normalises them with the statistics in the dataset's ``info`` (``channel_mean``,
``channel_std``), in the pass torchvision's transform makes anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from repro500.data import cube, h5files, handoff, normstats
from repro500.data.layout import (
    COSMO_PARAMS,
    EWA_CHANNELS,
    EWA_CLASSES,
    classification_samples,
    cosmo_samples,
    ewa_samples,
    text,
)
from repro500.errors import InvalidInput

_IN_MEMORY_BYTES = 256 * 1024**2  # a classification split this small is read once, whole


def _pooled_stats(parts: list[h5files.FilePart], dataset: str, axis: int) -> tuple[np.ndarray, np.ndarray]:
    stats = []
    for path in dict.fromkeys(p.path for p in parts):  # each file once, in order
        with h5files.reading(path), h5files.open_h5(path) as h5:
            stats.append(normstats.file_stats(Path(path), h5, dataset, axis))
    mean, std = normstats.pool(stats)
    return mean, normstats.safe_std(std)


def _same(values: list[Any], what: str) -> Any:
    if len(set(values)) > 1:
        raise InvalidInput(f"the data files disagree on {what}: {sorted(set(values))}; use files of one data set")
    return values[0]


class EwaDataset(Dataset):
    """Extreme-Weather detection samples: (image [16, H, W], {"boxes": [n, 4], "labels": [n]}).

    Images are the file's values (float32, not normalised); ``info["channel_mean"]`` and
    ``info["channel_std"]`` are the per-channel statistics the detection model normalises with.

    Boxes are converted from the file's rows ``ymin, xmin, ymax, xmax, class`` to
    torchvision's ``(x1, y1, x2, y2)`` pixel coordinates, clipped to the image and at least
    one pixel wide and tall; labels are ``class + 1`` (0 is torchvision's background).
    """

    def __init__(self, path: h5files.PathSpec, split: str, params: dict[str, Any]) -> None:
        eval_fraction = float(params.get("eval_fraction", h5files.DEFAULT_EVAL_FRACTION))
        parts = h5files.select(path, split, count=ewa_samples, eval_fraction=eval_fraction)
        shapes = []
        for p in dict.fromkeys(q.path for q in parts):
            with h5files.reading(p), h5files.open_h5(p) as h5:
                shapes.append(tuple(h5["images"].shape[2:]))
        self.height, self.width = _same(shapes, "image size")
        mean, std = _pooled_stats(parts, "images", 0)
        self.files = h5files.LazyFiles(parts)
        self.info = {
            "task": "detection",
            "num_classes": len(EWA_CLASSES),
            "class_names": list(EWA_CLASSES),
            "label_offset": 1,
            "in_channels": len(EWA_CHANNELS),
            "sample_shape": [len(EWA_CHANNELS), self.height, self.width],
            "num_targets": None,
            "channel_names": list(EWA_CHANNELS),
            "channel_mean": mean.tolist(),
            "channel_std": std.tolist(),
        }

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        k, j = self.files.part_of(index)
        h5 = self.files.handle(k)
        shape = (len(EWA_CHANNELS), self.height, self.width)
        with h5files.reading(h5.filename):
            images = h5["images"]
            offset = h5files.sample_offset(images, j)
            if offset is None:  # compressed, chunked otherwise, or another dtype: HDF5 decodes it
                image = handoff.empty_tensor(shape)
                images.read_direct(image.numpy(), np.s_[j])
            rows = np.asarray(h5["boxes"][j])
        if offset is not None:  # stored as plain float32 (generated files by default): no decoding
            image = handoff.file_tensor(self.files.fd(k), offset, shape, h5.filename)
        return image, self.target(rows)

    def target(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        """A torchvision detection target from the file's box rows of one sample."""
        rows = rows[rows[:, 4] >= 0].astype(np.float32)
        y1 = np.clip(rows[:, 0], 0, self.height - 1)
        x1 = np.clip(rows[:, 1], 0, self.width - 1)
        y2 = np.clip(np.maximum(rows[:, 2], y1 + 1), 0, self.height)
        x2 = np.clip(np.maximum(rows[:, 3], x1 + 1), 0, self.width)
        boxes = np.stack([x1, y1, x2, y2], axis=1).reshape(-1, 4)
        return {  # a few bytes each: handed over from a worker as values (handoff.inline)
            "boxes": handoff.inline(torch.from_numpy(np.ascontiguousarray(boxes, dtype=np.float32))),
            "labels": handoff.inline(torch.from_numpy(rows[:, 4].astype(np.int64) + 1)),
        }


COSMO_AUGMENTS = ("none", "symmetries")
COSMO_STANDARDIZE = ("none", "log1p")
STATS_UNIVERSES = 64  # training universes (their first crop each) behind ``standardize: log1p``
COSMO_REFERENCE = ("MLPerf HPC CosmoFlow: N-body universes of 512^3 voxels in 4 redshift bins, "
                   "trained on 128^3 crops")


class CosmoDataset(Dataset):
    """CosmoFlow crops: (log1p(counts) [C, crop, crop, crop], unitPar [4]).

    Each universe is cut into ``(D // crop)^3`` non-overlapping crops (the real benchmark
    trains on 128^3 crops of 512^3 universes); every crop of a universe has its targets.
    ``log1p`` is the normalisation of the MLPerf HPC CosmoFlow reference.  Params:

    * ``augment: symmetries``: each training crop is returned in one of the 48 orientations of
      a cube (cube.py), drawn from torch's generator (seeded per DataLoader worker); the
      eval split is never augmented.
    * ``standardize: log1p``: log1p(counts) minus its per-channel mean, over its per-channel
      standard deviation, both from the *training* split of ``path`` (the first crop of up to
      ``STATS_UNIVERSES`` evenly spaced training universes), so both splits share one
      transform; the eval split needs the training files in its path (a directory with
      ``train.h5`` and ``eval.h5``, or a list of both files) rather than a separate eval_path.
    """

    def __init__(self, path: h5files.PathSpec, split: str, params: dict[str, Any]) -> None:
        eval_fraction = float(params.get("eval_fraction", h5files.DEFAULT_EVAL_FRACTION))
        parts = h5files.select(path, split, count=cosmo_samples, eval_fraction=eval_fraction)
        shapes = []
        for p in dict.fromkeys(q.path for q in parts):
            with h5files.reading(p), h5files.open_h5(p) as h5:
                shapes.append(tuple(h5["full"].shape[-4:]))
        (d, _, _, c) = _same(shapes, "volume shape")
        crop = int(params.get("crop", min(d, 128)))
        if not 1 <= crop <= d:
            raise InvalidInput(f"crop {crop} does not fit volumes of {d}^3 voxels: use 1..{d}")
        augment = str(params.get("augment", "none"))
        standardize = str(params.get("standardize", "none"))
        for name, value, choices in (("augment", augment, COSMO_AUGMENTS),
                                     ("standardize", standardize, COSMO_STANDARDIZE)):
            if value not in choices:
                raise InvalidInput(f"cosmo {name} {value!r} is not one of {', '.join(choices)}")
        self.size, self.channels, self.crop = d, c, crop
        self.per_axis = d // crop
        self.crops_per_universe = self.per_axis**3
        self.files = h5files.LazyFiles(parts)
        self.augment = augment == "symmetries" and split == "train"
        self.shift: np.ndarray | None = None
        self.scale: np.ndarray | None = None
        self.info = {
            "task": "regression",
            "num_classes": None,
            "in_channels": c,
            "sample_shape": [c, crop, crop, crop],
            "num_targets": len(COSMO_PARAMS),
            "target_names": list(COSMO_PARAMS),
            "target_range": [-1.0, 1.0],
        }
        # what the data is, for the run's records (the MLPerf log says how it differs from MLPerf's)
        self.description = {
            "universes": len(self.files), "volume": [d, d, d, c], "crop": crop,
            "crops_per_universe": self.crops_per_universe, "augment": augment if self.augment else "none",
            "standardize": standardize, "sources": _sources(parts), "reference": COSMO_REFERENCE,
        }
        if standardize == "log1p":
            mean, std = self._training_stats(path, split, eval_fraction)
            self.shift = mean.astype(np.float32).reshape(-1, 1, 1, 1)
            self.scale = (1.0 / std).astype(np.float32).reshape(-1, 1, 1, 1)
            self.info["input_mean"], self.info["input_std"] = mean.tolist(), std.tolist()

    def _training_stats(self, path: h5files.PathSpec, split: str, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel mean and std of log1p(counts) over the training split's universes."""
        try:
            parts = h5files.select(path, "train", count=cosmo_samples, eval_fraction=eval_fraction)
        except InvalidInput as err:
            raise InvalidInput(
                f"standardize: log1p takes its statistics from the training universes, and the {split} "
                f"split's path has none ({err}); give dataset.path as a directory holding train.h5 and "
                "eval.h5 (or a list of both files) instead of a separate eval_path"
            ) from None
        files = h5files.LazyFiles(parts)
        moments = normstats.Moments()
        try:
            n = len(files)
            for universe in np.unique(np.linspace(0, n - 1, num=min(n, STATS_UNIVERSES)).round().astype(int)):
                moments.add(np.log1p(self._counts(files, int(universe), 0).astype(np.float32)), -1)
        finally:
            files.close()
        mean, std = moments.mean_std()
        return np.asarray(mean), normstats.safe_std(np.asarray(std))

    def _counts(self, files: h5files.LazyFiles, universe: int, k: int) -> np.ndarray:
        """Crop ``k`` of a universe: counts (crop, crop, crop, C), as stored."""
        h5, j = files.locate(universe)
        cz, cy, cx = np.unravel_index(k, (self.per_axis,) * 3)
        c = self.crop
        window = (slice(cz * c, cz * c + c), slice(cy * c, cy * c + c), slice(cx * c, cx * c + c))
        with h5files.reading(h5.filename):
            full = h5["full"]
            return full[window] if full.ndim == 4 else full[(j, *window)]  # a real per-universe file

    def _target(self, universe: int) -> np.ndarray:
        h5, j = self.files.locate(universe)
        with h5files.reading(h5.filename):
            par = h5["unitPar"]
            return np.asarray(par[()] if par.ndim == 1 else par[j], dtype=np.float32)

    def __len__(self) -> int:
        return len(self.files) * self.crops_per_universe

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        universe, k = divmod(index, self.crops_per_universe)
        counts = self._counts(self.files, universe, k)
        volume = np.log1p(np.moveaxis(counts.astype(np.float32), -1, 0))
        if self.shift is not None and self.scale is not None:
            volume = (volume - self.shift) * self.scale
        if self.augment:
            volume = cube.symmetry(volume, int(torch.randint(cube.SYMMETRIES, ())))
        return torch.from_numpy(np.ascontiguousarray(volume)), torch.from_numpy(self._target(universe))


class ClassificationH5Dataset(Dataset):
    """Classification images from HDF5: (image float32 [C, H, W], label int64 scalar)."""

    def __init__(self, path: h5files.PathSpec, split: str, params: dict[str, Any]) -> None:
        eval_fraction = float(params.get("eval_fraction", h5files.DEFAULT_EVAL_FRACTION))
        parts = h5files.select(path, split, count=classification_samples, eval_fraction=eval_fraction)
        shapes, classes, max_label, itemsize = [], [], 0, 1
        for p in dict.fromkeys(q.path for q in parts):
            with h5files.reading(p), h5files.open_h5(p) as h5:
                shapes.append(tuple(h5["images"].shape[1:]))
                itemsize = max(itemsize, h5["images"].dtype.itemsize)
                names = h5.attrs.get("class_names")
                if names is not None:
                    classes.append(len(names))
                else:
                    labels = h5["labels"][()]
                    if labels.size and labels.min() < 0:
                        raise InvalidInput(f"{p}: 'labels' holds negative values; classes are 0..K-1")
                    max_label = max(max_label, int(labels.max()) + 1 if labels.size else 0)
        self.sample_shape = _same(shapes, "image shape")
        num_classes = max(classes + [max_label])
        mean, std = _pooled_stats(parts, "images", 0)
        self._mean = mean.astype(np.float32).reshape(-1, 1, 1)
        self._inv_std = (1.0 / std).astype(np.float32).reshape(-1, 1, 1)
        self.files = h5files.LazyFiles(parts)
        self._cache: tuple[np.ndarray, np.ndarray] | None = None
        self._small = len(self.files) * int(np.prod(self.sample_shape)) * itemsize <= _IN_MEMORY_BYTES
        self.info = {
            "task": "classification",
            "num_classes": num_classes,
            "in_channels": self.sample_shape[0],
            "sample_shape": list(self.sample_shape),
            "num_targets": None,
            "class_names": _class_names(parts[0].path, num_classes),
        }

    def __len__(self) -> int:
        return len(self.files)

    def sample_labels(self) -> np.ndarray:
        """Every sample's class, in index order, without reading an image (sampling bias)."""
        if self._cache is not None:
            return self._cache[1]
        labels = []
        for k, part in enumerate(self.files.parts):
            h5 = self.files.handle(k)
            with h5files.reading(part.path):
                labels.append(h5["labels"][part.start:part.stop])
        return np.concatenate(labels)

    def _load_all(self) -> tuple[np.ndarray, np.ndarray]:
        images, labels = [], []
        for k, part in enumerate(self.files.parts):
            h5 = self.files.handle(k)
            with h5files.reading(part.path):
                images.append(h5["images"][part.start:part.stop])
                labels.append(h5["labels"][part.start:part.stop])
        return np.concatenate(images), np.concatenate(labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._small:
            if self._cache is None:
                self._cache = self._load_all()
            if not 0 <= index < len(self):
                raise IndexError(f"sample {index} is out of range (0..{len(self) - 1})")
            pixels, label = self._cache[0][index], self._cache[1][index]
        else:
            h5, j = self.files.locate(index)
            with h5files.reading(h5.filename):
                pixels, label = h5["images"][j], h5["labels"][j]
        image = (pixels.astype(np.float32) - self._mean) * self._inv_std
        return torch.from_numpy(image), torch.tensor(int(label), dtype=torch.int64)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None  # each worker reads its own copy instead of pickling it
        return state


def _sources(parts: list[h5files.FilePart]) -> list[dict[str, Any]]:
    """Where a split's samples come from: each generated data set once (its shards together),
    with its generator, seed and parameters; files without them as real data."""
    import json

    sources: dict[str, dict[str, Any]] = {}
    for part in parts:
        with h5files.reading(part.path), h5files.open_h5(part.path) as h5:
            generator = h5.attrs.get("generator")
            if generator is None:
                entry = {"data": "files without generator attributes (real data)"}
            else:
                entry = {"generator": text(generator), "generator_version": int(h5.attrs.get("generator_version", 0)),
                         "seed": int(h5.attrs.get("seed", 0)), "split": text(h5.attrs.get("split", "")),
                         "params": json.loads(text(h5.attrs.get("params", "{}")))}
        key = json.dumps(entry, sort_keys=True)
        sources.setdefault(key, {**entry, "samples": 0})["samples"] += len(part)
    return list(sources.values())


def _class_names(path: Path, num_classes: int) -> list[str]:
    with h5files.reading(path), h5files.open_h5(path) as h5:
        names = h5.attrs.get("class_names")
    if names is not None and len(names) == num_classes:
        return [text(n) for n in names]
    return [str(k) for k in range(num_classes)]

