"""Random streams that depend only on (seed, kind, split, sample index, stream).

Every synthetic sample draws from its own generator::

    numpy.random.Generator(numpy.random.PCG64(
        numpy.random.SeedSequence(entropy=seed, spawn_key=(KIND_ID, SPLIT_ID, index, stream))))

so sample ``i`` is the same whichever process, shard or order produces it: K shards written
by K processes hold exactly the bytes one pass writes.  ``stream`` separates independent
parts of one sample (e.g. the EWA background and its planted events), so one part can be
regenerated without the other.  Draws that belong to the whole data set (the EWA
orography) use ``split = FILE_LEVEL`` and are shared by train and eval.
"""

from __future__ import annotations

import numpy as np

KIND_IDS = {"ewa": 1, "cosmo": 2, "classification": 3}
SPLIT_IDS = {"train": 0, "eval": 1}
FILE_LEVEL = 2**31  # a "split" id no real split uses: draws shared by every split


def sample_rng(seed: int, kind: str, split: str | int, index: int, stream: int = 0) -> np.random.Generator:
    """The generator of one stream of one sample (formula in the module docstring)."""
    split_id = split if isinstance(split, int) else SPLIT_IDS[split]
    ss = np.random.SeedSequence(
        entropy=int(seed), spawn_key=(KIND_IDS[kind], int(split_id), int(index), int(stream))
    )
    return np.random.Generator(np.random.PCG64(ss))
