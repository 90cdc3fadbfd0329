"""The verdict's distributions (repro500.verify.distributions) give scipy.stats' values, edges
included, and the verdict's modules no longer import scipy.stats."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from repro500.verify import distributions as d

# scipy.stats evaluates t, normal and chi-square through the same special functions: a few
# units in the last place.  Its binomial is Boost's incomplete beta, ours Cephes' (special.bdtr):
# each one's rounding error grows with the number of trials, so they agree to n units of 16 eps.
EPS = np.finfo(float).eps
RTOL = ATOL = 64 * EPS

X = np.array([-np.inf, -40.0, -3.5, -1.0, -1e-9, 0.0, 1e-9, 0.5, 1.96, 7.0, 60.0, np.inf, np.nan])
DF = np.array([0.5, 1.0, 2.0, 2.7, 4.0, 9.0, 30.0, 1e6, np.inf, 0.0, -1.0, np.nan])
Q = np.array([0.0, 1e-12, 0.001, 0.025, 0.05, 0.3, 0.5, 0.8, 0.95, 0.975, 1 - 1e-12, 1.0, -0.1, 1.1, np.nan])


def same(ours, theirs, tol=RTOL):
    ours, theirs = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol, equal_nan=True)


def test_student_t_matches_scipy_stats_over_its_range():
    x, df = np.meshgrid(X, DF)
    same(d.t_cdf(x, df), stats.t.cdf(x, df))
    same(d.t_sf(x, df), stats.t.sf(x, df))
    q, df = np.meshgrid(Q, DF)
    same(d.t_ppf(q, df), stats.t.ppf(q, df))
    same(d.t_isf(q, df), stats.t.isf(q, df))


def test_scalars_stay_scalars():
    assert np.ndim(d.t_ppf(0.975, 3)) == 0
    assert d.t_ppf(0.975, 3) == pytest.approx(3.182446305284263, rel=1e-14)
    assert np.ndim(d.binom_cdf(2, 10, 0.5)) == 0
    assert np.ndim(d.chi2_ppf(0.05, 4)) == 0


def test_normal_matches_scipy_stats():
    same(d.norm_cdf(X), stats.norm.cdf(X))
    same(d.norm_isf(Q), stats.norm.isf(Q))


@pytest.mark.parametrize("n", [1, 2, 5, 11, 40, 301])
@pytest.mark.parametrize("p", [0.0, 1e-6, 0.05, 0.5, 0.77, 1.0])
def test_binomial_matches_scipy_stats_including_below_and_above_the_support(n, p):
    k, tol = np.arange(-3, n + 4), max(RTOL, 16 * n * EPS)
    same(d.binom_cdf(k, n, p), stats.binom.cdf(k, n, p), tol)
    same(d.binom_sf(k, n, p), stats.binom.sf(k, n, p), tol)
    half = k + 0.5  # non-integer counts floor, as scipy.stats does
    same(d.binom_cdf(half, n, p), stats.binom.cdf(half, n, p), tol)


def test_chi_square_quantiles_match_scipy_stats():
    q, df = np.meshgrid(Q, DF)
    same(d.chi2_ppf(q, df), stats.chi2.ppf(q, df))


@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.95, 0.999])
@pytest.mark.parametrize("df", [1, 3, 29])
def test_t_interval_matches_scipy_stats(confidence, df):
    ours = d.t_interval(confidence, df, loc=2.5, scale=0.3)
    theirs = stats.t.interval(confidence, df, loc=2.5, scale=0.3)
    same(ours, theirs)


def test_a_verdict_does_not_import_scipy_stats():
    """The point of the module: the verdict's modules import in a fresh process without
    scipy.stats (a second per process that every verify, run, publish and report paid)."""
    code = ("import sys; import repro500.verify.judge, repro500.verify.verdict, repro500.runner.decide; "
            "print('scipy.stats' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(("a", "b"), [
    ([10.0, 11.0, 12.5], [12.0, 13.0, 12.2, 14.1]),
    ([5.0, 5.0, 5.0], [6.0, 7.0]),
    ([3.0, 3.1], [3.0, 3.1]),
    ([1.0, 1.0], [1.0, 1.0]),  # neither varies: NaN, as scipy says
    ([2.0, 2.0], [1.0, 1.0]),
])
def test_welchs_one_sided_p_matches_scipy_stats(a, b):
    from repro500.verify.stats import welch_p_less

    theirs = stats.ttest_ind(a, b, equal_var=False, alternative="less").pvalue
    same(welch_p_less(a, b), theirs)
