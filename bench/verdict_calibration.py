"""Calibration of the equivalence verdict by Monte Carlo.

Repeats are drawn from known normal distributions; each simulated comparison is decided by
the same code the verdict uses (``repro500.verify.stats.tost_from_stats`` for the interval and
``repro500.verify.equivalence.decide`` for the rules).  Reported:

* **wrong REPRODUCED rate** when the true difference lies on or outside the margin
  (|diff| = margin is the worst case): must be <= alpha within Monte Carlo error;
* **wrong NOT REPRODUCED rate** when the true difference lies on or inside the margin:
  must be <= alpha as well (NOT REPRODUCED is a finding, not "equivalence not shown");
* **power** (rate of REPRODUCED) when the true difference lies inside the margin,
  at n = 3, 5 and 10 repeats, and at the n that ``repeats_needed`` recommends;
* the same error rates for the **one-sided non-inferiority** test of the shipped published
  file experiments/published/deep500_cifar10_resnet44.yaml (value, margin and direction read
  from it; run-to-run sd = margin / 3, as its comment assumes), and its mirror image for a
  lower-is-better metric.

Every rate is printed with +- 3 standard errors; a rate above alpha + 3 SE is MISSED (when the
true rate is exactly alpha, as for a one-sided t test at the margin, a cell crosses that line
by chance about once in 740, where 2 SE would cross once in 44).  A small sample of draws is
also decided through the full scalar path (``compare_values``) to show it agrees with the
vectorised core.

Section 6b is the **paired** design (a rerun repeat and the reference repeat of the same seed;
stats.tost_paired): its wrong REPRODUCED and wrong NOT REPRODUCED rates at the margin across n,
the between-seed spread and the kernel noise, and a power case, a large spread between seeds with
small kernel noise, where it prints the repeats each design needs for 80 % power (paired must need
at most 1/5 of the unpaired design's) and the power simulated at those counts.

Section 7 is the sequential design of ``run --until-decided`` (bench/sequential_design.py); 7b the
same designs looked at after every batch of 2, 4 and 8 repeats side by side (``--parallel B``).

Run: ``python bench/verdict_calibration.py`` (sections 1-6 about 15 s, section 7 a few minutes).
The exit status has one bit per target, so that none hides another: 1 when an error rate
(any section, the sequential design's included) is MISSED, 2 when section 7's expected-repeats
ratio is MISSED somewhere, 4 when the paired design's power case needs more than 1/5 of the
unpaired design's repeats; 0 when every target is met.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from repro500.verify import equivalence, stats
from repro500.verify.equivalence import compare_values
from repro500.verify.published import load_published
from repro500.verify.reference import Pairing

ALPHA = 0.05
MARGIN = 1.0  # in units of the reference's standard deviation
DRAWS = 100_000
NS = (3, 5, 10)
SEED = 20261122
Z_LIMIT = 3.0  # a rate above alpha + Z_LIMIT standard errors is MISSED
PUBLISHED = Path(__file__).resolve().parent.parent / "experiments" / "published" / "deep500_cifar10_resnet44.yaml"


def decide(diff, se, df, margin=MARGIN, alpha=ALPHA, test="equivalence", direction="higher"):
    """Vectorised decisions: 1 REPRODUCED, -1 NOT REPRODUCED, 0 INCONCLUSIVE."""
    low, high, _, _ = stats.tost_from_stats(diff, se, df, margin, alpha)
    return equivalence.decide(low, high, margin, test, direction)


def simulate(rng, n, true_diff, *, two_sample=True, sd_run=1.0, sd_ref=1.0, draws=DRAWS):
    run = rng.normal(true_diff, sd_run, (draws, n))
    if two_sample:
        ref = rng.normal(0.0, sd_ref, (draws, n))
        va, vb = run.var(axis=1, ddof=1), ref.var(axis=1, ddof=1)
        se = np.sqrt(va / n + vb / n)
        return decide(run.mean(1) - ref.mean(1), se, stats.welch_df(va, n, vb, n))
    se = run.std(axis=1, ddof=1) / math.sqrt(n)
    return decide(run.mean(1), se, np.full(draws, n - 1.0))


def simulate_one_sample(rng, n, value, true_diff, sd, margin, test, direction, draws=DRAWS):
    """A rerun against one published value (taken as exact), decided as verify decides it."""
    run = rng.normal(value + true_diff, sd, (draws, n))
    se = run.std(axis=1, ddof=1) / math.sqrt(n)
    return decide(run.mean(1) - value, se, np.full(draws, n - 1.0), margin, ALPHA, test, direction)


def simulate_paired(rng, n, true_diff, *, sd_seed=1.0, sd_noise=1.0, draws=DRAWS):
    """A rerun paired seed by seed with its reference: each seed shifts both members of its pair by
    the same N(0, sd_seed) amount, each repeat adds its own N(0, sd_noise) kernel noise, and the
    paired test decides on the differences (what verify does when the seeds match)."""
    seed = rng.normal(0.0, sd_seed, (draws, n))
    ref = seed + rng.normal(0.0, sd_noise, (draws, n))
    run = seed + true_diff + rng.normal(0.0, sd_noise, (draws, n))
    d = run - ref
    return decide(d.mean(1), d.std(axis=1, ddof=1) / math.sqrt(n), np.full(draws, n - 1.0))


def simulate_unpaired(rng, n, true_diff, *, sd_seed=1.0, sd_noise=1.0, draws=DRAWS):
    """The same rerun and reference under different seeds: Welch on the two samples."""
    ref = rng.normal(0.0, sd_seed, (draws, n)) + rng.normal(0.0, sd_noise, (draws, n))
    run = rng.normal(true_diff, sd_seed, (draws, n)) + rng.normal(0.0, sd_noise, (draws, n))
    va, vb = run.var(axis=1, ddof=1), ref.var(axis=1, ddof=1)
    return decide(run.mean(1) - ref.mean(1), np.sqrt(va / n + vb / n), stats.welch_df(va, n, vb, n))


# the power case: a spread between seeds of 2.5 margins (the worked example in docs/verify.md:
# test perplexity spread ~25, margin 10) and kernel noise of a fifth of the margin
POWER_CASE = {"sd_seed": 2.5, "sd_noise": 0.2}
POWER_RATIO = 0.2  # paired must need at most 1/5 of the unpaired design's repeats


def paired_repeats(sd_seed, sd_noise, margin=MARGIN, alpha=ALPHA, diff=0.0):
    """(paired, unpaired) repeats for 80 % power, as the verdict's advice computes them: the paired
    test from the spread of the differences (sqrt(2) sd_noise), Welch from the spread of the values
    on both sides (sqrt(sd_seed^2 + sd_noise^2)), the same n on each."""
    paired, _ = stats.equivalence_repeats(diff, math.sqrt(2.0) * sd_noise, margin, alpha)
    spread = math.hypot(sd_seed, sd_noise)
    unpaired = stats.repeats_needed(diff, spread, margin, alpha, std_b=spread)
    return paired, unpaired


def paired_section(rng, missed, power_missed, draws=DRAWS):
    """Section 6b: the paired design's error rates across the grid, and the power case."""
    print("\n6b. paired by seed (one-sample TOST on the per-seed differences):")
    print(f"   {'sd seed':>7} {'sd noise':>8}{'n':>4}  {'true diff':>9}  {'rate +- 3SE':>18}  ratio to alpha")
    print("   wrong REPRODUCED, true |difference| >= margin (target <= alpha):")
    grid = [(0.0, 1.0), (3.0, 1.0), (3.0, 0.2)]
    for sd_seed, sd_noise in grid:
        for n in NS:
            for diff in (MARGIN, 1.5 * MARGIN, -MARGIN):
                error_cell(simulate_paired(rng, n, diff, sd_seed=sd_seed, sd_noise=sd_noise, draws=draws), 1,
                           f"   {sd_seed:>7.1f} {sd_noise:>8.1f}{n:>4}  {diff:>9.2f}",
                           f"paired sd_seed={sd_seed} sd_noise={sd_noise} n={n} diff={diff}", missed)
    print("   wrong NOT REPRODUCED, true |difference| <= margin (target <= alpha):")
    for sd_seed, sd_noise in grid:
        for n in NS:
            for diff in (MARGIN, 0.0):
                error_cell(simulate_paired(rng, n, diff, sd_seed=sd_seed, sd_noise=sd_noise, draws=draws), -1,
                           f"   {sd_seed:>7.1f} {sd_noise:>8.1f}{n:>4}  {diff:>9.2f}",
                           f"paired NOT REPRODUCED sd_seed={sd_seed} sd_noise={sd_noise} n={n} diff={diff}", missed)
    sd_seed, sd_noise = POWER_CASE["sd_seed"], POWER_CASE["sd_noise"]
    paired, unpaired = paired_repeats(sd_seed, sd_noise)
    print(f"   power case: spread between seeds {sd_seed:g} margins, kernel noise {sd_noise:g} margins, true "
          "difference 0, 80 % power:")
    p_paired, se_paired = rate(simulate_paired(rng, paired, 0.0, draws=draws, **POWER_CASE), 1)
    p_unpaired, se_unpaired = rate(simulate_unpaired(rng, unpaired, 0.0, draws=draws, **POWER_CASE), 1)
    p_unpaired_at_paired, _ = rate(simulate_unpaired(rng, paired, 0.0, draws=draws, **POWER_CASE), 1)
    print(f"   paired:   {paired:>4} repeats on both sides (simulated power {p_paired:.3f} +- {2 * se_paired:.3f})")
    print(f"   unpaired: {unpaired:>4} repeats on both sides (simulated power {p_unpaired:.3f} +- {2 * se_unpaired:.3f}; "
          f"at {paired} repeats: {p_unpaired_at_paired:.3f})")
    ratio = paired / unpaired
    ok = ratio <= POWER_RATIO
    print(f"   paired / unpaired = {ratio:.3f} (target <= {POWER_RATIO:g}){'' if ok else '  MISSED'}")
    if not ok:
        power_missed.append(f"paired needs {paired} of the unpaired design's {unpaired} repeats")
    return paired, unpaired


