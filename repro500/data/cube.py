"""The 48 symmetries of a cube: random orientations for CosmoFlow volumes (augment: symmetries).

A universe's statistics do not change when its volume is rotated or reflected: each of the
48 symmetries of a cube (6 orders of the three spatial axes times 8 combinations of flips)
gives another volume of the same cosmology.  ``symmetry(volume, i)`` applies symmetry ``i``
to a channels-first volume (C, D, D, D); CosmoDataset draws one per training sample
(``augment: symmetries``) so the model sees the 48 orientations of each universe.
"""

from __future__ import annotations

import itertools

import numpy as np

PERMUTATIONS = tuple(itertools.permutations(range(3)))  # (0, 1, 2) first: index 0 is the identity
SYMMETRIES = len(PERMUTATIONS) * 8  # 48


def symmetry(volume: np.ndarray, index: int) -> np.ndarray:
    """Symmetry ``index`` (0..47) of a (C, D, D, D) volume, a view: the spatial axes reordered
    by ``PERMUTATIONS[index // 8]``, then flipped along axis ``a`` when bit ``a`` of ``index % 8``
    is set.  Index 0 is the identity."""
    if not 0 <= index < SYMMETRIES:
        raise ValueError(f"a cube has {SYMMETRIES} symmetries (0..{SYMMETRIES - 1}), not {index}")
    if volume.ndim != 4 or len(set(volume.shape[1:])) != 1:
        raise ValueError(f"a cube symmetry needs a (C, D, D, D) volume, not {volume.shape}")
    perm, flips = PERMUTATIONS[index // 8], index % 8
    out = volume.transpose(0, *(1 + axis for axis in perm))
    axes = tuple(1 + axis for axis in range(3) if flips >> axis & 1)
    return np.flip(out, axes) if axes else out
