"""Loading a fabricated run directory (helpers/rundirs.py writes it by the contract)."""

from __future__ import annotations

import json

import pytest
from helpers.rundirs import edit_json, make_run

from repro500.errors import InvalidInput
from repro500.rundir import sums as bundle
from repro500.verify import integrity
from repro500.verify.rundir import load_run

# ------------------------------------------------------------------------- tests


def test_fabricated_run_is_consistent_by_every_integrity_check(tmp_path):
    root = make_run(tmp_path)
    check = integrity.check_files(root)
    run = load_run(root)
    integrity.check_aggregate(run, check)
    integrity.check_consistency(run, check)
    assert check.ok, check.problems
    assert check.warnings == []
    assert run.values("accuracy") == [0.93, 0.94, 0.935]
    assert run.acceptance[0].threshold == pytest.approx(0.88)


def test_only_completed_repeats_contribute_values(tmp_path):
    root = make_run(tmp_path, values={"accuracy": [0.93, 0.5, 0.94]}, statuses=["completed", "diverged", "completed"])
    run = load_run(root)
    assert run.values("accuracy") == [0.93, 0.94]
    assert run.unsuccessful == {1: "diverged"}


def test_corrupt_summary_is_one_clear_error(tmp_path):
    root = make_run(tmp_path)
    (root / "repeats" / "0" / "summary.json").write_text("{not json")
    with pytest.raises(InvalidInput, match=r"repeats/0/summary.json is not valid JSON"):
        load_run(root)


def test_non_numeric_metric_is_refused_with_its_location(tmp_path):
    root = make_run(tmp_path)
    edit_json(root / "repeats" / "1" / "summary.json", lambda d: d["metrics"].update(accuracy="high"))
    with pytest.raises(InvalidInput, match=r"metrics.accuracy is 'high', not a number"):
        load_run(root)


def test_acceptance_falls_back_to_recipe_yaml(tmp_path):
    root = make_run(tmp_path)
    edit_json(root / "summary.json", lambda d: d.pop("acceptance"))
    run = load_run(root)
    assert [c.metric for c in run.acceptance] == ["accuracy"]


def test_an_epoch_record_whose_metrics_are_not_an_object_is_no_traceback(tmp_path):
    root = make_run(tmp_path)
    path = root / "repeats" / "0" / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for record in lines:
        if record.get("kind") == "epoch":
            record["metrics"] = [0.9]  # a record from elsewhere may hold anything
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    bundle.write_sums(root)
    result, _ = integrity.check_run(root, deep=True)
    assert isinstance(result.problems, list)
