"""A rerun judged seed by seed: the paired equivalence test on per-seed differences, the exact
replay by recorded metrics, and a wrapped command's output passed through as it came."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers.rundirs import make_run
from helpers.runs import repro500
from rich.console import Console
from scipy import stats as sps

from repro500.rundir import sums as bundle
from repro500.verify import stats
from repro500.verify.equivalence import classify
from repro500.verify.render import render
from repro500.verify.verdict import verify_run

PPL = {"test_ppl": {"target": 200.0, "direction": "lower", "tolerance": 10.0}}  # margin ±10, as published
# three seeds of a word-level language model: the spread between seeds (~25) swamps the margin
PPL_VALUES = [112.31, 151.87, 98.42]


# --------------------------------------------------------------------------- the paired test


def test_paired_tost_is_the_one_sample_test_of_the_differences():
    rng = np.random.default_rng(5)
    seed_effect = rng.normal(0, 25, 6)
    a, b = 100 + seed_effect + rng.normal(0, 0.5, 6), 100 + seed_effect + rng.normal(0, 0.5, 6)
    margin, alpha = 2.0, 0.05
    res = stats.tost_paired(a, b, margin, alpha)
    d = a - b
    p_lower = sps.ttest_1samp(d, -margin, alternative="greater").pvalue
    p_upper = sps.ttest_1samp(d, margin, alternative="less").pvalue
    # one scipy t tail on a double statistic computed in another order: 1e-10 is headroom
    assert (res.p_lower, res.p_upper) == pytest.approx((p_lower, p_upper), rel=1e-10)
    ci = sps.ttest_rel(a, b).confidence_interval(1 - 2 * alpha)
    assert (res.ci_low, res.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert res.df == 5 and res.design == "paired" and res.std_diff == pytest.approx(np.std(d, ddof=1))
    assert classify(res, "equivalence", "higher")[0] == "REPRODUCED"
    # the same values as two independent samples: the spread between seeds swamps the margin
    welch = stats.tost_two_sample(a, b, margin, alpha)
    assert classify(welch, "equivalence", "higher")[0] == "INCONCLUSIVE"


@pytest.mark.parametrize(("offset", "margin", "status"), [
    (0.0, 10.0, "REPRODUCED"), (4.0, 10.0, "REPRODUCED"), (-15.0, 10.0, "NOT REPRODUCED"),
    (15.0, 10.0, "NOT REPRODUCED"), (10.0, 10.0, "REPRODUCED"),  # on the edge: inside, in decimal
])
def test_differences_that_are_all_equal_are_decided_exactly_never_nan(offset, margin, status):
    ref = PPL_VALUES
    run = [v + offset for v in ref]
    res = stats.tost_paired(run, ref, margin)
    assert res.exact and res.std_diff == 0.0
    assert res.ci_low == res.ci_high == pytest.approx(offset)
    assert classify(res, "equivalence", "lower")[0] == status
    json.dumps(res.to_dict(), allow_nan=False)


def test_one_pair_gives_no_interval():
    res = stats.tost_paired([1.0], [1.0], 0.5)
    assert res.ci_low is None and "1 pair(s)" in res.notes[0]
    with pytest.raises(ValueError, match="as many"):
        stats.tost_paired([1.0, 2.0], [1.0], 0.5)


# --------------------------------------------------------------------- verdicts on run directories


def _drop_digests(run):
    """A wrapped command's repeats: no parameters digested, metrics only."""
    for k in range(len(list((run / "repeats").iterdir()))):
        path = run / "repeats" / str(k) / "summary.json"
        doc = json.loads(path.read_text())
        doc["final_param_digest"] = None
        path.write_text(json.dumps(doc))
        (run / "repeats" / str(k) / "params.jsonl").unlink(missing_ok=True)
    summary = json.loads((run / "summary.json").read_text())
    summary["final_param_digests"] = {}
    (run / "summary.json").write_text(json.dumps(summary))
    bundle.write_sums(run)
    return run


def test_a_command_rerun_printing_the_same_values_seed_by_seed_is_reproduced_exact(tmp_path):
    values = {"test_ppl": PPL_VALUES}
    ref = _drop_digests(make_run(tmp_path, "ref", values=values, acceptance=PPL))
    rerun = _drop_digests(make_run(tmp_path, "rerun", values=values, acceptance=PPL))
    verdict = verify_run(rerun, against=ref)
    assert (verdict.status, verdict.exit_code, verdict.exact) == ("REPRODUCED", 0, True)
    assert verdict.reasons[0].startswith("exact replay: all 3 repeat(s) recorded the same values")
    assert "identical recorded metrics (" in verdict.reasons[0] and "test_ppl" in verdict.reasons[0]
    assert "no final parameter digests to compare" in verdict.reasons[0]
    eq = verdict.equivalence[0]
    assert eq.status == "REPRODUCED" and eq.tost["design"] == "paired" and eq.tost["exact"]
    assert eq.tost["design_reason"].startswith("paired by seed: 3 rerun repeat(s) share their seeds")
    assert [p["repeat"] for p in eq.tost["pairs"]] == [0, 1, 2]
    doc = json.loads(json.dumps(verdict.to_dict(), allow_nan=False))
    assert doc["exact"] is True and doc["equivalence"][0]["tost"]["design"] == "paired"
    console = Console(record=True, width=200)
    render(verdict, console)
    text = console.export_text()
    assert "REPRODUCED (exact)  (exit 0)" in text and "paired TOST (per-seed differences)" in text
    assert "paired by seed: 3 rerun repeat(s)" in text


