"""Verdicts decided at their edges: exact replay, and a difference equal to the margin."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from rich.console import Console
from test_verify_rundir import make_run

from repro500.verify import equivalence
from repro500.verify.verdict import render, verify_run

# ------------------------------------------------------------------------ exact replay


def test_a_bitwise_identical_two_repeat_rerun_is_reproduced_exact(tmp_path):
    values = {"accuracy": [0.93, 0.94]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values)  # same seeds, same final parameters
    verdict = verify_run(rerun, against=ref)
    assert (verdict.status, verdict.exit_code, verdict.exact) == ("REPRODUCED", 0, True)
    assert verdict.reasons[0].startswith("exact replay: all 2 repeat(s) end with final parameters bitwise identical")
    assert verdict.reasons[1].startswith("statistically INCONCLUSIVE: accuracy:")  # two repeats decide nothing
    assert verdict.equivalence[0].status == "INCONCLUSIVE"
    doc = verdict.to_dict()
    assert doc["status"] == "REPRODUCED" and doc["exact"] is True
    assert doc["exact_replay"]["pairs"] == [
        {"repeat": 0, "reference_repeat": 0, "seed": doc["exact_replay"]["pairs"][0]["seed"], "identical": True},
        {"repeat": 1, "reference_repeat": 1, "seed": doc["exact_replay"]["pairs"][1]["seed"], "identical": True},
    ]
    console = Console(record=True, width=120)
    render(verdict, console)
    assert "REPRODUCED (exact)  (exit 0)" in console.export_text()


def test_one_differing_digest_leaves_the_statistical_verdict(tmp_path):
    values = {"accuracy": [0.93, 0.94]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values, diverge={"repeat": 1, "epoch": 2, "tensor": "fc.weight"})
    verdict = verify_run(rerun, against=ref)
    assert (verdict.status, verdict.exact) == ("INCONCLUSIVE", False)
    assert "[1]" in verdict.exact_replay.reason
    assert verdict.to_dict()["exact"] is False


def test_no_exact_replay_without_digests_or_against_published_numbers(tmp_path):
    values = {"accuracy": [0.93, 0.94]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values)
    for k in (0, 1):
        path = rerun / "repeats" / str(k) / "summary.json"
        doc = json.loads(path.read_text())
        doc["final_param_digest"] = None
        path.write_text(json.dumps(doc))
    summary = json.loads((rerun / "summary.json").read_text())
    summary["final_param_digests"] = {}
    (rerun / "summary.json").write_text(json.dumps(summary))
    from repro500 import bundle

    bundle.write_sums(rerun)
    verdict = verify_run(rerun, against=ref)
    assert verdict.status == "INCONCLUSIVE" and not verdict.exact
    assert "records no final parameter digest" in verdict.exact_replay.reason
    published = _published(tmp_path, value=0.935, margin=0.01)
    assert verify_run(ref, against=published).exact_replay is None


def test_an_incomplete_rerun_is_never_an_exact_replay(tmp_path):
    values = {"accuracy": [0.93, 0.94]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values, statuses=["completed", "killed"])
    verdict = verify_run(rerun, against=ref)
    assert verdict.status == "INCONCLUSIVE" and not verdict.exact
    assert "1 (killed)" in verdict.exact_replay.reason


# ------------------------------------------------------------------ margins at the edge


def _published(tmp_path, *, value, margin, test="equivalence"):
    path = tmp_path / f"published-{value}-{margin}-{test}.yaml"
    path.write_text(yaml.safe_dump({
        "schema": "repro500/published/v1", "benchmark": "edge case",
        "source": {"citation": "a test"},
        "metrics": {"accuracy": {"value": value, "margin": margin, "direction": "higher", "test": test}},
    }))
    return path


@pytest.mark.parametrize("value", [0.935, 0.925])
def test_three_repeats_exactly_on_the_margin_are_reproduced_on_both_sides(tmp_path, value):
    run = make_run(tmp_path, values={"accuracy": [value] * 3})
    verdict = verify_run(run, against=_published(tmp_path, value=0.93, margin=0.005))
    assert (verdict.status, verdict.exit_code) == ("REPRODUCED", 0), verdict.reasons
    assert verdict.equivalence[0].tost["exact_diff"] in ("0.005", "-0.005")


def _ulps(x: float, n: int, towards: float) -> float:
    for _ in range(n):
        x = math.nextafter(x, towards)
    return x


@pytest.mark.parametrize("n", [1, 2, 5])
def test_ulp_neighbours_of_the_edge_fall_on_their_own_side(n):
    def status(v):
        return equivalence.compare_values("accuracy", [v] * 3, [0.93], 0.005, 0.05, single_value=True).status

    assert status(_ulps(0.935, n, 0.0)) == "REPRODUCED"      # just inside the upper edge
    assert status(_ulps(0.935, n, 1.0)) == "NOT REPRODUCED"  # beyond it by more than rounding
    assert status(_ulps(0.925, n, 1.0)) == "REPRODUCED"
    assert status(_ulps(0.925, n, 0.0)) == "NOT REPRODUCED"


def test_the_edge_is_exact_for_two_sample_and_non_inferiority_too():
    two = equivalence.compare_values("accuracy", [0.935] * 3, [0.93] * 3, 0.005, 0.05)
    assert two.status == "REPRODUCED" and "difference +0.005 (zero variance, exact in decimal)" in two.reason
    beyond = equivalence.compare_values("accuracy", [math.nextafter(0.935, 1.0)] * 3, [0.93] * 3, 0.005, 0.05)
    assert beyond.status == "NOT REPRODUCED" and "+0.0050000000000002" in beyond.reason
    floor = equivalence.compare_values("accuracy", [0.925] * 3, [0.93], 0.005, 0.05, single_value=True,
                                       test="non_inferiority", direction="higher")
    assert floor.status == "REPRODUCED"
    below = equivalence.compare_values("accuracy", [math.nextafter(0.925, 0.0)] * 3, [0.93], 0.005, 0.05,
                                       single_value=True, test="non_inferiority", direction="higher")
    assert below.status == "NOT REPRODUCED"


def test_a_band_met_exactly_at_its_edge_passes_and_one_ulp_short_fails():
    import math

    from repro500.verify.bands import check_band
    from repro500.verify.rundir import Criterion

    higher = Criterion("accuracy", 0.93, "higher", 0.005)
    lower = Criterion("loss", 0.93, "lower", 0.005)
    assert check_band(higher, [0.925] * 3, 0.05).status == "PASS"
    assert check_band(lower, [0.935] * 3, 0.05).status == "PASS"
    assert check_band(higher, [math.nextafter(0.925, 0)] * 3, 0.05).status == "FAIL"
    assert check_band(lower, [math.nextafter(0.935, 1)] * 3, 0.05).status == "FAIL"
