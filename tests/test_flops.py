"""Valid FLOPS (HPC AI500): one formula, uncapped, in the trainer and in the verdict."""

from __future__ import annotations

import io
import json

import pytest
from helpers.rundirs import edit_json, make_run
from rich.console import Console

from repro500.rundir import sums as bundle
from repro500.verify.flops import recompute
from repro500.verify.render import render
from repro500.verify.verdict import verify_run
from repro500.workloads.trainer.metrics import valid_flops


def test_quality_above_the_target_is_awarded_and_below_it_penalised():
    # HPC AI500 section 4.3: the coefficient penalises *or awards*; 4e10 FLOP/s, target 0.9, n = 5
    assert valid_flops(4.0e10, 0.93, 0.9, "higher", 5) == pytest.approx(4.0e10 * (0.93 / 0.9) ** 5)
    # not capped at 4e10; the reference is printed to 5 significant figures (4.71262e10), rel 1e-4 covers that
    assert valid_flops(4.0e10, 0.93, 0.9, "higher", 5) == pytest.approx(4.7126e10, rel=1e-4)
    assert valid_flops(4.0e10, 0.81, 0.9, "higher", 5) == pytest.approx(4.0e10 * 0.9**5)
    assert valid_flops(4.0e10, 0.9, 0.9, "higher", 5) == pytest.approx(4.0e10)


def test_lower_is_better_inverts_the_ratio():
    # MAE 0.10 against a target of 0.124 beats it: (0.124 / 0.10)^5 > 1
    assert valid_flops(1.0e9, 0.10, 0.124, "lower", 5) == pytest.approx(1.0e9 * 1.24**5)
    assert valid_flops(1.0e9, 0.248, 0.124, "lower", 5) == pytest.approx(1.0e9 * 0.5**5)


@pytest.mark.parametrize(
    ("achieved", "target", "direction"),
    [(0.0, 0.124, "lower"), (0.5, 0.0, "higher"), (float("nan"), 0.9, "higher"), (1e-80, 0.124, "lower")],
)
def test_undefined_ratio_gives_none_not_inf_or_nan(achieved, target, direction):
    # summary.json is written with allow_nan=False: inf or NaN here would crash the repeat
    assert valid_flops(4.0e10, achieved, target, direction, 5) is None


@pytest.mark.parametrize(
    ("achieved", "target", "direction"),
    [(0.93, 0.9, "higher"), (0.5, 0.9, "higher"), (0.0, 0.9, "higher"), (0.3, 0.42, "lower"), (0.6, 0.42, "lower")],
)
def test_the_verifier_recomputes_exactly_what_the_trainer_records(achieved, target, direction):
    inputs = {"flops_per_s": 3.3e11, "achieved": achieved, "target": target, "direction": direction, "exponent": 5}
    # the same double operations (a division, libm pow within 1 ulp, a product) on the same inputs:
    # equal to a few ulp (pow's error times 5 at most), 1e-12 is headroom
    assert recompute(inputs) == pytest.approx(valid_flops(3.3e11, achieved, target, direction, 5), rel=1e-12)


def _rewrite_recorded(run, repeat, value):
    """A run whose repeat records a Valid FLOPS its inputs do not give, with consistent digests."""
    edit_json(run / "repeats" / str(repeat) / "summary.json", lambda d: d["metrics"].update(valid_flops=value))
    edit_json(run / "summary.json", lambda d: d["metrics"]["valid_flops"]["values"].__setitem__(repeat, value))
    bundle.write_sums(run)


def test_verdict_shows_the_inputs_and_no_mismatch_for_a_clean_run(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.93, 0.94, 0.935]})
    doc = verify_run(run).to_dict()["valid_flops"]
    assert doc["formula"] == "valid_flops = flops_per_s * (achieved / target) ** exponent"
    assert doc["mismatches"] == []
    first = doc["repeats"][0]
    assert (first["flops_per_s"], first["achieved"], first["target"], first["exponent"], first["direction"]) == (
        4.0e10, 0.93, 0.9, 5.0, "higher")
    assert first["recomputed"] == pytest.approx(4.0e10 * (0.93 / 0.9) ** 5)
    assert first["recomputed"] > first["flops_per_s"]  # above the target: awarded, not capped
    json.dumps(doc, allow_nan=False)


def test_recorded_value_that_disagrees_with_its_inputs_is_listed(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.93, 0.94, 0.935]})
    _rewrite_recorded(run, 1, 4.0e10)  # what a ratio capped at 1 would have recorded
    verdict = verify_run(run)
    assert verdict.status != "INVALID"
    assert verdict.valid_flops.mismatches == [
        f"repeat 1: recorded valid_flops 4e+10 but its inputs give {4.0e10 * (0.94 / 0.9) ** 5:.6g}"]
    out = io.StringIO()
    render(verdict, Console(file=out, width=200))
    assert "repeat 1: recorded valid_flops 4e+10" in out.getvalue()


def test_recorded_value_without_inputs_is_listed(tmp_path):
    run = make_run(tmp_path)
    edit_json(run / "repeats" / "2" / "summary.json", lambda d: d["valid_flops"].pop("achieved"))
    bundle.write_sums(run)
    mismatches = verify_run(run).valid_flops.mismatches
    assert len(mismatches) == 1 and mismatches[0].startswith("repeat 2:") and "cannot be recomputed" in mismatches[0]


def test_lower_is_better_run_is_recomputed_and_shown_with_the_inverted_ratio(tmp_path):
    run = make_run(tmp_path)
    value = 1.0e9 * (0.42 / 0.3) ** 5  # MAE 0.3 against a target of 0.42: awarded

    def lower(doc):
        doc["valid_flops"] = {"flops_per_s": 1.0e9, "achieved": 0.3, "target": 0.42, "direction": "lower",
                              "exponent": 5}
        doc["metrics"]["valid_flops"] = value

    for k in range(3):
        edit_json(run / "repeats" / str(k) / "summary.json", lower)
    edit_json(run / "summary.json", lambda d: d["metrics"]["valid_flops"].update(values=[value] * 3))
    bundle.write_sums(run)
    verdict = verify_run(run)
    assert verdict.valid_flops.mismatches == []
    assert verdict.valid_flops.repeats[0]["recomputed"] == pytest.approx(value)
    out = io.StringIO()
    render(verdict, Console(file=out, width=200))
    assert "1e+09 FLOP/s x (0.42 / 0.3)^5 = 5.378e+09" in out.getvalue()
