"""Verdicts decided at their edges: exact replay, and a difference equal to the margin."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from helpers.rundirs import make_run
from rich.console import Console

from repro500.report.verdict_details import verdict_sections
from repro500.report.verdict_source import VerdictView
from repro500.rundir import sums as bundle
from repro500.verify import equivalence
from repro500.verify.determinism import machine_dependent
from repro500.verify.render import render
from repro500.verify.verdict import verify_run

# ------------------------------------------------------------------------ exact replay


def test_a_bitwise_identical_two_repeat_rerun_is_reproduced_exact(tmp_path):
    values = {"accuracy": [0.93, 0.94]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values)  # same seeds, same final parameters
    verdict = verify_run(rerun, against=ref)
    assert (verdict.status, verdict.exit_code, verdict.exact) == ("REPRODUCED", 0, True)
    assert verdict.reasons[0].startswith("exact replay: all 2 repeat(s) end with final parameters bitwise identical")
    # paired by seed, every difference is 0: decided exactly even with two repeats (Welch decided nothing)
    assert verdict.reasons[1].startswith("statistically REPRODUCED: accuracy: difference +0")
    assert verdict.equivalence[0].status == "REPRODUCED" and verdict.equivalence[0].tost["design"] == "paired"
    doc = verdict.to_dict()
    assert doc["status"] == "REPRODUCED" and doc["exact"] is True
    assert doc["exact_replay"]["pairs"] == [
        {"repeat": 0, "reference_repeat": 0, "seed": doc["exact_replay"]["pairs"][0]["seed"], "identical": True,
         "metrics_identical": True},
        {"repeat": 1, "reference_repeat": 1, "seed": doc["exact_replay"]["pairs"][1]["seed"], "identical": True,
         "metrics_identical": True},
    ]
    assert doc["exact_replay"]["params_identical"] is True and doc["exact_replay"]["metric_differences"] == []
    console = Console(record=True, width=120)
    render(verdict, console)
    assert "REPRODUCED (exact)  (exit 0)" in console.export_text()


def _rescore(run, k, **metrics):
    """Give repeat k other recorded metric values (its final parameters unchanged), as a
    non-deterministic evaluation, another evaluation set or an edit would, and re-seal the run
    so that it is consistent (a forger's or a second evaluation's result, not a torn file)."""
    rdir = run / "repeats" / str(k)
    summary = json.loads((rdir / "summary.json").read_text())
    if "accuracy" in metrics:  # Valid FLOPS follows the accuracy it was computed from
        vf = summary["valid_flops"]
        vf["achieved"] = metrics["accuracy"]
        metrics.setdefault("valid_flops", vf["flops_per_s"] * (metrics["accuracy"] / vf["target"]) ** vf["exponent"])
    summary["metrics"].update(metrics)
    (rdir / "summary.json").write_text(json.dumps(summary, indent=2))
    lines = (rdir / "metrics.jsonl").read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "epoch")
    record = json.loads(lines[last])
    record["metrics"].update({m: v for m, v in metrics.items() if m in record["metrics"]})
    lines[last] = json.dumps(record)
    (rdir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    aggregate = json.loads((run / "summary.json").read_text())
    for name, value in metrics.items():
        entry = aggregate["metrics"].setdefault(name, {"repeats": [], "values": []})
        if k in entry["repeats"]:
            entry["values"][entry["repeats"].index(k)] = value
        else:
            entry["repeats"].append(k)
            entry["values"].append(value)
    (run / "summary.json").write_text(json.dumps(aggregate, indent=2))
    bundle.write_sums(run)


def test_identical_parameters_with_a_differing_metric_are_named_and_the_statistics_decide(tmp_path):
    values = {"accuracy": [0.93, 0.94]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values)  # same seeds, same final parameters
    _rescore(rerun, 1, accuracy=0.95)  # ... but repeat 1 scored 0.95 where the reference scored 0.94
    verdict = verify_run(rerun, against=ref)
    assert verdict.integrity.ok and verdict.integrity.warnings == []
    # two repeats per side decide nothing statistically: before, the identical digests alone
    # made this REPRODUCED (exact)
    assert (verdict.status, verdict.exit_code, verdict.exact) == ("INCONCLUSIVE", 3, False)
    assert verdict.equivalence[0].status == "INCONCLUSIVE"
    replay = verdict.exact_replay
    assert replay.params_identical and not replay.exact
    assert replay.metric_differences == [
        {"repeat": 1, "reference_repeat": 1, "metric": "accuracy", "value": 0.95, "reference_value": 0.94}]
    assert [p["metrics_identical"] for p in replay.pairs] == [True, False]
    assert [p["identical"] for p in replay.pairs] == [True, True]  # the parameters, as before
    named = verdict.reasons[-1]
    assert named.startswith("not an exact replay: all 2 repeat(s) end with final parameters bitwise identical")
    assert "repeat 1 accuracy 0.95 vs reference repeat 1 0.94" in named
    assert "non-deterministic evaluation" in named and "edited records" in named
    assert verdict.reasons[0].startswith("accuracy: ")  # the statistical reason decides
    assert any("evaluate the same checkpoint twice" in a for a in verdict.advice)
    doc = json.loads(json.dumps(verdict.to_dict()))
    assert doc["exact"] is False and doc["status"] == "INCONCLUSIVE"
    assert doc["exact_replay"]["params_identical"] is True
    assert doc["exact_replay"]["metric_differences"][0]["metric"] == "accuracy"
    console = Console(record=True, width=400)
    render(verdict, console)
    text = console.export_text()
    assert "INCONCLUSIVE  (exit 3)" in text and "(exact)" not in text
    assert "Exact replay  not exact all 2 repeat(s)" in text
    html = str(verdict_sections(VerdictView(doc, "computed now")))
    block = html[html.index("<h3>Exact replay</h3>"):]
    assert '<td class="nw">accuracy</td><td class="nw">0.95</td><td class="nw">0.94</td>' in block.split("</div>")[0]


def test_identical_parameters_with_a_differing_metric_are_not_reproduced_on_statistics_that_pass(tmp_path):
    # three repeats with a spread: the statistics can decide, and they decide REPRODUCED, not "exact"
    values = {"accuracy": [0.930, 0.935, 0.940], "loss": [0.30, 0.31, 0.32]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values)
    _rescore(rerun, 0, loss=0.305)  # a metric no band or margin looks at
    verdict = verify_run(rerun, against=ref)
    assert (verdict.status, verdict.exact, verdict.headline) == ("REPRODUCED", False, "REPRODUCED")
    assert [(d["metric"], d["value"], d["reference_value"]) for d in verdict.exact_replay.metric_differences] == [
        ("loss", 0.305, 0.30)]
    assert "repeat 0 loss 0.305 vs reference repeat 0 0.3" in verdict.reasons[-1]


def test_times_and_rates_differing_still_make_an_exact_replay(tmp_path):
    values = {"accuracy": [0.93, 0.94]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values, time_to_quality_s=[41.0, 44.5])  # a slower machine
    ref_extra = {"epoch_time_s": 2.0, "total_time_s": 30.0, "train_time_s": 25.0}
    for k in (0, 1):
        _rescore(ref, k, **ref_extra)
        _rescore(rerun, k, throughput_samples_per_s=90.0 + k, flops_per_s=2.0e10, valid_flops=2.2e10,
                 epoch_time_s=4.1, total_time_s=61.0, train_time_s=50.0)
    verdict = verify_run(rerun, against=ref)
    assert (verdict.status, verdict.exact) == ("REPRODUCED", True)
    replay = verdict.exact_replay
    assert replay.metric_differences == [] and all(p["metrics_identical"] for p in replay.pairs)
    assert {"time_to_quality_s", "throughput_samples_per_s", "flops_per_s", "valid_flops", "epoch_time_s",
            "total_time_s", "train_time_s"} <= set(replay.ignored_metrics)
    assert "accuracy" not in replay.ignored_metrics and "epochs_to_quality" not in replay.ignored_metrics
    assert verdict.reasons[0].startswith("exact replay: all 2 repeat(s) end with final parameters bitwise identical")
    assert "with identical recorded metrics" in verdict.reasons[0]


def test_a_metric_only_one_side_recorded_breaks_exactness(tmp_path):
    values = {"accuracy": [0.93, 0.94]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values)
    _rescore(rerun, 0, top5=0.99)  # evaluated with another evaluator
    verdict = verify_run(rerun, against=ref)
    assert not verdict.exact and verdict.exact_replay.params_identical
    assert "repeat 0 top5 0.99 vs reference repeat 0 not recorded" in verdict.exact_replay.reason


@pytest.mark.parametrize(("name", "machine"), [
    ("time_to_quality_s", True), ("throughput_samples_per_s", True), ("valid_flops", True),
    ("wire_bytes_sent_per_step", True), ("epoch_time_s", True), ("time_eval_s", True), ("images_per_s", True),
    ("accuracy", False), ("loss", False), ("epochs_to_quality", False), ("train_flops", False),
    ("bytes_sent_per_step", False), ("compression_ratio", False), ("n_s", False), ("eval_error", False),
])
def test_which_metrics_an_exact_replay_leaves_out(name, machine):
    assert machine_dependent(name) is machine


def test_one_differing_digest_leaves_the_statistical_verdict(tmp_path):
    values = {"accuracy": [0.93, 0.94]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values, diverge={"repeat": 1, "epoch": 2, "tensor": "fc.weight"})
    verdict = verify_run(rerun, against=ref)
    # the same scores seed by seed: the paired test decides REPRODUCED, but no exact replay
    assert (verdict.status, verdict.exact) == ("REPRODUCED", False)
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
    bundle.write_sums(rerun)
    verdict = verify_run(rerun, against=ref)
    # a digest on one side only: the records differ, so no exact replay; the paired test decides
    assert verdict.status == "REPRODUCED" and not verdict.exact
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
