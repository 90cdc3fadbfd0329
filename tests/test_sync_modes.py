"""Parameter averaging (mutable.sync): local SGD and gossip on two real Gloo ranks."""

from __future__ import annotations

import json

import pytest
from helpers.runs import COSMO, repro500, write_recipe

from repro500.runner import RunOptions, run
from repro500.workloads.engines.averaging import ring_neighbours


def _steps(run_dir, repeat=0):
    lines = (run_dir / f"repeats/{repeat}/metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "step"]


def _metrics(run_dir):
    return json.loads((run_dir / "repeats/0/summary.json").read_text())["metrics"]


def test_ring_neighbours():
    assert ring_neighbours(0, 2) == [1] and ring_neighbours(1, 2) == [0]
    assert ring_neighbours(0, 4) == [1, 3] and ring_neighbours(2, 4) == [1, 3]


@pytest.mark.slow  # two two-rank runs; the fast suite keeps DDP's own equivalence test
def test_averaging_every_step_trains_as_ddp_does(in_tmp, cosmo_data):  # noqa: F811
    """With SGD (momentum included: it is linear in the gradients), averaging the parameters after
    every step lands where DDP's averaged gradients do: the same numbers up to rounding."""
    recipe = write_recipe(in_tmp / "c.yaml", COSMO)
    ddp = run(RunOptions(recipe=str(recipe), tracking=False, run_id="ddp", nproc=2))
    avg = run(RunOptions(recipe=str(recipe), tracking=False, run_id="avg", nproc=2,
                         overrides=["sync.mode=average", "sync.every=1"]))
    # Not a derived float bound: float32 training in two summation orders drifts apart by rounding
    # amplified over the steps (no a priori bound for a nonlinear model); 1e-4 is ~1000 u32 of headroom
    # and still far below what a wrong average (a missing rank, a step of the sum) changes.
    for metric in ("mse", "mae"):
        assert _metrics(avg.run_dir)[metric] == pytest.approx(_metrics(ddp.run_dir)[metric], rel=1e-4, abs=1e-6)
    steps = _steps(avg.run_dir)
    params = json.loads((avg.run_dir / "repeats/0/summary.json").read_text())
    assert params["training"]["sync"] == {"mode": "average", "every": 1}
    assert all(s["synced"] and s["bytes_sent"] > 0 for s in steps)


@pytest.mark.slow  # two more two-rank runs
def test_local_sgd_every_4_sends_a_quarter_and_gossip_converges(in_tmp, cosmo_data):  # noqa: F811
    recipe = write_recipe(in_tmp / "c.yaml", COSMO)
    every1 = run(RunOptions(recipe=str(recipe), tracking=False, run_id="h1", nproc=2,
                            overrides=["sync.mode=average"]))
    every4 = run(RunOptions(recipe=str(recipe), tracking=False, run_id="h4", nproc=2,
                            overrides=["sync.mode=average", "sync.every=4"]))
    gossip = run(RunOptions(recipe=str(recipe), tracking=False, run_id="g", nproc=2,
                            overrides=["sync.mode=gossip", "sync.every=2"]))
    s1, s4, sg = _steps(every1.run_dir), _steps(every4.run_dir), _steps(gossip.run_dir)
    assert [s["synced"] for s in s4] == [(i + 1) % 4 == 0 for i in range(len(s4))]
    sent1, sent4 = sum(s["bytes_sent"] for s in s1), sum(s["bytes_sent"] for s in s4)
    assert sent4 == pytest.approx(sent1 * (len(s4) // 4) / len(s1))
    # on the sockets too: the epoch's measured bytes per step fall with H
    wire = [json.loads((d.run_dir / "repeats/0/summary.json").read_text())["metrics"]["wire_bytes_sent_per_step"]
            for d in (every1, every4)]
    if None not in wire:
        assert wire[1] < wire[0] / 2
    first, last = sg[0]["loss"], sg[-1]["loss"]
    assert last < first and _metrics(gossip.run_dir)["mae"] < 1.0


@pytest.mark.parametrize(("overrides", "code", "words"), [
    (["--set", "sync.every=0", "--nproc", "2"], 4, "mutable.sync.every must be at least 1"),
    (["--set", "sync.mode=gossip"], 2, "mutable.sync.mode gossip averages the parameters of several ranks"),
    (["--set", "sync.mode=average", "--nproc", "2", "--set", "compressor=topk"], 2, "drop the compressor"),
])
def test_a_sync_mode_that_cannot_run_is_refused_before_anything_is_written(in_tmp, overrides, code, words):
    recipe = write_recipe(in_tmp / "c.yaml", COSMO)
    proc = repro500("run", str(recipe), "--no-tracking", *overrides, cwd=in_tmp)
    assert proc.returncode == code, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert not (in_tmp / "runs").exists() or not any((in_tmp / "runs").iterdir())


def test_the_scaling_model_spreads_local_sgd_s_all_reduce_over_its_steps():
    from dataclasses import replace

    from repro500.scaling import predict, wire
    from repro500.scaling.alphabeta import CollectiveFit

    fits = {c: CollectiveFit(c, 1e-4, 2e-9, 1.0, 0.0, 0.0, 13) for c in ("allreduce", "allgather")}
    params = 269_722
    every1 = predict.Workload(params=params, buckets=[wire.Bucket(params, 1, 4 * params)], summable=True,
                              compute_time_s=0.05)
    every8 = replace(every1, every=8)
    a, b = predict.predict_one(every1, fits, 16), predict.predict_one(every8, fits, 16)
    assert a.bytes_per_rank == 2 * 15 * 4 * params // 16  # one ring all-reduce of the parameters
    assert b.bytes_per_rank == a.bytes_per_rank // 8
    assert b.comm_time_s == pytest.approx(a.comm_time_s / 8)


@pytest.mark.slow  # a two-rank run
def test_a_diverging_local_sgd_run_stops_together_at_an_averaging(in_tmp):
    """Between averagings no rank waits for another, so the loss is judged where they meet:
    every rank stops at the same step, none is left waiting, and the repeat is diverged."""
    recipe = write_recipe(in_tmp / "tiny.yaml", repeats=1, fixed__epochs=2,
                          mutable__optimizer={"name": "sgd", "lr": 1.0e12})
    outcome = run(RunOptions(recipe=str(recipe), nproc=2, tracking=False,
                             overrides=["sync.mode=average", "sync.every=3"]))
    summary = json.loads((outcome.run_dir / "repeats/0/summary.json").read_text())
    assert summary["status"] == "diverged", summary.get("error")
    steps = _steps(outcome.run_dir)
    # stopped where the ranks meet: an averaging, or the epoch's end (4 steps of 2 x 32 from 256 samples)
    last = steps[-1]
    assert (last["synced"] and last["step"] % 3 == 0) or last["step"] % 4 == 0, last
    assert "non-finite" in summary["error"] or "loss became" in summary["error"]
