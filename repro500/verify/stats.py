"""The statistics a verdict uses, in one file you can audit.

Everything here works on the per-repeat values of one metric.  Small n is the norm (3 to 10
repeats), so intervals are t-based or exact order statistics, never a bootstrap (BCa
under-covers at small n and returns NaN when every repeat is identical).  Two cases are
handled explicitly instead of producing NaN:

* **n = 1**: no spread can be estimated; every interval is ``None`` with a note.
* **zero variance** (bitwise-identical repeats): the interval collapses to the mean; tests
  are decided exactly from the means (``exact=True`` on the result).  This is what the
  t formulas give with s = 0, whatever seeds the repeats used: the values carry no seeds,
  and a spread the data do not show cannot be estimated (docs/verify.md, "Zero variance").

Conventions (docs/verify.md, "Statistics"):

* ``describe`` gives a two-sided (1 - alpha) t-interval for the mean and an exact
  order-statistic interval for the median (Le Boudec; Hoefler & Belli, SC'15).
* Equivalence (TOST) at level alpha is decided on the (1 - 2 alpha) interval of the
  difference: "equivalent" when it lies inside [-margin, +margin] (edges included).
  The two one-sided p-values are reported; their maximum is the TOST p-value.
* Two samples use Welch's unequal-variance t (Welch-Satterthwaite degrees of freedom).
* Pairs (a rerun repeat and the reference repeat of the same seed) use the one-sample t on the
  per-pair differences d_i = a_i - b_i (``tost_paired``): the spread between seeds, which both
  members of a pair share, cancels, and only what differs within a pair is left.  Differences
  that are all equal are decided exactly, as zero variance is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np

from repro500.statuses import DEFAULT_ALPHA
from repro500.verify import distributions as dist

DEFAULT_POWER = 0.8
MAX_REPEATS = 1000  # beyond this, "repeats needed" is reported as not reachable


def _array(values: Sequence[float], what: str = "values") -> np.ndarray:
    x = np.asarray(list(values), dtype=float)
    if x.ndim != 1:
        raise ValueError(f"{what} must be a flat list of numbers")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what} contain NaN or infinity")
    return x


def _f(value: Any) -> float | None:
    """A plain float for JSON, or None for anything undefined."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def olympic_mean(values: Sequence[float]) -> float | None:
    """Mean without the smallest and the largest value (MLPerf's scoring); None for n < 3."""
    x = np.sort(_array(values))
    if x.size < 3:
        return None
    return float(x[1:-1].mean())