def test_a_trainer_rerun_with_identical_parameters_and_metrics_is_reproduced_exact(tmp_path):
    values = {"accuracy": [0.93, 0.94, 0.935]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values)
    verdict = verify_run(rerun, against=ref)
    assert (verdict.status, verdict.exact) == ("REPRODUCED", True)
    assert verdict.reasons[0].startswith("exact replay: all 3 repeat(s) end with final parameters bitwise identical")
    assert verdict.reasons[1].startswith("statistically REPRODUCED: accuracy: difference +0")
    assert verdict.exact_replay.params_identical


def test_identical_metrics_with_parameters_that_differ_are_no_exact_replay(tmp_path):
    values = {"accuracy": [0.93, 0.94, 0.935]}
    ref = make_run(tmp_path, "ref", values=values)
    rerun = make_run(tmp_path, "rerun", values=values, diverge={"repeat": 2, "epoch": 1, "tensor": "fc.weight"})
    verdict = verify_run(rerun, against=ref)
    assert (verdict.status, verdict.exact) == ("REPRODUCED", False)  # the paired statistics decide
    assert "[2]" in verdict.exact_replay.reason


def test_a_constant_offset_beyond_the_margin_is_not_reproduced(tmp_path):
    ref = _drop_digests(make_run(tmp_path, "ref", values={"test_ppl": PPL_VALUES}, acceptance=PPL))
    worse = _drop_digests(make_run(tmp_path, "worse", values={"test_ppl": [v + 12.5 for v in PPL_VALUES]},
                                   acceptance=PPL))
    verdict = verify_run(worse, against=ref)
    assert (verdict.status, verdict.exit_code) == ("NOT REPRODUCED", 1)
    assert "difference +12.5" in verdict.reasons[0] and "(paired by seed, 3 pairs)" in verdict.reasons[0]
    assert not verdict.exact and "repeat(s) [0, 1, 2] recorded metrics that differ" in verdict.exact_replay.reason


def test_noise_below_the_margin_on_a_large_seed_spread_is_reproduced_paired_not_unpaired(tmp_path):
    rng = np.random.default_rng(17)
    seed_effect = rng.normal(0, 25, 4)
    ref_values = [round(100 + s + e, 4) for s, e in zip(seed_effect, rng.normal(0, 0.5, 4), strict=True)]
    run_values = [round(100 + s + e, 4) for s, e in zip(seed_effect, rng.normal(0, 0.5, 4), strict=True)]
    ref = make_run(tmp_path, "ref", values={"test_ppl": ref_values}, acceptance=PPL)
    rerun = make_run(tmp_path, "rerun", values={"test_ppl": run_values}, acceptance=PPL)
    paired = verify_run(rerun, against=ref)
    assert paired.status == "REPRODUCED" and not paired.exact
    assert paired.equivalence[0].tost["design"] == "paired"
    # the same reference values under other seeds: nothing pairs, Welch cannot tell
    other = make_run(tmp_path, "other", values={"test_ppl": ref_values}, acceptance=PPL, torch_seeds=[1, 2, 3, 4])
    unpaired = verify_run(rerun, against=other)
    eq = unpaired.equivalence[0]
    assert unpaired.status == "INCONCLUSIVE" and eq.tost["method"] == "two-sample Welch TOST"
    assert eq.tost["design"] == "unpaired" and "no rerun repeat shares its seeds" in eq.tost["design_reason"]
    assert eq.repeats_needed > 10


def test_the_advice_of_a_paired_test_uses_the_spread_of_the_differences(tmp_path):
    ref_values = [100.0, 150.0, 80.0]
    ref = make_run(tmp_path, "ref", values={"test_ppl": ref_values}, acceptance=PPL)
    rerun = make_run(tmp_path, "rerun", values={"test_ppl": [v + d for v, d in zip(ref_values, [3.0, -4.0, 6.0],
                                                                                       strict=True)]}, acceptance=PPL)
    verdict = verify_run(rerun, against=ref)
    eq = verdict.equivalence[0]
    assert eq.status == "INCONCLUSIVE" and eq.tost["design"] == "paired"
    sd = float(np.std([3.0, -4.0, 6.0], ddof=1))
    expected, _ = stats.equivalence_repeats(5.0 / 3.0, sd, 10.0, 0.05)
    assert eq.repeats_needed == expected and expected < 15  # Welch on the values' spread (~35) needs hundreds
    assert any("repeats on both, with the same seeds" in a and "per-seed differences" in a for a in verdict.advice)


