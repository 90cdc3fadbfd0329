"""CIFAR-10 from its standard python archive on local disk (never downloaded).

The archive ``cifar-10-python.tar.gz`` unpacks to ``cifar-10-batches-py/`` with pickled
dicts ``data_batch_1`` .. ``data_batch_5`` (train) and ``test_batch`` (eval); each holds
``b"data"``, uint8 (n, 3072) rows of 1024 red, 1024 green and 1024 blue values of a 32x32
image, and ``b"labels"``, a list of n ints in 0..9.

Reading needs no torch (``repro500 data check`` uses it); the Dataset is in image_datasets.py.
Pickles can run code when loaded; the unpickler here accepts only what these files
contain (dicts, lists, strings, numbers and numpy arrays) and refuses anything else.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from repro500.errors import InvalidInput

BATCH_DIR = "cifar-10-batches-py"
FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "eval": ["test_batch"]}
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# Per-channel mean and standard deviation of the 50,000 CIFAR-10 training images (0..1).
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how python 2 pickles byte strings
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def batch_dir(path: str | Path) -> Path:
    """``path`` itself or ``path/cifar-10-batches-py``, whichever holds the batches."""
    p = Path(path)
    for candidate in (p / BATCH_DIR, p):
        if (candidate / "test_batch").is_file() or (candidate / "data_batch_1").is_file():
            return candidate
    if not p.exists():
        raise InvalidInput(f"{p} does not exist: point the cifar10 path at the unpacked cifar-10-python archive")
    raise InvalidInput(
        f"{p} holds no CIFAR-10 batches: expected {BATCH_DIR}/data_batch_1..5 and test_batch "
        "(unpack cifar-10-python.tar.gz there)"
    )


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (n, 3, 32, 32), labels int64 (n,)) of one batch file."""
    if not path.is_file():
        raise InvalidInput(f"{path} is missing: the CIFAR-10 archive is incomplete")
    try:
        with open(path, "rb") as fh:
            batch = _SafeUnpickler(io.BufferedReader(fh), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise InvalidInput(f"{path} is not a CIFAR-10 python batch (corrupt or another format): {err}") from None
    if not isinstance(batch, dict):
        raise InvalidInput(f"{path} is not a CIFAR-10 python batch: it does not hold a dict")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise InvalidInput(f"{path} lacks the b'data' or b'labels' entry of a CIFAR-10 batch")
    data = np.asarray(data)
    labels = np.asarray(labels, dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (data.shape[0],):
        raise InvalidInput(
            f"{path} holds data {data.dtype} {data.shape} and {labels.shape[0]} labels; "
            "expected uint8 (n, 3072) and n labels"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise InvalidInput(f"{path} has labels outside 0..9")
    return data.reshape(-1, 3, 32, 32), labels
