"""Image-file data sets: CIFAR-10's python archive and torchvision's ImageFolder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from repro500.data.cifar import CLASSES, FILES, MEAN, STD, batch_dir, read_batch
from repro500.errors import InvalidInput

# ImageNet's channel statistics: the usual normalisation for photographs in class folders.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Cifar10(Dataset):
    """CIFAR-10 images normalised with the training set's channel statistics.

    ``augment`` (training split only): the standard CIFAR augmentation of He et al. and Deep500's
    recipe, a random 32x32 crop of the image padded by 4 pixels and a random horizontal flip. The
    draws use torch's generator, which repro500 seeds per repeat and per DataLoader worker.
    """

    def __init__(self, path: str | Path, split: str, augment: bool = False) -> None:
        if split not in FILES:
            raise InvalidInput(f"unknown split {split!r}: use train or eval")
        self.augment = augment and split == "train"
        root = batch_dir(path)
        parts = [read_batch(root / name) for name in FILES[split]]
        self.images = np.concatenate([p[0] for p in parts])
        self.labels = np.concatenate([p[1] for p in parts])
        self._mean = (np.array(MEAN, dtype=np.float32) * 255.0).reshape(3, 1, 1)
        self._inv_std = (1.0 / (np.array(STD, dtype=np.float32) * 255.0)).reshape(3, 1, 1)
        self.info = {
            "task": "classification",
            "num_classes": 10,
            "class_names": list(CLASSES),
            "in_channels": 3,
            "sample_shape": [3, 32, 32],
            "num_targets": None,
        }

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = torch.from_numpy((self.images[index].astype(np.float32) - self._mean) * self._inv_std)
        if self.augment:
            padded = torch.nn.functional.pad(image, (4, 4, 4, 4))  # zero = the mean after normalising
            top, left = (int(v) for v in torch.randint(0, 9, (2,)))
            image = padded[:, top : top + 32, left : left + 32]
            if bool(torch.randint(0, 2, (1,))):
                image = image.flip(-1)
        return image.contiguous(), torch.tensor(int(self.labels[index]), dtype=torch.int64)


def _label_tensor(label: int) -> Any:

    return torch.tensor(label, dtype=torch.int64)


def image_folder(root: Path, split: str, params: dict[str, Any]) -> Any:
    from torchvision import datasets, transforms

    names = ("train",) if split == "train" else ("val", "eval", "test")
    folder = next((root / n for n in names if (root / n).is_dir()), None)
    if folder is None:
        raise InvalidInput(
            f"{root} has no {' or '.join(names)} directory: an image folder needs "
            f"{root}/train/<class>/*.jpg and {root}/val/<class>/*.jpg"
        )
    steps: list[Any] = []
    size = params.get("size")
    if params.get("augment") and split == "train":
        # the usual ImageNet training augmentation (torchvision's reference recipe)
        steps += [transforms.RandomResizedCrop(int(size or 224)), transforms.RandomHorizontalFlip()]
    elif size is not None:
        steps += [transforms.Resize(int(size)), transforms.CenterCrop(int(size))]
    steps += [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    try:
        ds = datasets.ImageFolder(str(folder), transform=transforms.Compose(steps), target_transform=_label_tensor)
    except (FileNotFoundError, RuntimeError) as err:
        raise InvalidInput(f"{folder} is not a usable image folder: {err}") from None
    ds.info = {
        "task": "classification",
        "num_classes": len(ds.classes),
        "class_names": list(ds.classes),
        "in_channels": 3,
        "sample_shape": [3, int(size), int(size)] if size is not None else None,
        "num_targets": None,
    }
    return ds
