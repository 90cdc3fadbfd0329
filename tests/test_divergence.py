"""Where two runs part, from their records: the first step, the first step beyond a stated
tolerance, the evaluation and the last update, each placed in the order it happened; nothing past
the first divergence; the recorded difference that fits its shape, or none."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from helpers.rundirs import make_manifest, make_run

from repro500.locate import environment as locate_env
from repro500.locate.plan import LocatePlan
from repro500.rundir import sums as bundle
from repro500.verify import divergence as dv
from repro500.verify.rundir import load_run
from repro500.verify.verdict import verify_run


def steps(losses: list[float], per_epoch: int = 4, **extra: list) -> list[dict]:
    out = []
    for i, loss in enumerate(losses):
        values = {"loss": loss, "lr": 0.1, **{k: v[i] for k, v in extra.items()}}
        out.append({"step": i + 1, "epoch": i // per_epoch + 1, "values": values})
    return out


def records(losses: list[float], evaluations: dict | None = None, params: list | None = None, **extra) -> dv.Records:
    return dv.Records(steps=steps(losses, **extra), evaluations=evaluations or {}, params=params or [])


BASE = [2.30, 2.25, 2.20, 2.15, 2.10, 2.05, 2.00, 1.95]


def test_identical_records_do_not_part():
    found = dv.compare(records(BASE), records(list(BASE)))
    assert found["shape"] == "none" and found["steps_compared"] == 8


def test_times_rates_and_memory_are_the_machines_not_compared():
    a = records(BASE, step_time_s=[0.1] * 8, time_data_s=[0.01] * 8, peak_memory_bytes=[1] * 8)
    b = records(BASE, step_time_s=[0.2] * 8, time_data_s=[0.03] * 8, peak_memory_bytes=[9] * 8)
    for r in (a, b):  # as read_records keeps them: only the computed quantities
        for s in r.steps:
            s["values"] = dv.compared(s["values"])
    assert dv.compare(a, b)["shape"] == "none"


def test_a_difference_at_the_first_step_points_at_kernels():
    other = list(BASE)
    other[0] = BASE[0] + 2e-7  # the last bits of a float32 loss
    found = dv.compare(records(BASE), records(other))
    assert (found["shape"], found["first_step"], found["quantity"]) == ("first step", 1, "loss")
    # double: 2.30 + 2e-7 rounds by <= u 2.3 = 2.6e-16, 1.3e-9 of the difference: well inside approx's 1e-6
    assert found["abs_diff"] == pytest.approx(2e-7) and found["rel_diff"] == pytest.approx(2e-7 / other[0])
    assert found["first_step_beyond_tolerance"] is None  # rounding, never beyond 1e-3


def test_first_step_beyond_the_stated_tolerance():
    other = [x * (1 + 1e-6 * (i + 1)) if i < 5 else x * 1.01 for i, x in enumerate(BASE)]
    other[0] = BASE[0]
    found = dv.compare(records(BASE), records(other))
    assert found["first_step"] == 2 and found["first_step_beyond_tolerance"] == 6
    assert dv.compare(records(BASE), records(other), rtol=1e-7)["first_step_beyond_tolerance"] == 2


def test_a_difference_at_an_epoch_boundary_points_at_the_data_order():
    other = list(BASE)
    other[4] += 0.01  # step 5 opens epoch 2 (4 steps an epoch)
    found = dv.compare(records(BASE), records(other))
    assert (found["shape"], found["first_step"], found["first_epoch"]) == ("epoch boundary", 5, 2)


def test_nothing_is_claimed_past_the_first_divergence():
    other = list(BASE)
    other[2] += 0.01
    evaluations = {1: {"accuracy": 0.5}, 2: {"accuracy": 0.6}}
    theirs = {1: {"accuracy": 0.4}, 2: {"accuracy": 0.7}}  # after step 3: no claim
    found = dv.compare(records(BASE, evaluations), records(other, theirs))
    assert (found["shape"], found["first_step"]) == ("within training", 3)
    assert "evaluation_epoch" not in found and "params_epoch" not in found


def test_identical_steps_with_a_different_evaluation_point_at_the_evaluation():
    found = dv.compare(records(BASE, {1: {"accuracy": 0.5}, 2: {"accuracy": 0.6}}),
                       records(list(BASE), {1: {"accuracy": 0.5}, 2: {"accuracy": 0.61}}))
    assert (found["shape"], found["evaluation_epoch"]) == ("evaluation", 2)
    assert found.get("first_step") is None


def test_an_evaluation_that_differs_before_a_later_step_comes_first():
    other = list(BASE)
    other[6] += 0.01  # step 7, in epoch 2: after epoch 1's evaluation
    found = dv.compare(records(BASE, {1: {"accuracy": 0.5}}), records(other, {1: {"accuracy": 0.25}}))
    assert (found["shape"], found["evaluation_epoch"]) == ("evaluation", 1)


def test_identical_steps_and_evaluations_with_other_parameters_point_at_the_last_update():
    mine = [{"epoch": 1, "digest": "a", "tensors": {"w": "1", "b": "2"}},
            {"epoch": 2, "digest": "b", "tensors": {"w": "3", "b": "4"}}]
    theirs = [mine[0], {"epoch": 2, "digest": "c", "tensors": {"w": "3", "b": "5"}}]
    found = dv.compare(records(BASE, params=mine), records(list(BASE), params=theirs))
    assert (found["shape"], found["params_epoch"], found["params_tensor"]) == ("last update", 2, "b")


def test_one_run_with_fewer_steps():
    found = dv.compare(records(BASE), records(BASE[:5]))
    assert (found["shape"], found["first_step"], found["steps_compared"]) == ("length", 6, 5)


def test_no_records_is_said_as_such():
    assert dv.compare(dv.Records(), records(BASE))["shape"] == "unrecorded"


DIFFERENCES = [
    {"key": "environment.env.values.OMP_NUM_THREADS", "run": "1", "reference": "2", "impact": 65, "why": "threads"},
    {"key": "runtime.torch.num_threads", "run": 1, "reference": 2, "impact": 70, "why": "threads"},
    {"key": "data.entries.train.sha256", "run": "x", "reference": "y", "impact": 95, "why": "the input data differ"},
    {"key": "seeds.loader", "run": 1, "reference": 2, "impact": 90, "why": "different random seeds"},
    {"key": "environment.os.hostname", "run": "a", "reference": "b", "impact": 1, "why": "host"},
]


def test_causes_are_ranked_by_the_shape_of_the_divergence():
    kernels = dv.rank_causes("first step", DIFFERENCES)
    # different seeds explain a pair first, whatever the shape; then what fits the shape
    assert [c["key"] for c in kernels][:3] == ["seeds.loader", "environment.env.values.OMP_NUM_THREADS",
                                               "runtime.torch.num_threads"]
    assert "environment.os.hostname" not in [c["key"] for c in kernels]  # not result-relevant
    data = dv.rank_causes("epoch boundary", DIFFERENCES)
    assert data[0]["key"] == "seeds.loader" and data[1]["key"] == "data.entries.train.sha256"
    assert "it points at the data order" in dv.explain("epoch boundary", data)


def test_no_recorded_difference_explains_it():
    assert dv.rank_causes("within training", DIFFERENCES[-1:]) == []
    assert dv.explain("within training", []).endswith(dv.NO_CAUSE)


def test_an_operators_cause():
    plan = LocatePlan(a=None, b=None, k=0, j=0, same_run=True, pair=None, steps=1, reason="")  # type: ignore[arg-type]
    random_op = {"found": True, "reason": "different output", "op": "aten.randn.generator", "random_op": True,
                 "inputs_agree": True, "self_consistent": {"A": False, "B": False}}
    kinds = []
    for finding in (random_op, {**random_op, "op": "(batch)", "random_op": False, "self_consistent": {"A": True}},
                    {**random_op, "op": "aten.sum.default", "random_op": False, "self_consistent": {"A": True}}):
        import unittest.mock as mock

        with mock.patch.object(dv, "recorded_differences", return_value=DIFFERENCES):
            kinds.append(plan.explain(finding))
    # a run that differs from itself: the differences between the runs are named, not blamed
    assert kinds[0]["kind"] == "non-deterministic" and len(kinds[0]["causes"]) == 4
    assert "no difference between the runs is its cause" in kinds[0]["explanation"]
    assert kinds[1]["kind"] == "outside the operators" and kinds[1]["causes"][0]["key"] == "seeds.loader"
    assert kinds[2]["kind"] == "kernels" and kinds[2]["causes"][1]["key"] == "environment.env.values.OMP_NUM_THREADS"


def test_replays_run_with_the_runs_kernel_environment(tmp_path):
    manifest = make_manifest(environment={"env": {"values": {"OMP_NUM_THREADS": "1", "LANG": "C"},
                                                  "names": ["HOME", "MKL_LISTED"]}})
    run = load_run(make_run(tmp_path, manifest=manifest, values={"accuracy": [0.9, 0.9]}))
    env = locate_env.replay_environment(run, {"OMP_NUM_THREADS": "2", "MKL_VERBOSE": "1", "MKL_LISTED": "x", "HOME": "/h"})
    assert env == {"OMP_NUM_THREADS": "1", "MKL_VERBOSE": None}  # LANG is no kernel's; a listed name stays


def test_a_wrapped_commands_regex_metrics_are_its_steps(tmp_path):
    recipe = {"metrics": {"loss": {"source": "regex", "regex": r"loss ([0-9.]+)"}, "other": {"source": "mlflow"}}}
    for k, third in ((0, "0.70"), (1, "0.71")):
        repeat = tmp_path / "repeats" / str(k)
        repeat.mkdir(parents=True)
        repeat.joinpath("stdout.txt").write_text(f"start\nloss 0.90\nloss 0.80 noise\nloss {third}\nloss 0.6\n")
    a, b = dv.read_records(tmp_path, 0, recipe), dv.read_records(tmp_path, 1, recipe)
    assert [s["values"]["loss"] for s in a.steps] == [0.9, 0.8, 0.7, 0.6]
    found = dv.compare(a, b)
    assert (found["first_step"], found["shape"]) == (3, "within training")


def test_mlflow_gets_a_tag_and_the_step():
    section = dv.DivergenceResult(status="FOUND", reason="", pairs=[
        dv.PairDivergence(label="repeats 0 and 1", repeat=0, other_repeat=1, other="run", seed=1, source="x",
                          steps_compared=36, shape="within training", first_step=37)])
    metrics, tags = dv.mlflow_records(section)
    assert metrics == {dv.METRIC: 37.0} and tags[dv.TAG].startswith("step 37 (repeats 0 and 1")
    assert dv.mlflow_records(dv.DivergenceResult(status="NONE", reason=""))[1] == {dv.TAG: "none"}


def _with_losses(root: Path, k: int, losses: list[float]) -> None:
    path = root / "repeats" / str(k) / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line, loss in zip([r for r in lines if r["kind"] == "step"], losses, strict=False):
        line["loss"] = loss
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    bundle.write_sums(root)


def test_the_verdict_says_where_same_seed_repeats_part(tmp_path):
    root = make_run(tmp_path, values={"accuracy": [0.93, 0.93]}, torch_seeds=[7, 7],
                    diverge={"repeat": 1, "epoch": 2, "tensor": "fc.weight"})
    _with_losses(root, 1, [1.0, 0.5000001, 0.4])  # step 20 (epoch 2) parts
    doc = verify_run(root).to_dict()
    section = doc["divergence"]
    assert section["status"] == "FOUND" and section["first_step"] == 20
    pair = section["pairs"][0]
    assert (pair["label"], pair["shape"], pair["first_epoch"]) == ("repeats 0 and 1", "epoch boundary", 2)
    assert "determinism" in doc and doc["determinism"]["status"] == "FAIL"  # the decision stays determinism's


def test_the_verdict_compares_a_packed_reference_step_by_step(tmp_path):
    ref = make_run(tmp_path, "ref", values={"accuracy": [0.93, 0.94]})
    run = make_run(tmp_path, "run", values={"accuracy": [0.93, 0.94]})
    _with_losses(run, 0, [1.0 + 1e-6, 0.5, 0.3333333333333333])
    packed = tmp_path / "ref.tar.gz"
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(ref, arcname=ref.name)
    doc = verify_run(run, against=packed).to_dict()
    pairs = {(p["repeat"], p["other"]): p for p in doc["divergence"]["pairs"]}
    assert pairs[(0, "reference")]["first_step"] == 10 and pairs[(0, "reference")]["shape"] == "first step"
    assert pairs[(1, "reference")]["shape"] == "none"


def test_nothing_to_compare_is_skipped(tmp_path):
    doc = verify_run(make_run(tmp_path, values={"accuracy": [0.93, 0.94]})).to_dict()
    assert doc["divergence"]["status"] == "SKIPPED" and "--same-seed" in doc["divergence"]["reason"]


def test_records_from_elsewhere_that_hold_anything_are_read_as_far_as_they_make_sense(tmp_path):
    odd = [{"kind": "step", "step": True, "epoch": [1], "loss": "x"},
           {"kind": "step", "step": 99, "epoch": {"a": 1}, "loss": [0], "lr": "fast"},
           {"kind": "epoch", "epoch": "one", "metrics": {"accuracy": 0.5}},
           {"kind": "epoch", "epoch": 9, "metrics": ["not", "a", "dict"]}]
    repeat = tmp_path / "repeats" / "0"
    repeat.mkdir(parents=True)
    repeat.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in odd) + "not json\n[1]\n")
    read = dv.read_records(tmp_path, 0)
    assert [s["step"] for s in read.steps] == [99] and read.steps[0]["epoch"] is None
    assert read.steps[0]["values"] == {} and read.evaluations == {9: {}}
    root = make_run(tmp_path, values={"accuracy": [0.93, 0.93]}, torch_seeds=[7, 7])
    for k in (0, 1):
        path = root / "repeats" / str(k) / "metrics.jsonl"
        path.write_text(path.read_text() + "".join(json.dumps(r) + "\n" for r in odd[:3]) + "not json\n")
    bundle.write_sums(root)
    section = verify_run(root).to_dict()["divergence"]
    assert section["status"] == "NONE"  # the well-formed records agree; the rest is left out, not a crash


def test_a_reproductions_rebuilt_venv_is_where_its_replay_runs(tmp_path):
    from repro500.publish.rebuild import MARKER

    python = tmp_path / "out" / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    manifest = make_manifest(environment={"python": {"executable": str(python), "version": "3.11.7"}})
    run = load_run(make_run(tmp_path, manifest=manifest, values={"accuracy": [0.9, 0.9]}))
    assert locate_env.own_interpreter(run) is None  # not built by reproduce: named, never run
    (tmp_path / "out" / "env" / MARKER).write_text("digest\n")
    assert locate_env.own_interpreter(run) == str(python)