def rate(decisions, code):
    """(rate, one standard error) of ``code`` among the decisions."""
    p = float(np.mean(decisions == code))
    return p, math.sqrt(max(p * (1 - p), 1e-12) / decisions.size)


def within(p, se):
    return p <= ALPHA + Z_LIMIT * se


def error_cell(decisions, code, row, what, missed):
    """Print ``row`` with the rate of the wrong decision ``code``; over its limit, MISSED and
    ``what`` recorded in ``missed``."""
    p, se = rate(decisions, code)
    ok = within(p, se)
    if not ok:
        missed.append(what)
    print(f"{row}  {p:>8.4f} +- {Z_LIMIT * se:.4f}  {p / ALPHA:5.2f}x{'' if ok else '  MISSED'}")


def scalar_agreement(rng, n=5, draws=300, published=None):
    """Decide ``draws`` draws of each path through compare_values (the verdict's own path) and the
    core: (agreeing, decided)."""
    agree = total = 0
    codes = {"REPRODUCED": 1, "NOT REPRODUCED": -1, "INCONCLUSIVE": 0}
    for _ in range(draws):
        a, b = rng.normal(0.5, 1.0, n), rng.normal(0.0, 1.0, n)
        status = compare_values("m", list(a), list(b), MARGIN, ALPHA).status
        va, vb = a.var(ddof=1), b.var(ddof=1)
        code = decide(a.mean() - b.mean(), math.sqrt(va / n + vb / n), stats.welch_df(va, n, vb, n))
        agree, total = agree + (codes[status] == int(code)), total + 1
    for _ in range(draws):  # the paired path: pairs sharing a seed's shift
        seed = rng.normal(0.0, 3.0, n)
        a, b = seed + rng.normal(0.5, 1.0, n), seed + rng.normal(0.0, 1.0, n)
        pairs = [{"repeat": k, "reference_repeat": k, "seed": k, "value": float(x), "reference_value": float(y)}
                 for k, (x, y) in enumerate(zip(a, b, strict=True))]
        status = compare_values("m", list(a), list(b), MARGIN, ALPHA, pairing=Pairing(True, "bench", pairs)).status
        d = a - b
        agree += codes[status] == int(decide(d.mean(), d.std(ddof=1) / math.sqrt(n), n - 1.0))
        total += 1
    if published is not None:  # the one-sided path of a published threshold claim
        for _ in range(draws):
            a = rng.normal(published.values[0] - published.margin, published.margin, n)
            status = compare_values("m", list(a), published.values, published.margin, ALPHA, single_value=True,
                                    test=published.test, direction=published.direction).status
            code = decide(a.mean() - published.values[0], a.std(ddof=1) / math.sqrt(n), n - 1.0,
                          published.margin, ALPHA, published.test, published.direction)
            agree += codes[status] == int(code)
            total += 1
    return agree, total