def test_a_rerun_with_repeats_beyond_the_reference_pairs_the_shared_seeds_and_names_the_rest(tmp_path):
    ref = make_run(tmp_path, "ref", values={"accuracy": [0.93, 0.94, 0.935]})
    rerun = make_run(tmp_path, "rerun", values={"accuracy": [0.93, 0.94, 0.935, 0.95]})
    eq = verify_run(rerun, against=ref).equivalence[0]
    assert eq.tost["design"] == "paired" and eq.tost["n_a"] == 3
    assert "rerun repeat(s) 3 have no reference repeat of their seed: left out" in eq.tost["design_reason"]
    one = make_run(tmp_path, "one", values={"accuracy": [0.93]})
    assert "only 1 rerun repeat" in verify_run(one, against=ref).equivalence[0].tost["design_reason"]


def test_published_numbers_without_a_publication_stay_unpaired(tmp_path):
    pub = tmp_path / "paper.yaml"
    pub.write_text(json.dumps({
        "schema": "repro500/published/v1", "benchmark": "toy", "source": {"citation": "X, 2026"},
        "metrics": {"accuracy": {"values": [0.931, 0.934, 0.936], "margin": 0.02, "direction": "higher"}}}))
    run = make_run(tmp_path, "run", values={"accuracy": [0.93, 0.935, 0.94]})
    verdict = verify_run(run, against=pub)
    eq = verdict.equivalence[0]
    assert eq.tost["method"] == "two-sample Welch TOST" and "record no seeds" in eq.tost["design_reason"]
    assert verdict.exact_replay is None


# ------------------------------------------------------------------- a real wrapped command

SCRIPT = """import random, sys
random.seed(int(sys.argv[1]))
print("-" * 200)
print(':::MLLOG {"namespace": "", "event_type": "POINT_IN_TIME", "key": "eval_accuracy", "value": 0.5, '
      '"metadata": {"file": "main.py", "lineno": 1, "note": "' + "x" * 120 + '"}}')
print(f"test_ppl {100 + random.gauss(0, 25):.4f}")
"""


@pytest.mark.slow
def test_a_wrapped_command_rerun_is_reproduced_exact_against_its_run_and_its_publication(tmp_path):
    (tmp_path / "main.py").write_text(SCRIPT)
    common = ["run", "--command", "--no-tracking", "--metric", "test_ppl=regex:test_ppl ([0-9.]+)", "--accept",
              "test_ppl<=200±10", "--repeats", "3"]
    ref = repro500(*common, "--run-id", "ref", "--", "python", "main.py", "{seed}", cwd=tmp_path)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    # through a pipe (not a terminal): the command's lines arrive as it printed them, unwrapped
    lines = ref.stdout.splitlines()
    assert lines.count("-" * 200) == 3
    assert sum(1 for line in lines if line.startswith(":::MLLOG") and line.endswith('"}}')) == 3
    assert (tmp_path / "runs/ref/repeats/0/stdout.txt").read_text().splitlines()[0] == "-" * 200
    rerun = repro500(*common, "--run-id", "rerun", "--", "python", "main.py", "{seed}", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    values = [json.loads((tmp_path / f"runs/rerun/repeats/{k}/summary.json").read_text())["metrics"]["test_ppl"]
              for k in range(3)]
    assert max(values) - min(values) > 1.0  # a spread between seeds that Welch could not see past
    verdict = verify_run(tmp_path / "runs/rerun", against=tmp_path / "runs/ref")
    assert (verdict.status, verdict.exact) == ("REPRODUCED", True), verdict.reasons
    assert verdict.equivalence[0].tost["design"] == "paired"
    published = repro500("publish", "runs/ref", "--out", str(tmp_path / "pub"), cwd=tmp_path)
    assert published.returncode == 0, published.stdout + published.stderr
    against_pub = verify_run(tmp_path / "runs/rerun", against=tmp_path / "pub" / "published.yaml")
    assert (against_pub.status, against_pub.exact) == ("REPRODUCED", True), against_pub.reasons
    assert against_pub.equivalence[0].tost["design"] == "paired"
    assert math.isclose(against_pub.equivalence[0].tost["diff"], 0.0)


# ------------------------------------------------------------ the calibration harness's paired cells


def test_the_calibration_bench_keeps_the_paired_error_rates_and_needs_a_fifth_of_the_repeats(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "verdict_calibration.py"
    spec = importlib.util.spec_from_file_location("verdict_calibration", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    missed, power_missed = [], []
    # fewer draws than the bench's, a fixed seed: every cell's limit is alpha + 3 of its standard errors
    paired, unpaired = bench.paired_section(np.random.default_rng(bench.SEED), missed, power_missed, draws=20_000)
    assert missed == [] and power_missed == []
    assert paired <= bench.POWER_RATIO * unpaired
    assert "paired / unpaired" in capsys.readouterr().out
