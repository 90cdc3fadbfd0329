"""Data: synthetic scientific generators (EWA, cosmo, classification) and real loaders.

Public entry points (imported lazily: ``import repro500.data`` costs nothing)::

    open_dataset(name, split, *, path=None, seed=0, params=None) -> torch Dataset
    collate_detection(batch)                                      -> (images, targets)
    SyntheticClassification(split, seed=0, params=None)
    generate(kind, out, *, samples, seed, split, size, shard, compression, force, ...)
    check_path(path, *, manifest=None, quick=False)               -> CheckReport
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "open_dataset": "repro500.data.loaders",
    "collate_detection": "repro500.data.loaders",
    "DATASETS": "repro500.data.loaders",
    "SyntheticClassification": "repro500.data.synthetic",
    "generate": "repro500.data.generate",
    "check_path": "repro500.data.check",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
