"""Seeds: one master seed, derived per repeat and per rank, applied everywhere.

Formula (docs/contracts.md, "Seeds"): for master seed ``S``, repeat ``k`` and rank ``r``::

    ss    = numpy.random.SeedSequence(entropy=S, spawn_key=(k, r))
    words = ss.generate_state(4, dtype=numpy.uint64)
    python   = int(words[0])            # random.seed
    numpy    = int(words[1]) % 2**32    # numpy.random.seed (legacy global state)
    torch    = int(words[2])            # torch.manual_seed (CPU and every CUDA device)
    loader   = int(words[3])            # torch.Generator of the DataLoader (shuffling)

DataLoader workers are seeded by torch from the loader generator (``base_seed + worker_id``);
:func:`seed_worker` copies that seed into ``random`` and ``numpy`` inside each worker.
SeedSequence's mixing makes the streams of different (k, r) statistically independent.
numpy and torch are imported only by the functions that apply seeds: deriving them computes
SeedSequence's words in plain Python (the same words, :func:`_seed_sequence_state`).

What every rank of a repeat must draw alike comes from *rank 0's* seeds of that repeat, as
recorded (:meth:`Seeds.shared`): the data order (``DistributedSampler``'s permutation, seeded
with rank 0's ``loader`` mod 2**62, :meth:`Seeds.shuffle`) and a seeded compressor's draws
(rank 0's ``torch`` mod 2**31).  In a factorial run rank 0's seeds are the cell's, not the
repeat index's, so the data order changes exactly when the recorded ``loader`` seed does.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

# The seeds one repeat records (its summary's ``seeds``, rank 0's), in the order every table and
# comparison shows them; the one spelling of the list (pairing, provenance, report, replay).
SEED_NAMES = ("python", "numpy", "torch", "loader")

FORMULA = (
    "SeedSequence(entropy=master_seed, spawn_key=(repeat, rank)).generate_state(4, uint64) "
    "-> python, numpy (mod 2**32), torch, dataloader"
)


@dataclass(frozen=True)
class Seeds:
    """The seeds one process of one repeat uses."""

    master: int
    repeat: int
    rank: int
    python: int
    numpy: int
    torch: int
    loader: int
    # The fields this repeat draws itself (a factorial run's cell, derive_varied; None: all), so
    # that any rank can tell rank 0's seeds of the same repeat.  Not a seed: the manifest's design
    # records the cells, and the recorded seeds keep their fields.
    varied: tuple[str, ...] | None = field(default=None, compare=False)

    def as_dict(self) -> dict[str, int]:
        out = asdict(self)
        del out["varied"]
        return out

    def shared(self) -> Seeds:
        """Rank 0's seeds of this repeat (and cell): what every rank draws alike is derived from
        them, so the recorded rank 0 seeds say what it was."""
        return self if self.rank == 0 else derive_varied(self.master, self.repeat, 0, self.varied)

    @property
    def shuffle(self) -> int:
        """The data order's seed (``DistributedSampler``'s): rank 0's ``loader`` seed, on every
        rank, so the union of the ranks' batches is the single-process batch at any world size."""
        return self.shared().loader % 2**62

    @property
    def compressor(self) -> int:
        """A seeded compressor's seed: rank 0's ``torch`` seed, on every rank (random-k must draw
        the same positions everywhere)."""
        return self.shared().torch % 2**31


# numpy.random.SeedSequence's hash constants (O'Neill's seed_seq_fe, as numpy implements it)
_M32 = 0xFFFFFFFF
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _POOL = 0xCA01F9DD, 0x4973F715, 4


def _words32(n: int) -> list[int]:
    """A non-negative integer as numpy's SeedSequence reads it: its 32-bit words, least first."""
    out = [n & _M32]
    while n := n >> 32:
        out.append(n & _M32)
    return out


def _seed_sequence_state(entropy: int, spawn_key: tuple[int, ...], n_words64: int) -> list[int]:
    """``numpy.random.SeedSequence(entropy, spawn_key=spawn_key).generate_state(n, numpy.uint64)``
    in plain Python.

    Why not numpy's: importing numpy costs 0.2 s, and a wrapped command's run needs these seeds
    before its first repeat starts and nothing else of numpy until the verdict (imported meanwhile
    in the background). The recorded seeds are numpy's, word for word: tests/test_seeds.py compares
    the two over master seeds up to 2**128, repeats and ranks."""
    hash_a = _INIT_A

    def hashmix(value: int) -> int:
        nonlocal hash_a
        value ^= hash_a
        hash_a = (hash_a * _MULT_A) & _M32
        value = (value * hash_a) & _M32
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        result = (_MIX_L * x - _MIX_R * y) & _M32
        return result ^ (result >> 16)

    run = _words32(entropy)
    spawn = [w for key in spawn_key for w in _words32(key)]
    if spawn and len(run) < _POOL:
        run += [0] * (_POOL - len(run))
    entropy_words = run + spawn
    pool = [hashmix(entropy_words[i] if i < len(entropy_words) else 0) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL, len(entropy_words)):
        for dst in range(_POOL):
            pool[dst] = mix(pool[dst], hashmix(entropy_words[src]))
    hash_b, state = _INIT_B, []
    for i in range(2 * n_words64):
        value = pool[i % _POOL] ^ hash_b
        hash_b = (hash_b * _MULT_B) & _M32
        value = (value * hash_b) & _M32
        state.append(value ^ (value >> 16))
    return [state[2 * i] | state[2 * i + 1] << 32 for i in range(n_words64)]


