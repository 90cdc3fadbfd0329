"""The sequential design of ``repro500 run --until-decided``, by Monte Carlo (issue 20).

A rerun is compared with a reference of n_ref repeats (sd 1, margin 1 sd) by the verdict's own
equivalence test (``stats.tost_from_stats`` and ``equivalence.decide``), looked at after every
repeat from the 3rd to N at the nominal levels of ``repro500.verify.sequential`` and stopped at
the first decided look.  Reported per cell (N, spending function, true difference):

The cells: N = 20 against a reference of 20 and of 60 repeats, and N = 15 against one published
value (exact, one-sample), each with both spending functions.

* the wrong REPRODUCED rate for |difference| >= margin and the wrong NOT REPRODUCED rate for
  |difference| <= margin: each must stay <= alpha + 3 Monte-Carlo SE;
* the power (rate of the right decision), the expected number of repeats E[n], and the fixed
  design with the same power (the fewest repeats n_fixed whose single test at alpha decides as
  often): E[n] / n_fixed must be <= 0.70 where the true difference is 0 or >= 1.5 margins.

Run alone (``python bench/sequential_design.py``) or as section 7 of verdict_calibration.py.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from repro500.verify import equivalence, sequential, stats  # noqa: E402

ALPHA = 0.05
MARGIN = 1.0
DRAWS = 20_000
Z_LIMIT = 3.0
RATIO_TARGET = 0.70


def _decide_at(run_sum, run_sq, n, ref_mean, ref_var, n_ref, level):
    mean = run_sum / n
    var = np.maximum(run_sq - n * mean**2, 0.0) / (n - 1)
    if n_ref is None:  # against one published value, taken as exact: one-sample
        se, df = np.sqrt(var / n), np.full(mean.shape, n - 1.0)
    else:
        se, df = np.sqrt(var / n + ref_var / n_ref), stats.welch_df(var, n, ref_var, n_ref)
    low, high, _, _ = stats.tost_from_stats(mean - ref_mean, se, df, MARGIN, level)
    return equivalence.decide(low, high, MARGIN)


def _reference(rng, n_ref, draws):
    if n_ref is None:
        return np.zeros(draws), np.zeros(draws)
    ref = rng.normal(0.0, 1.0, (draws, n_ref))
    return ref.mean(1), ref.var(1, ddof=1)


def sequential_run(rng, n_max, true_diff, spending, n_ref, draws=DRAWS):
    """(decision per draw: 1 / -1 / 0, repeats used per draw)."""
    run = rng.normal(true_diff, 1.0, (draws, n_max))
    ref_mean, ref_var = _reference(rng, n_ref, draws)
    sums, squares = np.cumsum(run, 1), np.cumsum(run**2, 1)
    decision, used = np.zeros(draws, dtype=int), np.full(draws, n_max)
    undecided = np.ones(draws, dtype=bool)
    levels = sequential.nominal_levels(n_max, ALPHA, spending, sequential.MIN_REPEATS, n_ref)
    for n, level in zip(sequential.looks(n_max), levels, strict=True):
        code = _decide_at(sums[:, n - 1], squares[:, n - 1], n, ref_mean, ref_var, n_ref, level)
        now = undecided & (code != 0)
        decision[now], used[now] = code[now], n
        undecided &= code == 0
    return decision, used


def fixed_run(rng, n, true_diff, n_ref, draws=DRAWS):
    run = rng.normal(true_diff, 1.0, (draws, n))
    ref_mean, ref_var = _reference(rng, n_ref, draws)
    return _decide_at(run.sum(1), (run**2).sum(1), n, ref_mean, ref_var, n_ref, ALPHA)


def equal_power_fixed(rng, power, true_diff, n_ref, right, limit=80):
    """The fewest repeats a fixed design needs to take the right decision as often."""
    for n in range(3, limit + 1):
        if np.mean(fixed_run(rng, n, true_diff, n_ref) == right) >= power:
            return n
    return None


def run_grid(rng, missed, cells=((20, 20), (20, 60), (15, None))):
    print(f"\n7. sequential design (--until-decided): looks after every repeat from the "
          f"{sequential.MIN_REPEATS}rd, {DRAWS} draws per cell, reference of n_ref repeats, margin {MARGIN} sd")
    print(f"   {'N':>3} {'n_ref':>5} {'spending':<15}{'true diff':>9}  {'wrong decision +- 3SE':>22}  "
          f"{'power':>6} {'E[n]':>6} {'n_fixed':>7} {'ratio':>6}")
    for n_max, n_ref in cells:
        for spending in sequential.SPENDING:
            for diff in (0.0, 0.5, 1.0, -1.0, 1.5, 2.0):
                decision, used = sequential_run(rng, n_max, diff * MARGIN, spending, n_ref)
                wrong_code = 1 if abs(diff) >= 1.0 else -1  # 1.0 is tested both ways
                cells_out = []
                for code in ((1, -1) if abs(diff) == 1.0 else (wrong_code,)):
                    p = float(np.mean(decision == code))
                    se = math.sqrt(max(p * (1 - p), 1e-12) / decision.size)
                    ok = p <= ALPHA + Z_LIMIT * se
                    if not ok:
                        missed.append(f"sequential N={n_max} {spending} diff={diff} wrong {code}")
                    cells_out.append(f"{'R' if code == 1 else 'N'} {p:.4f}+-{Z_LIMIT * se:.4f}{'' if ok else ' MISSED'}")
                right = 1 if abs(diff) < 1.0 else (-1 if abs(diff) > 1.0 else None)
                tail = ""
                if right is not None:
                    power = float(np.mean(decision == right))
                    n_fixed = equal_power_fixed(rng, power, diff * MARGIN, n_ref, right)
                    ratio = float(used.mean()) / n_fixed if n_fixed else float("nan")
                    judged = diff == 0.0 or abs(diff) >= 1.5
                    flag = " MISSED" if judged and not ratio <= RATIO_TARGET else ""
                    if flag:
                        missed.append(f"sequential N={n_max} {spending} diff={diff} E[n]/n_fixed {ratio:.2f}")
                    tail = f"{power:>6.3f} {used.mean():>6.2f} {n_fixed or '-':>7} {ratio:>6.2f}{flag}"
                print(f"   {n_max:>3} {n_ref or 'value':>5} {spending:<15}{diff:>+9.2f}  {'; '.join(cells_out):>22}  {tail}")


if __name__ == "__main__":
    failures: list[str] = []
    run_grid(np.random.default_rng(20261124), failures)
    print("RESULT: " + ("OK" if not failures else "MISSED: " + "; ".join(failures)))
    raise SystemExit(1 if failures else 0)