def non_inferiority(rng, missed):
    """Error rates of the one-sided test the shipped Deep500 published file uses."""
    pub = load_published(PUBLISHED)
    (name, metric), = pub.metrics.items()
    value, delta = metric.values[0], metric.margin
    sd = delta / 3.0
    print(f"\n5. one-sided non-inferiority, {PUBLISHED.name}: {name} {metric.direction} is better, value {value:g}, "
          f"margin {delta:g}, test {metric.test}, run sd {sd:.4g} (margin / 3)")
    assert metric.test == "non_inferiority" and metric.single, "the shipped file changed: update this bench"
    # sign: +1 when a shortfall is a lower value (higher is better), -1 for the mirror image
    sides = [(metric.direction, 1.0), ("lower" if metric.direction == "higher" else "higher", -1.0)]
    print(f"   {'direction':<10}{'n':>4}  {'true diff':>10}  {'rate +- 3SE':>18}  ratio to alpha")
    print("   wrong REPRODUCED, true value beyond the margin on the wrong side (target <= alpha):")
    for direction, sign in sides:
        for n in NS:
            for k in (1.0, 1.1, 1.25):
                diff = -sign * k * delta
                error_cell(simulate_one_sample(rng, n, value, diff, sd, delta, metric.test, direction), 1,
                           f"   {direction:<10}{n:>4}  {diff:>+10.4f}",
                           f"non-inferiority {direction} n={n} diff={diff:+g}", missed)
    print("   wrong NOT REPRODUCED, true value at the margin (target <= alpha):")
    for direction, sign in sides:
        for n in NS:
            diff = -sign * delta
            error_cell(simulate_one_sample(rng, n, value, diff, sd, delta, metric.test, direction), -1,
                       f"   {direction:<10}{n:>4}  {diff:>+10.4f}",
                       f"non-inferiority NOT REPRODUCED {direction} n={n}", missed)
    print("   power (rate of REPRODUCED):")
    for diff in (0.0, 0.001, -0.5 * delta):
        cells = []
        for n in NS:
            p, se = rate(simulate_one_sample(rng, n, value, diff, sd, delta, metric.test, metric.direction), 1)
            cells.append(f"n={n}: {p:.3f}")
        print(f"   {metric.direction:<10} true diff {diff:+.4f}:  " + ";  ".join(cells))
    return pub.metrics[name]


