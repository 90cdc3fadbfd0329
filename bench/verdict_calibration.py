"""Calibration of the equivalence verdict by Monte Carlo (issue 5).

Repeats are drawn from known normal distributions; each simulated comparison is decided by
the same code the verdict uses (``repro500.verify.stats.tost_from_stats`` and the
classification rules of ``repro500.verify.equivalence``).  Reported:

* **wrong REPRODUCED rate** when the true difference lies on or outside the margin
  (|diff| = margin is the worst case): must be <= alpha within Monte Carlo error;
* **wrong NOT REPRODUCED rate** when the true difference lies on or inside the margin:
  must be <= alpha as well (NOT REPRODUCED is a finding, not "equivalence not shown");
* **power** (rate of REPRODUCED) when the true difference lies inside the margin,
  at n = 3, 5 and 10 repeats, and at the n that ``repeats_needed`` recommends.

Every rate is printed with +- 2 standard errors.  A small sample of draws is also decided
through the full scalar path (``compare_values``) to show it agrees with the vectorised core.

Run: ``python bench/verdict_calibration.py`` (about 10 s; exits 0 and prints MISSED
when a rate exceeds alpha + 2 SE).
"""

from __future__ import annotations

import math
import time

import numpy as np

from repro500.verify import stats
from repro500.verify.equivalence import compare_values

ALPHA = 0.05
MARGIN = 1.0  # in units of the reference's standard deviation
DRAWS = 100_000
NS = (3, 5, 10)
SEED = 20261122


def decide(diff, se, df, margin=MARGIN, alpha=ALPHA):
    """Vectorised decisions: 1 REPRODUCED, -1 NOT REPRODUCED, 0 INCONCLUSIVE."""
    low, high, _, _ = stats.tost_from_stats(diff, se, df, margin, alpha)
    out = np.zeros(np.shape(diff), dtype=int)
    out[(low >= -margin) & (high <= margin)] = 1
    out[(low > margin) | (high < -margin)] = -1
    return out


def simulate(rng, n, true_diff, *, two_sample=True, sd_run=1.0, sd_ref=1.0, draws=DRAWS):
    run = rng.normal(true_diff, sd_run, (draws, n))
    if two_sample:
        ref = rng.normal(0.0, sd_ref, (draws, n))
        va, vb = run.var(axis=1, ddof=1), ref.var(axis=1, ddof=1)
        se = np.sqrt(va / n + vb / n)
        return decide(run.mean(1) - ref.mean(1), se, stats.welch_df(va, n, vb, n))
    se = run.std(axis=1, ddof=1) / math.sqrt(n)
    return decide(run.mean(1), se, np.full(draws, n - 1.0))


def rate(decisions, code):
    p = float(np.mean(decisions == code))
    return p, 2.0 * math.sqrt(max(p * (1 - p), 1e-12) / decisions.size)


def scalar_agreement(rng, n=5, draws=300):
    """Decide a few draws through compare_values (the verdict's own path) and the core."""
    agree = 0
    for _ in range(draws):
        a, b = rng.normal(0.5, 1.0, n), rng.normal(0.0, 1.0, n)
        status = compare_values("m", list(a), list(b), MARGIN, ALPHA).status
        va, vb = a.var(ddof=1), b.var(ddof=1)
        code = decide(a.mean() - b.mean(), math.sqrt(va / n + vb / n), stats.welch_df(va, n, vb, n))
        agree += {"REPRODUCED": 1, "NOT REPRODUCED": -1, "INCONCLUSIVE": 0}[status] == int(code)
    return agree, draws


def main() -> int:
    start = time.perf_counter()
    rng = np.random.default_rng(SEED)
    missed = []
    print(f"alpha = {ALPHA}, margin = {MARGIN} sd, {DRAWS} draws per cell, seed {SEED}")
    print("\n1. wrong REPRODUCED rate, true |difference| >= margin (target <= alpha):")
    print(f"   {'test':<34}{'n':>4}  {'true diff':>9}  {'rate +- 2SE':>18}  ratio to alpha")
    cases = [
        ("two-sample Welch TOST", dict(two_sample=True)),
        ("two-sample Welch, sd run 2 / ref 1", dict(two_sample=True, sd_run=2.0)),
        ("one-sample TOST (published value)", dict(two_sample=False)),
    ]
    for label, kw in cases:
        for n in NS:
            for diff in (MARGIN, 1.5 * MARGIN, -MARGIN):
                p, se2 = rate(simulate(rng, n, diff, **kw), 1)
                ok = p <= ALPHA + se2
                missed += [] if ok else [f"{label} n={n} diff={diff}"]
                print(f"   {label:<34}{n:>4}  {diff:>9.2f}  {p:>8.4f} +- {se2:.4f}  {p / ALPHA:5.2f}x"
                      f"{'' if ok else '  MISSED'}")
    print("\n2. wrong NOT REPRODUCED rate, true |difference| <= margin (target <= alpha):")
    for label, kw in cases:
        for n in NS:
            for diff in (MARGIN, 0.0):
                p, se2 = rate(simulate(rng, n, diff, **kw), -1)
                ok = p <= ALPHA + se2
                missed += [] if ok else [f"NOT REPRODUCED {label} n={n} diff={diff}"]
                print(f"   {label:<34}{n:>4}  {diff:>9.2f}  {p:>8.4f} +- {se2:.4f}  {p / ALPHA:5.2f}x"
                      f"{'' if ok else '  MISSED'}")
    print("\n3. power (rate of REPRODUCED), true difference inside the margin:")
    for label, kw in cases[::2]:
        for diff in (0.0, 0.5 * MARGIN):
            cells = []
            for n in NS:
                p, se2 = rate(simulate(rng, n, diff, **kw), 1)
                cells.append(f"n={n}: {p:.3f} +- {se2:.3f}")
            print(f"   {label:<34} true diff {diff:.2f}:  " + ";  ".join(cells))
    print("\n4. repeats_needed (80 % power target) vs simulated power at that n:")
    for label, kw in cases[::2]:
        for diff in (0.0, 0.5 * MARGIN):
            std_b = 1.0 if kw["two_sample"] else None
            n = stats.repeats_needed(diff, 1.0, MARGIN, ALPHA, std_b=std_b)
            p, se2 = rate(simulate(rng, n, diff, **kw), 1)
            print(f"   {label:<34} true diff {diff:.2f}: recommends n={n}, simulated power {p:.3f} +- {se2:.3f}")
    agree, total = scalar_agreement(rng)
    print(f"\n5. scalar path (compare_values) agrees with the vectorised core on {agree}/{total} draws")
    if agree != total:
        missed.append("scalar/vectorised disagreement")
    elapsed = time.perf_counter() - start
    print(f"\nelapsed {elapsed:.1f} s (target < 60 s, ratio {elapsed / 60:.2f})")
    worst = max(float(np.mean(simulate(rng, n, MARGIN, two_sample=False) == 1)) for n in NS)
    print(f"worst wrong-REPRODUCED rate (one-sample, at the margin): {worst:.4f} = {worst / ALPHA:.2f}x alpha")
    print("RESULT: " + ("OK, every error rate <= alpha within 2 SE" if not missed else "MISSED: " + "; ".join(missed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
