"""Seeds: the same master seed gives the same random streams in separate processes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from repro500.capture import seeds

# One process: for each repeat, derive, apply, then draw from every generator a trainer uses
# (a DataLoader worker too: its numpy draws come from seed_worker).
DRAW = r"""
import json, random, sys
import numpy as np, torch
from repro500.capture import seeds

class Noisy(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.tensor([i, np.random.randint(1 << 30), random.randrange(1 << 30)])

master, repeats = int(sys.argv[1]), [int(k) for k in sys.argv[2:]]
out = []
for repeat in repeats:
    s = seeds.derive(master, repeat, 0)
    seeds.apply(s)
    loader = torch.utils.data.DataLoader(Noisy(), batch_size=4, shuffle=True,
                                         generator=seeds.loader_generator(s), num_workers=1,
                                         worker_init_fn=seeds.seed_worker)
    out.append({
        "torch": torch.rand(5).tolist(), "randn": torch.randn(3, 3).tolist(),
        "numpy": np.random.rand(3).tolist(), "python": [random.random() for _ in range(3)],
        "loader": [b.tolist() for b in loader], "seeds": s.as_dict(),
    })
print(json.dumps(out))
"""


def draw(master: int, *repeats: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRAW, str(master), *map(str, repeats)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen) -> list[dict]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_same_master_seed_same_tensors_in_two_processes_and_repeats_differ():
    # Two processes at once (the torch import dominates); the second also draws repeat 1.
    a, b = draw(500, 0), draw(500, 0, 1)
    (ra,), (rb, rc) = result(a), result(b)
    assert ra == rb  # torch, numpy, random, shuffle order and worker draws all identical
    for key in ("torch", "randn", "numpy", "python", "loader"):
        assert ra[key] != rc[key], key
    assert ra["seeds"] == seeds.derive(500, 0).as_dict()


def test_derivation_follows_the_documented_formula():
    s = seeds.derive(42, repeat=3, rank=1)
    words = np.random.SeedSequence(entropy=42, spawn_key=(3, 1)).generate_state(4, np.uint64)
    assert (s.python, s.numpy, s.torch, s.loader) == (
        int(words[0]), int(words[1]) % 2**32, int(words[2]), int(words[3]))
    assert s.numpy < 2**32
    all_seeds = {seeds.derive(42, k, r).torch for k in range(4) for r in range(4)}
    assert len(all_seeds) == 16  # every (repeat, rank) gets its own stream
    with pytest.raises(ValueError):
        seeds.derive(-1)


def test_plan_records_every_rank_and_same_seed_reuses_repeat_zero():
    plan = seeds.plan(7, repeats=3, world_size=2)
    assert [p["repeat"] for p in plan] == [0, 1, 2]
    assert [r["rank"] for r in plan[1]["ranks"]] == [0, 1]
    assert plan[1]["ranks"][0] == seeds.derive(7, 1, 0).as_dict()
    same = seeds.plan(7, repeats=3, world_size=1, same_seed=True)
    assert same[2]["ranks"][0]["torch"] == same[0]["ranks"][0]["torch"]
    assert same[2]["repeat"] == 2
    json.dumps(plan)


def test_derived_seeds_are_numpys_seed_sequence_word_for_word():
    """derive() computes SeedSequence's state without importing numpy; the recorded seeds must stay
    numpy's: master seeds of every word length up to 2**128, repeats and ranks past 32 bits."""
    import random

    rng = random.Random(20261128)
    cases = [(0, 0, 0), (500, 0, 0), (2**32 - 1, 1, 0), (2**32, 0, 1), (2**64 + 5, 3, 7), (2**128 - 1, 2**33, 2)]
    cases += [(rng.getrandbits(rng.choice([1, 31, 32, 33, 64, 65, 96, 128])), rng.randrange(2**rng.choice([3, 31, 40])),
               rng.randrange(64)) for _ in range(500)]
    for master, repeat, rank in cases:
        words = np.random.SeedSequence(entropy=master, spawn_key=(repeat, rank)).generate_state(4, dtype=np.uint64)
        got = seeds.derive(master, repeat, rank)
        assert [got.python, got.numpy, got.torch, got.loader] == [int(words[0]), int(words[1]) % 2**32,
                                                                  int(words[2]), int(words[3])], (master, repeat, rank)


def test_deriving_seeds_imports_no_numpy():
    code = "import sys; from repro500.capture import seeds; seeds.derive(500, 2, 1); print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