def main() -> int:
    start = time.perf_counter()
    rng = np.random.default_rng(SEED)
    missed = []
    print(f"alpha = {ALPHA}, margin = {MARGIN} sd, {DRAWS} draws per cell, seed {SEED}; "
          f"MISSED when a rate > alpha + {Z_LIMIT:g} SE")
    print("\n1. wrong REPRODUCED rate, true |difference| >= margin (target <= alpha):")
    print(f"   {'test':<34}{'n':>4}  {'true diff':>9}  {'rate +- 3SE':>18}  ratio to alpha")
    cases = [
        ("two-sample Welch TOST", dict(two_sample=True)),
        ("two-sample Welch, sd run 2 / ref 1", dict(two_sample=True, sd_run=2.0)),
        ("one-sample TOST (published value)", dict(two_sample=False)),
    ]
    for label, kw in cases:
        for n in NS:
            for diff in (MARGIN, 1.5 * MARGIN, -MARGIN):
                error_cell(simulate(rng, n, diff, **kw), 1, f"   {label:<34}{n:>4}  {diff:>9.2f}",
                           f"{label} n={n} diff={diff}", missed)
    print("\n2. wrong NOT REPRODUCED rate, true |difference| <= margin (target <= alpha):")
    for label, kw in cases:
        for n in NS:
            for diff in (MARGIN, 0.0):
                error_cell(simulate(rng, n, diff, **kw), -1, f"   {label:<34}{n:>4}  {diff:>9.2f}",
                           f"NOT REPRODUCED {label} n={n} diff={diff}", missed)
    print("\n3. power (rate of REPRODUCED), true difference inside the margin:")
    for label, kw in cases[::2]:
        for diff in (0.0, 0.5 * MARGIN):
            cells = []
            for n in NS:
                p, se = rate(simulate(rng, n, diff, **kw), 1)
                cells.append(f"n={n}: {p:.3f} +- {2 * se:.3f}")
            print(f"   {label:<34} true diff {diff:.2f}:  " + ";  ".join(cells))
    print("\n4. repeats_needed (80 % power target) vs simulated power at that n:")
    for label, kw in cases[::2]:
        for diff in (0.0, 0.5 * MARGIN):
            std_b = 1.0 if kw["two_sample"] else None
            n = stats.repeats_needed(diff, 1.0, MARGIN, ALPHA, std_b=std_b)
            p, se = rate(simulate(rng, n, diff, **kw), 1)
            print(f"   {label:<34} true diff {diff:.2f}: recommends n={n}, simulated power {p:.3f} +- {2 * se:.3f}")
    published = non_inferiority(rng, missed)
    agree, total = scalar_agreement(rng, published=published)
    print(f"\n6. scalar path (compare_values) agrees with the vectorised core on {agree}/{total} draws "
          "(two-sample and paired equivalence, one-sided published)")
    if agree != total:
        missed.append("scalar/vectorised disagreement")
    power_missed: list[str] = []
    paired_section(rng, missed, power_missed)
    elapsed = time.perf_counter() - start
    print(f"\nsections 1-6: elapsed {elapsed:.1f} s (target < 90 s, ratio {elapsed / 90:.2f})")
    from sequential_design import run_batches, run_grid  # bench/, beside this file

    ratios: list[str] = []
    start = time.perf_counter()
    run_grid(rng, missed, ratios)  # 7. the sequential design of --until-decided (minutes: N up to 100)
    run_batches(rng, missed)  # 7b. the same, looked at after each batch of repeats side by side
    print(f"\nsection 7: elapsed {time.perf_counter() - start:.1f} s")
    print("RESULT (error rates): " + (f"OK, every error rate <= alpha within {Z_LIMIT:g} SE" if not missed
                                      else "MISSED: " + "; ".join(missed)))
    print("RESULT (section 7, expected repeats <= 0.70 of the fixed design's): "
          + ("OK" if not ratios else "MISSED: " + "; ".join(ratios)))
    print(f"RESULT (section 6b, paired repeats <= {POWER_RATIO:g} of unpaired): "
          + ("OK" if not power_missed else "MISSED: " + "; ".join(power_missed)))
    return (1 if missed else 0) | (2 if ratios else 0) | (4 if power_missed else 0)


if __name__ == "__main__":
    raise SystemExit(main())
