"""``open_dataset``: every data set a workload trains on, by name, as a torch Dataset.

=========================  ======================================================  ========
name                       path                                                    task
=========================  ======================================================  ========
synthetic-classification   none: samples are made in memory (synthetic.py)         classif.
classification-h5          HDF5 file(s) from ``repro500 data generate classification``  classif.
cifar10                    directory with ``cifar-10-batches-py`` (cifar.py)       classif.
imagefolder                directory with ``train/`` and ``val/`` class folders     classif.
ewa                        HDF5 file(s): real ``climo_YYYY.h5`` or generated       detection
cosmo                      HDF5 file(s): real CosmoFlow universes or generated     regression
=========================  ======================================================  ========

Every data set has an ``info`` dict (task, num_classes, in_channels, sample_shape,
num_targets, and channel or class names where they exist).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from repro500.errors import InvalidInput

DATASETS = ("synthetic-classification", "classification-h5", "cifar10", "imagefolder", "ewa", "cosmo")
# The ones stored in HDF5 files that repro500 data check (and the run's quick check) can read.
H5_DATASETS = ("classification-h5", "ewa", "cosmo")
PARAMS = {  # the params each data set understands (docs/data.md)
    "synthetic-classification": {"samples", "train_samples", "eval_samples", "classes", "channels", "size", "noise"},
    "classification-h5": {"eval_fraction"},
    "cifar10": {"augment"},
    "imagefolder": {"size", "augment"},
    "ewa": {"eval_fraction"},
    "cosmo": {"eval_fraction", "crop", "augment", "standardize"},
}


def open_dataset(
    name: str,
    split: str,
    *,
    path: str | os.PathLike[str] | list[str] | None = None,
    seed: int = 0,
    params: dict[str, Any] | None = None,
) -> Any:
    """The ``split`` ("train" or "eval") of data set ``name`` as a torch Dataset.

    Missing paths, unknown names and files in the wrong layout raise InvalidInput.
    """
    params = dict(params or {})
    if name not in DATASETS:
        raise InvalidInput(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}")
    if split not in ("train", "eval"):
        raise InvalidInput(f"unknown split {split!r}: use train or eval")
    unknown = sorted(set(params) - PARAMS[name])
    if unknown:
        known = ", ".join(sorted(PARAMS[name])) or "none"
        raise InvalidInput(f"dataset {name!r} does not take the parameters {unknown} (it takes: {known})")
    if name == "synthetic-classification":
        from repro500.data.synthetic import SyntheticClassification

        return SyntheticClassification(split, seed=seed, params=params)
    if path is None or (isinstance(path, (list, tuple)) and not path):
        raise InvalidInput(f"dataset {name!r} needs a path to its files")
    if name == "cifar10":
        from repro500.data.image_datasets import Cifar10

        return Cifar10(_one_path(name, path), split, augment=bool(params.get("augment", False)))
    if name == "imagefolder":
        from repro500.data.image_datasets import image_folder

        return image_folder(_one_path(name, path), split, params)
    from repro500.data import h5datasets

    cls = {
        "ewa": h5datasets.EwaDataset,
        "cosmo": h5datasets.CosmoDataset,
        "classification-h5": h5datasets.ClassificationH5Dataset,
    }[name]
    return cls(path, split, params)


def _one_path(name: str, path: Any) -> Path:
    if isinstance(path, (list, tuple)):
        if len(path) != 1:
            raise InvalidInput(f"dataset {name!r} takes one directory, not a list of {len(path)} paths")
        path = path[0]
    return Path(os.fspath(path))


def collate_detection(batch: list[tuple[Any, Any]]) -> tuple[list[Any], list[Any]]:
    """DataLoader ``collate_fn`` for detection: images and targets as lists (sizes may differ)."""
    images, targets = zip(*batch, strict=True) if batch else ((), ())
    return list(images), list(targets)


def _registered(name: str) -> Any:
    """A built-in data set as the ``repro500.datasets`` entry point a plug-in would register:
    ``factory(split, *, path=None, seed=0, **params)`` (docs/workloads.md, "Plug-ins")."""

    def factory(split: str, *, path: Any = None, seed: int = 0, **params: Any) -> Any:
        return open_dataset(name, split, path=path, seed=seed, params=params)

    factory.__name__ = factory.__qualname__ = name.replace("-", "_")
    factory.__doc__ = f"The built-in data set {name!r}."
    return factory


# Registered in pyproject.toml under repro500.datasets, like a user's package's data sets.
synthetic_classification = _registered("synthetic-classification")
classification_h5 = _registered("classification-h5")
cifar10 = _registered("cifar10")
imagefolder = _registered("imagefolder")
ewa = _registered("ewa")
cosmo = _registered("cosmo")
