"""``repro500 plan``: the repeats a decision needs, checked against exact power and simulation,
and the same figure verify's advice gives."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.rundirs import make_run
from helpers.runs import repro500
from scipy import stats as sps

from repro500.verify import bands, planning, stats
from repro500.verify.rundir import Criterion, load_run

BAND = Criterion(metric="accuracy", target=0.9, direction="higher", tolerance=0.02)


def _exact_one_sided_power(delta: float, sd: float, n: int, alpha: float) -> float:
    """Power of the one-sample t test of mean > threshold, from the noncentral t (exact under normality)."""
    df = n - 1
    return float(sps.nct.sf(sps.t.ppf(1 - alpha, df), df, delta / (sd / np.sqrt(n))))


@pytest.mark.parametrize(("mean", "sd"), [(0.93, 0.01), (0.905, 0.01), (0.95, 0.05), (0.89, 0.02)])
def test_band_repeats_reach_the_power_by_the_exact_t_power(mean, sd):
    n = stats.band_repeats(mean, sd, BAND, alpha=0.05)
    delta = abs(mean - BAND.threshold)
    assert _exact_one_sided_power(delta, sd, n, 0.05) >= 0.78  # the normal approximation is close
    if n > 2:
        assert _exact_one_sided_power(delta, sd, n - 1, 0.05) < 0.8  # and no repeat too many


def test_equivalence_repeats_reach_the_power_in_simulation():
    """Both sides fresh, no true difference: TOST decides 'equivalent' at about the planned rate."""
    sd, margin, alpha = 0.01, 0.015, 0.05
    n, both = stats.equivalence_repeats(0.0, sd, margin, alpha, sd_ref=sd)
    assert not both and 3 <= n <= 50
    rng = np.random.default_rng(7)

    def rate(k: int, sims: int = 1500) -> float:
        hits = 0
        for _ in range(sims):
            a, b = rng.normal(0.9, sd, k), rng.normal(0.9, sd, k)
            res = stats.tost_two_sample(a, b, margin, alpha)
            hits += res.ci_low >= -margin and res.ci_high <= margin
        return hits / sims

    assert rate(n) >= 0.8 - 3 * np.sqrt(0.8 * 0.2 / 1500)
    assert rate(max(2, n - 2)) < 0.8


def test_a_stated_cv_scales_the_spread_and_few_repeats_plan_conservatively():
    recipe_plan = planning.plan_metric("accuracy", [], BAND, (0.02, "acceptance tolerance"), 0.01, 0.05, 0.8, None)
    assert recipe_plan.sd == pytest.approx(0.009) and recipe_plan.band["conservative"] is None
    observed = planning.plan_metric("accuracy", [0.93, 0.94, 0.935], BAND, (0.02, "--margin"), None, 0.05, 0.8, 3)
    assert observed.n_spread == 3
    assert observed.equivalence["conservative"] > observed.equivalence["fresh"]
    assert planning.sd_upper(1.0, 3) == pytest.approx(np.sqrt(2 / sps.chi2.ppf(0.2, 2)))


def test_verify_advises_the_count_plan_gives(tmp_path):
    straddle = [0.875, 0.895, 0.885]  # the band's threshold is 0.88: the 95% bounds straddle it
    values = [0.915, 0.93, 0.925]  # these meet it outright
    run = load_run(make_run(tmp_path, values={"accuracy": straddle}))
    (band,) = bands.check_bands(run, 0.05)
    assert band.status == "INCONCLUSIVE" and band.repeats_needed
    plan = planning.build(run.path, {}, {}, 0.05, 0.8)
    assert plan.metrics[0].band["repeats"] == band.repeats_needed
    assert f"about {band.repeats_needed} repeats would decide the band" in " ".join(band.advice)
    (met,) = bands.check_bands(load_run(make_run(tmp_path, "met", values={"accuracy": values})), 0.05)
    assert met.status == "PASS" and met.repeats_needed is None


def test_plan_cli_on_a_run_a_recipe_and_bad_input(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.93, 0.94, 0.935]})
    out = repro500("plan", str(run), "--margin", "accuracy=0.01", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    (metric,) = doc["metrics"]
    assert doc["schema"] == "repro500/plan/v1" and doc["kind"] == "run"
    assert metric["equivalence"]["margin_source"] == "--margin" and metric["equivalence"]["fresh"] >= 2
    assert any("independent and normally distributed" in line for line in doc["assumptions"])
    # and the --max-repeats a run --until-decided needs for the same question, by the same function
    band = metric["band"]["until_decided"]
    assert band["max_repeats"] >= 3 and band["achieved_power"] >= 0.8
    against = metric["equivalence"]["until_decided"]
    assert against["max_repeats"] is None and "a reference of 3 repeats caps the power" in against["reason"]
    shown = repro500("plan", str(run), cwd=tmp_path)
    assert shown.returncode == 0 and "Assumptions:" in shown.stdout and "band >= 0.88" in shown.stdout
    assert "until decided" in shown.stdout

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "schema: repro500/recipe/v1\nname: r\nfixed: {workload: command, command: [python, t.py]}\n"
        "metrics: {accuracy: {regex: 'acc ([0-9.]+)'}}\n"
        "acceptance: {accuracy: {target: 0.9, direction: higher, tolerance: 0.02}}\nrepeats: 3\n")
    planned = repro500("plan", str(recipe), "--cv", "accuracy=1%", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    no_cv = repro500("plan", str(recipe), cwd=tmp_path)
    assert no_cv.returncode == 2 and "--cv accuracy=CV" in no_cv.stderr and "Traceback" not in no_cv.stderr
    unknown = repro500("plan", str(run), "--margin", "loss=0.1", cwd=tmp_path)
    assert unknown.returncode == 2 and "'loss' is not a metric" in unknown.stderr
    missing = repro500("plan", str(tmp_path / "nope"), cwd=tmp_path)
    assert missing.returncode == 4 and "does not exist" in missing.stderr


def test_plan_reads_a_packed_run_and_a_publication_as_the_run_itself(tmp_path):
    run = make_run(tmp_path, values={"accuracy": [0.93, 0.94, 0.935]})
    assert repro500("pack", str(run), "-o", str(tmp_path / "r.tar.gz"), cwd=tmp_path).returncode == 0
    published = repro500("publish", str(run), "--out", str(tmp_path / "pub"), cwd=tmp_path)
    assert published.returncode == 0, published.stdout + published.stderr
    plans = {}
    for given in (run, tmp_path / "r.tar.gz", tmp_path / "pub"):
        out = repro500("plan", str(given), "--margin", "accuracy=0.01", "--json", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        plans[given] = json.loads(out.stdout)
        assert plans[given]["kind"] == "run" and plans[given]["source"] == str(given)
    assert len({json.dumps(p["metrics"], sort_keys=True) for p in plans.values()}) == 1
