"""The verdict's statistics agree with scipy on fixed inputs and never return NaN."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from repro500.verify import stats
from repro500.verify.equivalence import classify, compare_values, decide

A = [0.912, 0.931, 0.925, 0.940, 0.921]
B = [0.918, 0.915, 0.930, 0.922]


def test_t_interval_matches_scipy():
    low, high = stats.t_interval(A, 0.95)
    ref = sps.t.interval(0.95, len(A) - 1, loc=np.mean(A), scale=sps.sem(A))
    # both feed one scipy call a double mean and sem computed in other orders (a few ulp apart);
    # ends ~0.9 with no cancellation: ~1e-15 relative, 1e-12 is headroom (equal here)
    assert (low, high) == pytest.approx(ref, rel=1e-12)
    d = stats.describe(A, 0.05)
    assert (d["ci_low"], d["ci_high"]) == pytest.approx(ref, rel=1e-12)
    assert d["std"] == pytest.approx(np.std(A, ddof=1))
    assert d["cv"] == pytest.approx(np.std(A, ddof=1) / np.mean(A))


def test_one_sided_bounds_are_the_two_sided_1_minus_2alpha_interval():
    low, high = stats.one_sided_bounds(A, 0.05)
    assert low == pytest.approx(np.mean(A) - sps.t.ppf(0.95, 4) * sps.sem(A))
    assert high == pytest.approx(np.mean(A) + sps.t.ppf(0.95, 4) * sps.sem(A))


def test_median_interval_matches_scipy_quantile_test_and_reports_achieved_confidence():
    x = np.random.default_rng(0).normal(100, 1, 30)
    med = stats.median_interval(x, 0.05)
    ref = sps.quantile_test(x, q=np.median(x), p=0.5).confidence_interval(0.95)
    assert (med["low"], med["high"]) == pytest.approx((ref.low, ref.high))
    lo, hi = med["ranks"]
    exact = sum(sps.binom.pmf(i, 30, 0.5) for i in range(lo, hi))  # P(lo <= B <= hi - 1)
    assert med["confidence"] == pytest.approx(exact)
    assert med["confidence"] >= 0.95


def test_median_interval_too_few_values_says_what_confidence_it_has():
    med = stats.median_interval([3.0, 1.0, 2.0, 5.0, 4.0], 0.05)
    assert (med["low"], med["high"]) == (1.0, 5.0)
    assert med["confidence"] == pytest.approx(1 - 2 * 0.5**5)  # 93.75 %
    assert "93.8%" in med["note"]


def test_olympic_mean_drops_fastest_and_slowest():
    assert stats.olympic_mean([10, 1, 4, 5, 100]) == pytest.approx(19 / 3)
    assert stats.olympic_mean([1, 2]) is None


def test_describe_one_value_is_explicit_not_nan():
    d = stats.describe([0.93], 0.05)
    assert d["n"] == 1 and d["mean"] == 0.93
    assert d["std"] is None and d["ci_low"] is None and d["median_ci_low"] is None
    assert any("one repeat" in n for n in d["notes"])
    json.dumps(d, allow_nan=False)


def test_describe_zero_variance_collapses_intervals_without_nan():
    d = stats.describe([0.93, 0.93, 0.93], 0.05)
    assert d["zero_variance"] is True
    assert d["std"] == 0.0 and d["cv"] == 0.0
    assert d["ci_low"] == d["ci_high"] == 0.93
    assert d["median_ci_low"] == d["median_ci_high"] == 0.93
    assert any("zero variance" in n and "different seeds" in n for n in d["notes"])
    json.dumps(d, allow_nan=False)


def test_describe_rejects_nan_input():
    with pytest.raises(ValueError, match="NaN"):
        stats.describe([1.0, float("nan")])


def test_two_sample_tost_matches_two_one_sided_welch_tests():
    margin, alpha = 0.01, 0.05
    res = stats.tost_two_sample(A, B, margin, alpha)
    a, b = np.array(A), np.array(B)
    # H0: diff <= -margin  <=>  mean(a) - (mean(b) - margin) <= 0, alternative "greater"
    p_lower = sps.ttest_ind(a, b - margin, equal_var=False, alternative="greater").pvalue
    p_upper = sps.ttest_ind(a, b + margin, equal_var=False, alternative="less").pvalue
    # Double arithmetic on fixed inputs, two formulas: the statistic's cancellation (values ~0.92,
    # differences ~0.01: ~100 u = 1e-14) times the t tail's condition t pdf/sf (<~ 10): ~1e-13
    # (3e-14 measured); 1e-10 is headroom, a wrong df or margin sign moves p by O(1)
    assert res.p_lower == pytest.approx(p_lower, rel=1e-10)
    assert res.p_upper == pytest.approx(p_upper, rel=1e-10)
    assert res.p_value == pytest.approx(max(p_lower, p_upper), rel=1e-10)
    welch = sps.ttest_ind(a, b, equal_var=False)
    assert res.df == pytest.approx(welch.df)
    ci = welch.confidence_interval(1 - 2 * alpha)
    assert (res.ci_low, res.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-10)


def test_one_sample_tost_matches_two_ttest_1samp_calls():
    value, margin, alpha = 0.92, 0.02, 0.05
    res = stats.tost_one_sample(A, value, margin, alpha)
    p_lower = sps.ttest_1samp(A, value - margin, alternative="greater").pvalue
    p_upper = sps.ttest_1samp(A, value + margin, alternative="less").pvalue
    # as in the two-sample test: ~100 u of cancellation times the tail's condition, 1e-10 headroom
    assert (res.p_lower, res.p_upper) == pytest.approx((p_lower, p_upper), rel=1e-10)
    ci = sps.ttest_1samp(A, value).confidence_interval(1 - 2 * alpha)  # interval of the mean
    assert (res.ci_low, res.ci_high) == pytest.approx((ci.low - value, ci.high - value), rel=1e-10)


def test_vectorised_core_equals_the_scalar_decision():
    res = stats.tost_two_sample(A, B, 0.01, 0.05)
    low, high, p_lo, p_hi = stats.tost_from_stats([res.diff] * 3, [res.std_err] * 3, [res.df] * 3, 0.01, 0.05)
    # the scalar result came through this same core with the same doubles: equal (a few ulp at most)
    assert np.allclose(low, res.ci_low, rtol=1e-12, atol=0) and np.allclose(high, res.ci_high, rtol=1e-12, atol=0)
    assert np.allclose(p_lo, res.p_lower, rtol=1e-12, atol=0) and np.allclose(p_hi, res.p_upper, rtol=1e-12, atol=0)


@pytest.mark.parametrize("test, direction", [("equivalence", "higher"), ("non_inferiority", "higher"),
                                             ("non_inferiority", "lower")])
def test_vectorised_rules_give_the_status_classify_gives(test, direction):
    # the calibration bench decides through decide(); the verdict through classify()
    codes = {"REPRODUCED": 1, "NOT REPRODUCED": -1, "INCONCLUSIVE": 0}
    seen = set()
    for shift in np.linspace(-0.06, 0.06, 49):  # interval half-width ~0.011, margin 0.02
        res = stats.tost_two_sample([a + shift for a in A], B, 0.02, 0.05)
        status = classify(res, test, direction)[0]
        seen.add(status)
        assert int(decide(res.ci_low, res.ci_high, 0.02, test, direction)) == codes[status]
    assert seen == set(codes)  # every outcome was exercised


def test_no_interval_advice_names_the_side_that_is_short():
    run3 = [0.93, 0.94, 0.935]
    short_ref = compare_values("accuracy", run3, [0.935], 0.01, 0.05)
    assert short_ref.status == "INCONCLUSIVE"
    assert "the reference has 1 repeat(s)" in short_ref.advice[0] and "run's 3 repeats are enough" in short_ref.advice[0]
    published = compare_values("accuracy", run3, [0.935], 0.01, 0.05, reference_kind="published")
    assert "published file lists 1 value(s)" in published.advice[0] and "`value`" in published.advice[0]
    short_run = compare_values("accuracy", [0.93], [0.93, 0.94, 0.935], 0.01, 0.05)
    assert short_run.advice[0].startswith("accuracy: run at least 3 repeats") and "reference" not in short_run.advice[0]
    one_sample = compare_values("accuracy", [0.93], [0.935], 0.01, 0.05, single_value=True)
    assert one_sample.advice[0].startswith("accuracy: run at least 3 repeats")
    both = compare_values("accuracy", [0.93], [0.935], 0.01, 0.05)
    assert "run at least 3 repeats" in both.advice[0] and "the reference has 1 repeat(s)" in both.advice[0]


def test_zero_variance_on_both_sides_is_decided_exactly():
    inside = stats.tost_two_sample([0.93] * 3, [0.935] * 3, 0.01)
    assert inside.exact and classify(inside, "equivalence", "higher")[0] == "REPRODUCED"
    outside = stats.tost_two_sample([0.93] * 3, [0.95] * 3, 0.01)
    assert classify(outside, "equivalence", "higher")[0] == "NOT REPRODUCED"
    json.dumps(outside.to_dict(), allow_nan=False)


def test_zero_variance_on_one_side_uses_the_other_sides_spread():
    res = stats.tost_two_sample([0.93] * 3, B, 0.02)
    assert not res.exact
    assert res.df == pytest.approx(len(B) - 1)
    assert res.std_err == pytest.approx(np.std(B, ddof=1) / math.sqrt(len(B)))


def test_one_repeat_gives_no_interval():
    res = stats.tost_one_sample([0.93], 0.93, 0.01)
    assert res.ci_low is None and "at least 2" in res.notes[0]
    assert classify(res, "equivalence", "higher")[0] == "INCONCLUSIVE"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=8),
    st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=8),
    st.floats(0.001, 0.5),
)
def test_reproduced_exactly_when_both_one_sided_tests_reject(a, b, margin):
    res = stats.tost_two_sample(a, b, margin, 0.05)
    status, _ = classify(res, "equivalence", "higher")
    assert status in ("REPRODUCED", "NOT REPRODUCED", "INCONCLUSIVE")
    json.dumps(res.to_dict(), allow_nan=False)
    # Equal in exact arithmetic: ci_low >= -margin iff t.sf((diff + margin) / se) <= alpha.  In
    # double the interval's end rounds by ~u margin near the edge, <= 0.4 u margin / se in p (t
    # density <= 0.4), and scipy's t.sf and t.ppf agree to ~1e-14 (times q <= 6.4, df >= 1): the
    # two may disagree only for p inside that band around alpha, where neither side is wrong.
    if not res.exact:
        band = 2.0**-53 * margin / res.std_err + 1e-13
        if abs(res.p_value - 0.05) > band:
            assert (status == "REPRODUCED") == (res.p_value <= 0.05)


def test_repeats_needed_grows_as_the_margin_shrinks_and_gives_up_on_the_margin():
    wide = stats.repeats_needed(0.0, 0.01, 0.02, 0.05)
    narrow = stats.repeats_needed(0.0, 0.01, 0.005, 0.05)
    assert wide < narrow
    assert stats.repeats_needed(0.01, 0.01, 0.01, 0.05) is None  # difference sits on the margin


def test_repeats_needed_reaches_about_the_requested_power_in_simulation():
    sd, margin, alpha = 1.0, 1.0, 0.05
    n = stats.repeats_needed(0.0, sd, margin, alpha, std_b=sd)  # two samples, same n
    rng = np.random.default_rng(1)

    def power(m: int) -> float:
        a, b = rng.normal(0, sd, (4000, m)), rng.normal(0, sd, (4000, m))
        va, vb = a.var(axis=1, ddof=1), b.var(axis=1, ddof=1)
        se = np.sqrt(va / m + vb / m)
        low, high, _, _ = stats.tost_from_stats(a.mean(1) - b.mean(1), se, stats.welch_df(va, m, vb, m), margin, alpha)
        return float(np.mean((low >= -margin) & (high <= margin)))

    # Monte Carlo: 4000 draws give a power near 0.8 a standard error sqrt(0.8 * 0.2 / 4000) = 0.006;
    # n is the smallest with planned power >= 0.8 (0.81 drawn here), so 0.72 is >10 of them below,
    # and n - 2 repeats lose ~0.06 (0.74 drawn), ~6 standard errors of the difference
    assert 0.72 <= power(n) <= 0.95
    assert power(n - 2) < power(n)


def test_spreads_below_float_resolution_are_decided_without_nan():
    # a variance whose square underflows used to give df = nan and a "[nan, nan]" interval
    assert stats.welch_df(1e-170, 3, 2e-170, 3) == pytest.approx(stats.welch_df(1.0, 3, 2.0, 3))
    res = stats.tost_two_sample([0.0, 0.0], [0.0, 2.225073858507e-311], 0.5, 0.05)
    assert classify(res, "equivalence", "higher")[0] == "REPRODUCED"
    json.dumps(res.to_dict(), allow_nan=False)
