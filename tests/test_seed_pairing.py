"""One rule pairs the repeats of two runs by seed (repro500.capture.seeds.pair_repeats), and every
caller -- the equivalence test, the exact replay, the divergence check, locate, the provenance
comparison and the cross-run determinism note -- compares the pairs it gives.

The runs below are the cases where the two rules the project once had disagreed: a rerun repeat
whose torch seed matches a reference repeat's while its loader seed does not (a data-order cell),
and three same-seed rerun repeats against one reference repeat of that seed (a partner reused)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from repro500.capture.seeds import SEED_NAMES, derive, pair_repeats, seed_key
from repro500.errors import InvalidInput
from repro500.locate.plan import choose_pair
from repro500.rundir import layout
from repro500.verify import compare as comparison
from repro500.verify import divergence
from repro500.verify.determinism import compare_with_reference, replay_by_seed
from repro500.verify.reference import pair_by_seed
from repro500.verify.rundir import RunData

A = derive(1, 0).as_dict()
B = derive(1, 1).as_dict()
# repeat 0's torch seed, another loader seed: the same initialisation, another data order
A_OTHER_ORDER = {**A, "loader": B["loader"]}


def _repeat(seeds: dict[str, int], digest: str, value: float, output: str) -> dict:
    return {"status": "completed", "seeds": seeds, "final_param_digest": digest, "metrics": {"accuracy": value},
            "outputs": {"model.pt": output}}


def _run(path: Path, repeats: dict[int, dict]) -> RunData:
    """A run whose repeats wrote two steps each: the loss follows the final digest, so repeats that
    end alike agree at every step and the others part at the first."""
    for k, doc in repeats.items():
        where = layout.RunDir(path).repeat(k)
        where.mkdir(parents=True, exist_ok=True)
        loss = float(int(hashlib.md5(doc["final_param_digest"].encode()).hexdigest()[:6], 16))
        (where / layout.METRICS).write_text("".join(
            json.dumps({"kind": "step", "step": s, "epoch": 1, "loss": loss + s}) + "\n" for s in (1, 2)))
    return RunData(path=path, summary={}, repeats=repeats)


@pytest.fixture
def data_order(tmp_path):
    """Rerun repeat 1 shares only the torch seed with reference repeat 0 (and ends elsewhere, as a
    run that saw another data order does)."""
    reference = _run(tmp_path / "ref", {0: _repeat(A, "d-A", 0.9, "o-A"), 1: _repeat(B, "d-B", 0.8, "o-B")})
    rerun = _run(tmp_path / "rerun", {0: _repeat(A, "d-A", 0.9, "o-A"),
                                      1: _repeat(A_OTHER_ORDER, "d-other", 0.7, "o-other")})
    return rerun, reference


@pytest.fixture
def reused(tmp_path):
    """Three same-seed rerun repeats against one reference repeat of that seed."""
    reference = _run(tmp_path / "ref", {0: _repeat(A, "d-A", 0.9, "o-A"), 1: _repeat(B, "d-B", 0.8, "o-B")})
    rerun = _run(tmp_path / "rerun", {k: _repeat(A, "d-A" if k == 0 else f"d-{k}", 0.9, "o-A") for k in range(3)})
    return rerun, reference


def test_a_pair_received_every_seed_alike(data_order):
    rerun, reference = data_order
    pairs, gaps = pair_repeats(rerun, reference)
    assert pairs == [(0, 0)]  # the torch-only rule paired repeat 1 with reference repeat 0 as well
    assert gaps == [f"no reference repeat shares repeat 1's seed {A['torch']}"]
    assert seed_key(rerun.repeats[1]) != seed_key(reference.repeats[0])
    assert seed_key({"seeds": {"python": 1}}) is None  # no torch seed: not paired at all


def test_each_repeat_is_used_once(reused):
    rerun, reference = reused
    pairs, gaps = pair_repeats(rerun, reference)
    assert pairs == [(0, 0)]  # the reusing rule gave (0, 0), (1, 0), (2, 0)
    assert len(gaps) == 2


def test_the_same_index_comes_first(tmp_path):
    reference = _run(tmp_path / "ref", {k: _repeat(A, f"d{k}", 0.9, "o") for k in range(3)})
    rerun = _run(tmp_path / "rerun", {k: _repeat(A, f"d{k}", 0.9, "o") for k in (2, 0, 1)})
    assert pair_repeats(rerun, reference)[0] == [(0, 0), (1, 1), (2, 2)]


@pytest.mark.parametrize("case", ["data_order", "reused"])
def test_every_caller_compares_the_same_pairs(case, request):
    rerun, reference = request.getfixturevalue(case)
    expected, _ = pair_repeats(rerun, reference)

    # the equivalence test (paired by seed when enough pairs exist)
    pairing = pair_by_seed(rerun, reference, "accuracy")
    assert [(p["repeat"], p["reference_repeat"]) for p in pairing.pairs] in ([], expected)
    assert "1 rerun repeat shares its seeds" in pairing.reason

    # the exact replay and the cross-run determinism note
    assert [(p["repeat"], p["reference_repeat"]) for p in replay_by_seed(rerun, reference).pairs] == expected
    assert [(p["repeat"], p["reference_repeat"]) for p in compare_with_reference(rerun, reference)] == expected

    # the divergence check: only the pair that received the same seeds, which agrees bitwise; the
    # torch-only or reusing rule compared a repeat that ended elsewhere and reported it parted
    found = divergence.check(rerun, SimpleNamespace(run=reference, manifest={}, path=reference.path))
    against = [p for p in found.pairs if p.other == "reference"]
    assert [(p.repeat, p.other_repeat) for p in against] == expected
    assert not [p.detail for p in against if p.diverged]

    # locate: the pair it replays, and no pair for a repeat without a partner
    assert choose_pair(rerun, reference, False, None, None) == expected[0]
    with pytest.raises(InvalidInput, match="share a seed"):
        choose_pair(rerun, reference, False, 1, None)


def test_the_provenance_comparison_takes_outputs_of_a_true_pair(data_order):
    rerun, reference = data_order
    # the only pair is (0, 0), whose declared outputs agree: no outputs row; the torch-only rule took
    # (1, 0), whose outputs differ, and called that a difference of the result
    rows = comparison.compare_runs(rerun, reference).rows()
    assert not [r for r in rows if r["facet"] == "outputs"]


def test_the_seed_names_have_one_spelling():
    root = Path(__file__).resolve().parents[1] / "repro500"
    spelled = '"python", "numpy", "torch", "loader"'
    owners = [p.relative_to(root).as_posix() for p in root.rglob("*.py") if spelled in p.read_text()]
    assert owners == ["capture/seeds.py"]
    assert SEED_NAMES == ("python", "numpy", "torch", "loader")


def test_where_the_runs_part_says_the_seeds_differ_when_no_reference_repeat_shares_them(tmp_path):
    reference = _run(tmp_path / "ref", {0: _repeat(A, "d-A", 0.9, "o-A")})
    rerun = _run(tmp_path / "rerun", {0: _repeat(B, "d-B", 0.8, "o-B"), 1: _repeat(B, "d-B", 0.8, "o-B")})
    found = divergence.check(rerun, SimpleNamespace(run=reference, manifest={}, path=reference.path))
    assert found.seeds_differ and found.status == "NONE"
    assert found.reason.startswith(f"{divergence.SEEDS_DIFFER}; within the rerun, 1 pair(s) of same-seed repeats")
    assert divergence.mlflow_records(found)[1] == {divergence.TAG: "seeds differ from the reference"}
    alone = divergence.check(_run(tmp_path / "one", {0: _repeat(B, "d-B", 0.8, "o-B")}),
                             SimpleNamespace(run=reference, manifest={}, path=reference.path))
    assert alone.status == "SKIPPED" and alone.reason == divergence.SEEDS_DIFFER
    shared = divergence.check(rerun, None)  # no reference: nothing said of seeds
    assert not shared.seeds_differ and divergence.SEEDS_DIFFER not in shared.reason
