"""The four distributions a verdict reads: Student's t, the normal, the binomial and chi-square.

Why not ``scipy.stats``: importing it costs about 1.2 s of CPU a process against 0.5 s for
``scipy.special`` (2-core Intel Xeon at 2.5 GHz), and every ``repro500 run``, ``verify``,
``publish``, ``reproduce`` and ``report`` computes a verdict in a fresh process.  The t, normal
and chi-square methods of ``scipy.stats`` that the verdict uses evaluate these same
``scipy.special`` functions, so the values are scipy's; its binomial is Boost's incomplete beta
where ``special.bdtr`` is Cephes', the two agreeing to a few units in the last place per trial.
The edges ``scipy.stats`` fills in itself (a quantile at 0 or 1, a count outside 0..n, an invalid
parameter) are written out here.  Every function takes and returns what numpy broadcasts, like
the ``scipy.stats`` methods they stand for (tests/test_distributions.py compares them over each
argument's range).

``scipy.stats`` is still the reader for whole tests (``ttest_ind``, ``f_oneway``) in the modules
that run them only on request (``repro500 history``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special


def _quantile(q: Any, valid: Any, low: float, high: float, inside: Any) -> Any:
    """A quantile as ``scipy.stats`` gives it: the support's ends at q = 0 and 1 (where
    ``special.stdtrit`` answers +inf for q = 0), NaN outside [0, 1] or for invalid parameters."""
    q = np.asarray(q, dtype=float)
    out = np.where(q == 0, low, np.where(q == 1, high, inside))
    return np.where(valid & (q >= 0) & (q <= 1), out, np.nan)[()]


def t_cdf(x: Any, df: Any) -> Any:
    """P(T <= x), T ~ Student's t with ``df`` > 0 degrees of freedom (``scipy.stats.t.cdf``)."""
    return special.stdtr(df, x)


def t_sf(x: Any, df: Any) -> Any:
    """P(T > x) (``scipy.stats.t.sf``)."""
    return special.stdtr(df, np.negative(x))


def t_ppf(q: Any, df: Any) -> Any:
    """The x with P(T <= x) = q (``scipy.stats.t.ppf``)."""
    with np.errstate(invalid="ignore"):
        return _quantile(q, np.greater(df, 0), -np.inf, np.inf, special.stdtrit(df, q))


def t_isf(q: Any, df: Any) -> Any:
    """The x with P(T > x) = q (``scipy.stats.t.isf``)."""
    return np.negative(t_ppf(q, df))


def norm_cdf(x: Any) -> Any:
    """P(Z <= x), Z standard normal (``scipy.stats.norm.cdf``)."""
    return special.ndtr(x)


def norm_isf(q: Any) -> Any:
    """The x with P(Z > x) = q (``scipy.stats.norm.isf``)."""
    return np.negative(special.ndtri(q))


def binom_cdf(k: Any, n: Any, p: Any) -> Any:
    """P(B <= k), B ~ Binomial(n, p) (``scipy.stats.binom.cdf``): 0 below 0 and 1 from n on,
    where ``special.bdtr`` answers NaN."""
    k = np.floor(np.asarray(k, dtype=float))
    with np.errstate(invalid="ignore"):
        inside = special.bdtr(np.clip(k, 0, n), n, p)
    return np.where(k < 0, 0.0, np.where(k >= n, 1.0, inside))[()]


def binom_sf(k: Any, n: Any, p: Any) -> Any:
    """P(B > k) (``scipy.stats.binom.sf``): 1 below 0 and 0 from n on."""
    k = np.floor(np.asarray(k, dtype=float))
    with np.errstate(invalid="ignore"):
        inside = special.bdtrc(np.clip(k, 0, n), n, p)
    return np.where(k < 0, 1.0, np.where(k >= n, 0.0, inside))[()]


def chi2_ppf(q: Any, df: Any) -> Any:
    """The x with P(X <= x) = q, X ~ chi-square with ``df`` > 0 degrees of freedom
    (``scipy.stats.chi2.ppf``: twice the inverse regularised lower incomplete gamma, accurate in
    the lower tail where ``special.chdtri`` of 1 - q is not)."""
    with np.errstate(invalid="ignore"):
        return _quantile(q, np.greater(df, 0), 0.0, np.inf, 2.0 * special.gammaincinv(np.divide(df, 2.0), q))


def t_interval(confidence: float, df: Any, loc: Any, scale: Any) -> tuple[Any, Any]:
    """The two-sided ``confidence`` interval loc +- t quantile * scale (``scipy.stats.t.interval``)."""
    tail = (1.0 - confidence) / 2.0  # each end from its own tail, as scipy does: 1 - tail rounds
    return np.add(loc, t_ppf(tail, df) * scale), np.add(loc, t_ppf(1.0 - tail, df) * scale)
