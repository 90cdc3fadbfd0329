"""A factorial run's cells vary exactly the source they name: everything a repeat draws at random
comes from its recorded seeds, so a cell that holds a seed holds what that seed decides."""

from __future__ import annotations

import json

import pytest
from helpers.runs import TINY_CLASSIFICATION, write_recipe

from repro500.capture import seeds as seeding
from repro500.runner import RunOptions, run
from repro500.verify import variance
from repro500.verify.rundir import load_run
from repro500.workloads.trainer import build as blocks
from repro500.workloads.trainer.records import compressor_spec
from repro500.workloads.trainer.spec import Dist, TrainSpec

MASTER = 7


def _order(seeds: seeding.Seeds, world_size: int) -> list[int]:
    """The sample indices this rank trains on in its first epoch, in order."""
    spec = TrainSpec.from_recipe(TINY_CLASSIFICATION["fixed"], TINY_CLASSIFICATION["mutable"])
    loader, _, _ = blocks.build_data(spec, Dist(rank=seeds.rank, world_size=world_size), seeds)
    return [int(i) for batch in loader.batch_sampler for i in batch]


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_data_order_follows_the_recorded_loader_seed_of_rank_0(world_size):
    from torch.utils.data import DistributedSampler

    repeats = 4
    cells = list(seeding.SOURCES)
    recorded = seeding.plan(MASTER, repeats * len(cells), world_size,
                            varied=[seeding.SOURCES[c] for c in cells for _ in range(repeats)])
    n = TINY_CLASSIFICATION["fixed"]["dataset"]["params"]["train_samples"]
    batch = TINY_CLASSIFICATION["mutable"]["batch_size"]
    for i, cell in enumerate(cells):
        k = i * repeats + repeats - 1  # the cell's last repeat: its index differs from the base's
        for rank in range(world_size):
            seeds = seeding.derive_varied(MASTER, k, rank, seeding.SOURCES[cell])
            order = _order(seeds, world_size)
            # what the record says decided it: rank 0's loader seed, whatever this rank's own
            sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True,
                                         seed=recorded[k]["ranks"][0]["loader"] % 2**62, drop_last=True)
            expected = list(sampler)[: len(order)]
            assert order == expected and len(order) == (n // (batch * world_size)) * batch, (cell, rank)
            base = _order(seeding.derive(MASTER, 0, rank), world_size)
            assert (order == base) == ("loader" not in seeding.SOURCES[cell]), (cell, rank)


def test_a_seeded_compressor_draws_from_the_recorded_seeds_of_rank_0():
    recorded = seeding.plan(MASTER, 4, 2, varied=[seeding.SOURCES["init"]] * 2 + [seeding.SOURCES["kernels"]] * 2)
    for k in range(4):
        for rank in range(2):
            seeds = seeding.derive_varied(MASTER, k, rank, seeding.SOURCES["init" if k < 2 else "kernels"])
            assert compressor_spec("qsgd", seeds)["seed"] == recorded[k]["ranks"][0]["torch"] % 2**31, (k, rank)
    # an ordinary repeat's compressor seed is what it always was: published runs still rerun alike
    assert compressor_spec("qsgd", seeding.derive(MASTER, 3, 1))["seed"] == seeding.derive(MASTER, 3, 0).torch % 2**31


@pytest.mark.parametrize("source", ["data_order", "init"])
def test_a_cell_that_varies_one_source_gets_all_the_variance(in_tmp, source):
    # One epoch on 128 samples: a few seconds. The loss is continuous, so two repeats that trained
    # differently cannot tie by chance as a 128-sample accuracy can.
    recipe = write_recipe(in_tmp / "tiny.yaml", fixed__epochs=1, fixed__dataset__params__train_samples=128,
                          acceptance={"loss": {"target": 100.0, "direction": "lower", "tolerance": 0.0}})
    outcome = run(RunOptions(recipe=str(recipe), tracking=False, run_id="v", vary=[source, "kernels"],
                             repeats_per_cell=2))
    assert outcome.exit_code in (0, 1, 3)
    root = in_tmp / "runs/v"
    summaries = [json.loads((root / f"repeats/{k}/summary.json").read_text()) for k in range(4)]
    assert all(s["status"] == "completed" for s in summaries)
    digests = [s["final_param_digest"] for s in summaries]
    # the record keeps its fields: what a cell holds is read from the same seeds as always
    planned = json.loads((root / "manifest.json").read_text())["facets"]["seeds"]["plan"]
    fields = {"master", "repeat", "rank", "python", "numpy", "torch", "loader"}
    assert all(set(s["seeds"]) == fields == set(p["ranks"][0]) for s, p in zip(summaries, planned, strict=True))
    # the kernels cell holds every seed; on a CPU its kernels are deterministic, so it ends with
    # repeat 0's parameters, bit for bit (repeat 0 is the base: every seed its own is the base's)
    held = [{name: s["seeds"][name] for name in seeding.SOURCES["seed"]} for s in summaries]
    assert held[2] == held[3] == held[0]
    assert digests[2] == digests[3] == digests[0], digests
    assert digests[1] != digests[0]  # the named source did vary
    (result,) = variance.decompose(load_run(root), 0.05)
    by = {c.source: c for c in result.components}
    assert by["kernels"].variance == 0.0 and by[source].variance > 0.0
    assert result.dominant == source and by[source].share == 1.0 and by["kernels"].share == 0.0