def derive(master_seed: int, repeat: int = 0, rank: int = 0) -> Seeds:
    """Derive the seeds of (repeat, rank) from the master seed (formula in module doc)."""
    if master_seed < 0 or repeat < 0 or rank < 0:
        raise ValueError("seeds, repeat and rank indices must be non-negative integers")
    words = _seed_sequence_state(int(master_seed), (int(repeat), int(rank)), 4)
    return Seeds(
        master=int(master_seed),
        repeat=int(repeat),
        rank=int(rank),
        python=words[0],
        numpy=words[1] % 2**32,
        torch=words[2],
        loader=words[3],
    )


def apply(seeds: Seeds) -> None:
    """Seed python's ``random``, numpy's global state and torch (CPU and all CUDA devices)."""
    import numpy as np
    import torch

    random.seed(seeds.python)
    np.random.seed(seeds.numpy)
    torch.manual_seed(seeds.torch)  # seeds every CUDA device too
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seeds.torch)


def loader_generator(seeds: Seeds) -> Any:
    """A ``torch.Generator`` for a DataLoader (shuffle order and worker base seeds)."""
    import torch

    gen = torch.Generator()
    gen.manual_seed(seeds.loader)
    return gen


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for DataLoaders: seed ``random`` and numpy from torch's worker seed."""
    import numpy as np
    import torch

    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


# The sources of randomness a factorial run (``repro500 run --vary``) varies one at a time, and
# the seeds each one owns: ``init`` is torch's generator (initialisation, dropout, anything the
# model draws from torch, a seeded compressor), ``data_order`` the loader seed (the data order
# and the DataLoader's worker seeds), ``seed`` all of them;
# ``kernels`` holds every seed and lets torch choose non-deterministic algorithms.
SOURCES: dict[str, tuple[str, ...]] = {
    "seed": SEED_NAMES,
    "init": ("torch",),
    "data_order": ("loader",),
    "kernels": (),
}


def derive_varied(master_seed: int, repeat: int, rank: int, varied: tuple[str, ...] | None) -> Seeds:
    """Repeat *repeat*'s seeds with only the *varied* fields its own (the others are repeat 0's);
    ``None`` varies all of them, as :func:`derive`."""
    own = derive(master_seed, repeat, rank)
    if varied is None:
        return own
    base = derive(master_seed, 0, rank)
    fields = {name: getattr(own if name in varied else base, name) for name in SOURCES["seed"]}
    return Seeds(master=int(master_seed), repeat=int(repeat), rank=int(rank), varied=tuple(varied), **fields)


def plan(master_seed: int, repeats: int, world_size: int = 1, same_seed: bool = False,
         varied: list[tuple[str, ...] | None] | None = None) -> list[dict[str, Any]]:
    """All seeds of a run, as recorded in the manifest's ``seeds`` facet.

    With ``same_seed`` every repeat uses repeat 0's seeds (a determinism check); ``varied`` gives
    each repeat the seeds it varies (a factorial run, :func:`derive_varied`).
    """
    out = []
    for k in range(repeats):
        source = 0 if same_seed else k
        fields = varied[k] if varied is not None else None
        out.append(
            {
                "repeat": k,
                "ranks": [derive_varied(master_seed, source, r, fields).as_dict() for r in range(world_size)],
            }
        )
    return out


# ----- pairing recorded repeats by their seeds ------------------------------------------------------
class RecordedRepeats(Protocol):
    """What pairing reads of a run (a ``repro500.verify.rundir.RunData``): its completed repeats and
    each repeat's summary."""

    @property
    def completed(self) -> list[int]: ...

    repeats: Mapping[int, Mapping[str, Any]]


def seed_key(doc: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """A repeat's seeds as pairs compare them (every one of :data:`SEED_NAMES`, from a repeat
    summary); None when the repeat records no torch seed."""
    seeds = doc.get("seeds") if isinstance(doc.get("seeds"), Mapping) else {}
    if seeds.get("torch") is None:
        return None
    return tuple(seeds.get(name) for name in SEED_NAMES)


def pair_repeats(run: RecordedRepeats, reference: RecordedRepeats, repeats: Sequence[int] | None = None,
                 reference_repeats: Sequence[int] | None = None) -> tuple[list[tuple[int, int]], list[str]]:
    """([(repeat of *run*, repeat of *reference*)], gaps): the one rule that pairs repeats of two runs.

    A pair is two repeats that received the same seeds -- *all* of them -- each repeat used once,
    the one of the same index first.  Why all: a repeat whose torch seed matches but whose loader
    seed does not (a factorial run's data-order cell, a rerun with another loader) saw the data in
    another order, so its records are expected to differ and calling that a divergence would be
    wrong.  Why once: a reference repeat paired with two rerun repeats enters a paired test twice
    (its own noise counted twice, the pairs no longer independent), and the divergence check would
    compare pairs the equivalence test does not.  The equivalence test, the exact replay, the
    divergence check, locate and the provenance comparison all pair with this function.

    *repeats* and *reference_repeats* restrict the candidates (default: the completed repeats); a gap
    says, in words, why a repeat of *run* has no partner."""
    repeats = run.completed if repeats is None else repeats
    reference_repeats = reference.completed if reference_repeats is None else reference_repeats
    free: dict[tuple[Any, ...], list[int]] = {}
    for j in reference_repeats:
        key = seed_key(reference.repeats[j])
        if key is not None:
            free.setdefault(key, []).append(j)
    pairs, gaps = [], []
    for k in repeats:
        key = seed_key(run.repeats[k])
        if key is None:
            gaps.append(f"repeat {k} records no torch seed")
            continue
        partners = free.get(key) or []
        if not partners:
            gaps.append(f"no reference repeat shares repeat {k}'s seed {key[2]}")
            continue
        j = k if k in partners else partners[0]
        partners.remove(j)
        pairs.append((k, j))
    return pairs, gaps