def t_interval(values: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """Two-sided t-interval for the mean; None for n < 2, the point itself for zero variance."""
    x = _array(values)
    if x.size < 2:
        return None
    mean = float(x.mean())
    sem = float(x.std(ddof=1)) / math.sqrt(x.size)
    if sem == 0.0:
        return (mean, mean)
    low, high = dist.t_interval(confidence, x.size - 1, loc=mean, scale=sem)
    return (float(low), float(high))


def one_sided_bounds(values: Sequence[float], alpha: float) -> tuple[float, float] | None:
    """(lower, upper) one-sided (1 - alpha) confidence bounds for the mean.

    Each bound alone holds with confidence 1 - alpha; together they are the two-sided
    (1 - 2 alpha) interval.  None for n < 2.
    """
    return t_interval(values, 1.0 - 2.0 * alpha)


def median_interval(values: Sequence[float], alpha: float) -> dict[str, Any]:
    """Exact distribution-free confidence interval for the median from order statistics.

    The interval [x_(l), x_(n+1-l)] (1-based ranks of the sorted values) covers the true
    median with probability P(l <= B <= n - l), B ~ Binomial(n, 1/2), whatever the
    distribution.  The largest l reaching 1 - alpha is used.  When even [min, max] falls
    short (n <= 5 at 95 %), [min, max] is returned with the confidence it does achieve.
    """
    x = np.sort(_array(values))
    n = x.size
    out: dict[str, Any] = {"low": None, "high": None, "confidence": None, "ranks": None, "note": None}
    if n < 2:
        out["note"] = "one value: no interval for the median"
        return out
    best_l = 1
    for lo in range(1, n // 2 + 1):
        if _median_coverage(n, lo) >= 1.0 - alpha:
            best_l = lo
        else:
            break
    coverage = _median_coverage(n, best_l)
    out.update(low=float(x[best_l - 1]), high=float(x[n - best_l]), confidence=coverage,
               ranks=[best_l, n + 1 - best_l])
    if coverage < 1.0 - alpha:
        out["note"] = (
            f"with {n} values even [min, max] covers the median with only {coverage:.1%} "
            f"confidence (< {1.0 - alpha:.0%})"
        )
    return out


def _median_coverage(n: int, rank: int) -> float:
    # P(rank <= B <= n - rank) for B ~ Binomial(n, 1/2)
    return float(dist.binom_cdf(n - rank, n, 0.5) - dist.binom_cdf(rank - 1, n, 0.5))


def describe(values: Sequence[float], alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """Summary statistics of one metric across repeats (never NaN; None where undefined).

    Keys: n, alpha, mean, std (sample, ddof=1), cv (std / |mean|), ci_low/ci_high (two-sided
    1 - alpha t-interval), median, median_ci_low/high with median_ci_confidence (achieved) and
    median_ci_ranks, olympic_mean, min, max, zero_variance, notes (list of sentences).
    """
    x = _array(values)
    n = int(x.size)
    notes: list[str] = []
    out: dict[str, Any] = {
        "n": n, "alpha": alpha, "mean": None, "std": None, "cv": None,
        "ci_method": "t", "ci_confidence": 1.0 - alpha, "ci_low": None, "ci_high": None,
        "median": None, "median_ci_method": "order statistics (exact binomial)",
        "median_ci_low": None, "median_ci_high": None, "median_ci_confidence": None,
        "median_ci_ranks": None, "olympic_mean": None, "min": None, "max": None,
        "zero_variance": False, "notes": notes,
    }
    if n == 0:
        notes.append("no values")
        return out
    mean = float(x.mean())
    out.update(mean=mean, median=float(np.median(x)), min=float(x.min()), max=float(x.max()))
    if n == 1:
        notes.append("one repeat: no spread or interval can be estimated; run at least 3 repeats")
        return out
    std = float(x.std(ddof=1))
    out["std"] = std
    out["zero_variance"] = bool(np.all(x == x[0]))
    if out["zero_variance"]:
        std = 0.0
        out["std"] = 0.0
        notes.append(
            "zero variance: all repeats are identical, the intervals collapse to the value "
            "(exact for repeats sharing a seed; for different seeds the true spread is almost never zero "
            "and more repeats would show it)"
        )
    if mean != 0.0:
        out["cv"] = std / abs(mean)
    else:
        notes.append("mean is 0: coefficient of variation undefined")
    low_high = t_interval(x, 1.0 - alpha)
    if low_high is not None:
        out["ci_low"], out["ci_high"] = low_high
    med = median_interval(x, alpha)
    out.update(median_ci_low=med["low"], median_ci_high=med["high"],
               median_ci_confidence=med["confidence"], median_ci_ranks=med["ranks"])
    if med["note"]:
        notes.append(med["note"])
    out["olympic_mean"] = olympic_mean(x)
    if out["olympic_mean"] is None:
        notes.append("olympic mean needs at least 3 repeats")
    return out


# --------------------------------------------------------------------------- TOST


@dataclass
class TostResult:
    """Two one-sided tests for the difference ``mean(a) - reference``.

    ``ci_low``/``ci_high`` is the (1 - 2 alpha) interval of the difference; ``p_lower`` tests
    H0: diff <= -margin, ``p_upper`` tests H0: diff >= +margin; ``p_value`` is their maximum.
    ``exact`` is True when both sides have zero variance and the means decide exactly.
    ``ci_low`` is None when an interval cannot be computed (n < 2 on a side that needs one).
    """

    method: str
    alpha: float
    margin: float
    n_a: int
    n_b: int | None
    mean_a: float | None
    mean_b: float | None
    diff: float | None
    std_a: float | None
    std_b: float | None
    std_err: float | None = None
    df: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_confidence: float = 0.9
    p_lower: float | None = None
    p_upper: float | None = None
    p_value: float | None = None
    exact: bool = False
    # the exact difference in decimal, when ``exact``: the operands as the decimal numbers they
    # print as (Python's shortest repr), subtracted without rounding (decided on, not ``diff``)
    exact_diff: str | None = None
    notes: list[str] = field(default_factory=list)
    # the design: "unpaired" (Welch, or one published value), or "paired" (per-seed differences),
    # with a sentence saying why it was chosen; for "paired", the pairs and their differences
    design: str = "unpaired"
    design_reason: str | None = None
    std_diff: float | None = None
    pairs: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (_f(v) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def tost_from_stats(diff: Any, std_err: Any, df: Any, margin: float, alpha: float) -> tuple:
    """Vectorised TOST core: (ci_low, ci_high, p_lower, p_upper) for arrays of differences.

    The decisions and the calibration benchmark share this one implementation.  Requires
    std_err > 0 (zero variance is decided exactly by the callers).
    """
    diff = np.asarray(diff, dtype=float)
    se = np.asarray(std_err, dtype=float)
    df = np.asarray(df, dtype=float)
    low, high = tost_interval(diff, se, df, alpha)
    p_lower = dist.t_sf((diff + margin) / se, df)  # H0: diff <= -margin
    p_upper = dist.t_cdf((diff - margin) / se, df)  # H0: diff >= +margin
    return low, high, p_lower, p_upper


def tost_interval(diff: Any, std_err: Any, df: Any, alpha: float) -> tuple[Any, Any]:
    """The (1 - 2 alpha) interval TOST decides on (vectorised; the decisions need no p-values)."""
    diff, se = np.asarray(diff, dtype=float), np.asarray(std_err, dtype=float)
    df = np.asarray(df, dtype=float)
    # one t quantile when every draw has the same degrees of freedom (a one-sample look)
    quantile = dist.t_ppf(1.0 - alpha, df.flat[0]) if df.size and np.all(df == df.flat[0]) else dist.t_ppf(1.0 - alpha, df)
    half = quantile * se
    return diff - half, diff + half


def welch_df(var_a: Any, n_a: Any, var_b: Any, n_b: Any) -> Any:
    """Welch-Satterthwaite degrees of freedom (vectorised)."""
    va = np.asarray(var_a, dtype=float) / n_a
    vb = np.asarray(var_b, dtype=float) / n_b
    # in shares of the total, so that tiny variances do not underflow when squared
    with np.errstate(invalid="ignore", divide="ignore"):
        sa, sb = va / (va + vb), vb / (va + vb)
        return 1.0 / (sa**2 / (np.asarray(n_a) - 1) + sb**2 / (np.asarray(n_b) - 1))


def welch_p_less(a: Sequence[float], b: Sequence[float]) -> float:
    """One-sided Welch t-test that ``a``'s mean is below ``b``'s: its p-value, NaN where neither
    sample varies (``scipy.stats.ttest_ind(a, b, equal_var=False, alternative="less")``)."""
    xa, xb = _array(a), _array(b)
    va, vb = float(xa.var(ddof=1)), float(xb.var(ddof=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        t = (xa.mean() - xb.mean()) / np.sqrt(va / xa.size + vb / xb.size)
    df = welch_df(va, xa.size, vb, xb.size)
    # neither varies: scipy takes 1 degree of freedom, so unequal constants give p = 0 or 1
    return float(dist.t_cdf(t, 1.0 if math.isnan(df) else df))


def _fill(result: TostResult, diff: float, se: float, df: float) -> TostResult:
    low, high, p_lo, p_hi = tost_from_stats(diff, se, df, result.margin, result.alpha)
    result.std_err, result.df = float(se), float(df)
    result.ci_low, result.ci_high = float(low), float(high)
    result.p_lower, result.p_upper = float(p_lo), float(p_hi)
    result.p_value = max(result.p_lower, result.p_upper)
    return result


def _exact(result: TostResult, diff: float, left: float, right: float) -> TostResult:
    """Zero variance: the difference of the two (constant) values, also kept exact in decimal.

    0.935 - 0.93 is 0.0050000000000000044 in binary floating point; a margin of 0.005 is meant
    as the decimal 0.005, and so are the values, which is how they were written and printed.
    Subtracting their shortest reprs as Decimals decides the edge as the user reads it, while a
    value one ulp beyond (0.9350000000000002) still lies beyond."""
    result.exact = True
    result.ci_low = result.ci_high = diff
    result.exact_diff = str(Decimal(repr(float(left))) - Decimal(repr(float(right))))
    result.notes.append("zero variance on every side: decided exactly from the means")
    return result


def tost_two_sample(a: Sequence[float], b: Sequence[float], margin: float, alpha: float = DEFAULT_ALPHA) -> TostResult:
    """Welch two-sample TOST for ``mean(a) - mean(b)`` within +-margin."""
    xa, xb = _array(a, "run values"), _array(b, "reference values")
    _check_margin(margin, alpha)
    res = TostResult(
        method="two-sample Welch TOST", alpha=alpha, margin=float(margin),
        n_a=int(xa.size), n_b=int(xb.size),
        mean_a=float(xa.mean()) if xa.size else None, mean_b=float(xb.mean()) if xb.size else None,
        diff=None, std_a=_sd(xa), std_b=_sd(xb), ci_confidence=1.0 - 2.0 * alpha,
    )
    if xa.size < 2 or xb.size < 2:
        res.notes.append(_few_note(xa.size, xb.size))
        if xa.size and xb.size:
            res.diff = float(xa.mean() - xb.mean())
        return res
    res.diff = float(xa.mean() - xb.mean())
    var_a, var_b = float(xa.var(ddof=1)), float(xb.var(ddof=1))
    if _constant(xa) and _constant(xb):
        return _exact(res, res.diff, xa[0], xb[0])
    var_a = 0.0 if _constant(xa) else var_a
    var_b = 0.0 if _constant(xb) else var_b
    se = math.sqrt(var_a / xa.size + var_b / xb.size)
    if se == 0.0:  # spreads below float resolution (their squares underflow): as exact as it gets
        return _exact(res, res.diff, res.mean_a, res.mean_b)
    df = float(welch_df(var_a, xa.size, var_b, xb.size))
    return _fill(res, res.diff, se, df)


def tost_one_sample(a: Sequence[float], value: float, margin: float, alpha: float = DEFAULT_ALPHA) -> TostResult:
    """One-sample TOST for ``mean(a) - value`` within +-margin (value taken as exact)."""
    xa = _array(a, "run values")
    _check_margin(margin, alpha)
    res = TostResult(
        method="one-sample TOST", alpha=alpha, margin=float(margin), n_a=int(xa.size), n_b=None,
        mean_a=float(xa.mean()) if xa.size else None, mean_b=float(value), diff=None,
        std_a=_sd(xa), std_b=None, ci_confidence=1.0 - 2.0 * alpha,
    )
    if xa.size == 0:
        res.notes.append("no run values")
        return res
    res.diff = float(xa.mean() - value)
    if xa.size < 2:
        res.notes.append(_few_note(xa.size, None))
        return res
    if _constant(xa):
        return _exact(res, res.diff, xa[0], value)
    se = float(xa.std(ddof=1)) / math.sqrt(xa.size)
    if se == 0.0:
        return _exact(res, res.diff, res.mean_a, value)
    return _fill(res, res.diff, se, float(xa.size - 1))


def tost_paired(a: Sequence[float], b: Sequence[float], margin: float, alpha: float = DEFAULT_ALPHA) -> TostResult:
    """Paired TOST for ``mean(a - b)`` within +-margin: ``a[i]`` and ``b[i]`` are one pair (a rerun
    repeat and the reference repeat of the same seed), and the one-sample t on the differences
    decides.  All differences equal (zero variance, e.g. all 0 for an exact replay) is decided
    exactly at that difference, in decimal, never as NaN."""
    xa, xb = _array(a, "run values"), _array(b, "reference values")
    if xa.size != xb.size:
        raise ValueError(f"a paired test needs as many run values as reference values ({xa.size} vs {xb.size})")
    _check_margin(margin, alpha)
    d = xa - xb
    res = TostResult(
        method="paired TOST (per-seed differences)", alpha=alpha, margin=float(margin),
        n_a=int(xa.size), n_b=int(xb.size),
        mean_a=float(xa.mean()) if xa.size else None, mean_b=float(xb.mean()) if xb.size else None,
        diff=float(d.mean()) if d.size else None, std_a=_sd(xa), std_b=_sd(xb),
        ci_confidence=1.0 - 2.0 * alpha, design="paired", std_diff=_sd(d),
    )
    if d.size < 2:
        res.notes.append(f"{d.size} pair(s): at least 2 (better 3 or more) are needed for an interval")
        return res
    if _constant(d):
        return _exact_pairs(res, xa, xb)
    se = float(d.std(ddof=1)) / math.sqrt(d.size)
    if se == 0.0:  # differences below float resolution: as exact as it gets
        return _exact_pairs(res, xa, xb)
    return _fill(res, res.diff, se, float(d.size - 1))


def _exact_pairs(res: TostResult, xa: np.ndarray, xb: np.ndarray) -> TostResult:
    """Every pair differs by the same amount: decided exactly at it.  In decimal (as the values
    print) the pairs' differences may still differ in the last digit; the one farthest from 0 is
    the one decided on, so an edge is never passed by rounding."""
    exact = [Decimal(repr(float(x))) - Decimal(repr(float(y))) for x, y in zip(xa, xb, strict=True)]
    far = max(exact, key=abs)
    res.exact = True
    res.std_diff = 0.0
    res.ci_low = res.ci_high = res.diff
    res.exact_diff = str(far)
    res.notes.append("every pair differs by the same amount (zero variance of the differences): decided exactly"
                     + (" (all pairs identical)" if far == 0 else ""))
    return res


def _check_margin(margin: float, alpha: float) -> None:
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 0):
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")


def _sd(x: np.ndarray) -> float | None:
    if x.size < 2:
        return None
    return 0.0 if _constant(x) else float(x.std(ddof=1))


def _constant(x: np.ndarray) -> bool:
    return bool(x.size > 0 and np.all(x == x[0]))


def _few_note(n_a: int, n_b: int | None) -> str:
    if n_a < 2:
        return f"the run has {n_a} repeat(s): at least 2 (better 3 or more) are needed for an interval"
    return f"the reference has {n_b} value(s): at least 2 are needed for a two-sample interval"


# ---------------------------------------------------------------- repeats needed


def repeats_needed(
    diff: float,
    std_a: float,
    margin: float,
    alpha: float = DEFAULT_ALPHA,
    *,
    std_b: float | None = None,
    n_b: int | None = None,
    kind: str = "equivalence",
    power: float = DEFAULT_POWER,
) -> int | None:
    """Smallest number of run repeats that would decide the question with the given power.

    Assumes the observed difference and standard deviations are the true ones (a rough
    guide, not a promise).  ``kind``:

    * ``"equivalence"``: show |diff| < margin (TOST); needs |diff| < margin.
    * ``"difference"``: show the interval lies beyond the margin; needs |diff| > margin.
    * ``"one-sided"``: show ``diff > 0`` (pass ``diff`` already shifted by the margin or
      band); used for bands and non-inferiority.

    With ``std_b`` the reference keeps its ``n_b`` values (Welch); with ``std_b`` and no
    ``n_b`` both sides get the same n.  Power is the normal approximation to the t tests
    with t quantiles at the Welch degrees of freedom.  Returns None when more than
    MAX_REPEATS would be needed (e.g. the difference sits on the margin).
    """
    if std_a < 0 or margin < 0:
        raise ValueError("standard deviations and margins must be >= 0")
    # every candidate n at once: one vectorised pass instead of up to MAX_REPEATS scipy calls
    n = np.arange(2, MAX_REPEATS + 1, dtype=float)
    var = np.full_like(n, std_a**2) / n
    if std_b is None:
        df = n - 1.0
    else:
        nb = n if n_b is None else np.full_like(n, float(n_b))
        var_b = np.full_like(n, std_b**2) / nb
        with np.errstate(divide="ignore", invalid="ignore"):
            df = np.where(var + var_b > 0, welch_df(std_a**2, n, std_b**2, nb), n + nb - 2.0)
        var = var + var_b
    if np.all(var == 0.0):
        return 2  # no spread: any interval is a point, decided exactly
    se = np.sqrt(var)
    tq = dist.t_ppf(1.0 - alpha, df)
    if kind == "equivalence":
        achieved = dist.norm_cdf((margin - diff) / se - tq) + dist.norm_cdf((margin + diff) / se - tq) - 1.0
    elif kind == "difference":
        achieved = dist.norm_cdf((abs(diff) - margin) / se - tq)
    elif kind == "one-sided":
        achieved = dist.norm_cdf(abs(diff) / se - tq)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    hits = np.nonzero(achieved >= power)[0]
    return int(n[hits[0]]) if hits.size else None


# ------------------------------------------------------------------ repeats a question needs
# (bands, equivalence, the variance attribution and `repro500 plan` ask the same two questions)

def band_repeats(mean: float, sd: float, criterion: Any, alpha: float,
                 power: float = DEFAULT_POWER) -> int | None:
    """Repeats for the band's one-sided (1 - alpha) bound to fall on one side of its threshold
    with the given power, if the true mean and spread are *mean* and *sd* (*criterion*: a
    :class:`repro500.verify.rundir.Criterion`, read for its threshold)."""
    return repeats_needed(mean - criterion.threshold, sd, 0.0, alpha, kind="one-sided", power=power)


def equivalence_repeats(diff: float, sd: float, margin: float, alpha: float, *, sd_ref: float | None = None,
                        n_ref: int | None = None, test: str = "equivalence", direction: str = "higher",
                        power: float = DEFAULT_POWER) -> tuple[int | None, bool]:
    """Run repeats for the equivalence (TOST) or non-inferiority test to decide, if the true
    difference (run - reference) is *diff*.  With *sd_ref*, the reference keeps its *n_ref*
    values; when no count of run repeats alone decides it, the count that both sides would need
    is returned with ``True``."""
    if test == "equivalence":
        kind, shifted, m = ("equivalence" if abs(diff) < margin else "difference"), diff, margin
    else:  # non-inferiority: only the bound on the bad side must clear the margin
        kind, shifted, m = "one-sided", (diff + margin if direction == "higher" else margin - diff), 0.0
    n = repeats_needed(shifted, sd, m, alpha, std_b=sd_ref, n_b=n_ref, kind=kind, power=power)
    if n is None and sd_ref is not None and n_ref is not None:
        both = repeats_needed(shifted, sd, m, alpha, std_b=sd_ref, kind=kind, power=power)
        return both, both is not None
    return n, False
