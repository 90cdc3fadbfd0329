"""The sequential design of ``repro500 run --until-decided``, by Monte Carlo.

A rerun is compared with a reference of n_ref repeats (sd 1, margin 1 sd) by the verdict's own
equivalence test (``sequential_plan.decide_at`` over ``stats.tost_from_stats`` and
``equivalence.decide``), looked at after every repeat from the 3rd to N at the nominal levels of
``repro500.verify.sequential``, and stopped at the first decided look.

Each design (a reference of 20 or 60 repeats, or one published value taken as exact; O'Brien-
Fleming or Pocock spending) gets its N as a user's would: ``sequential_plan.plan``, the function
behind ``repro500 plan`` and ``run --until-decided`` without ``--max-repeats``, gives the smallest
N whose looks take the right decision with POWER both where the rerun truly matches (difference
0: REPRODUCED) and where it is 1.5 margins off (NOT REPRODUCED); N is the larger of the two.  A
reference of 20 repeats cannot give 90% power at 1.5 margins with any N (its own noise caps it):
that design is sized at difference 0 alone and the cap is printed.  Reported per design and true
difference:

* the wrong REPRODUCED rate for |difference| >= margin and the wrong NOT REPRODUCED rate for
  |difference| <= margin: each must stay <= alpha + 3 Monte-Carlo SE (exit status bit 1);
* the power (rate of the right decision), the expected number of repeats E[n], and the fixed
  design with the same power (n_fixed: the fewest repeats whose single test at alpha decides as
  often): E[n] / n_fixed must be <= 0.70 where the true difference is 0 or >= 1.5 margins (exit
  status bit 2, so a missed ratio never hides a missed error rate, nor the reverse).

Section 7b runs the same designs looked at after every batch of 2, 4 and 8 repeats (``run
--until-decided`` with its repeats side by side, ``--parallel B``), each batch's levels calibrated
for its looks: the same error-rate bound (exit status bit 1), with the power and E[n] beside the
design that looks after every repeat.

Run alone (``python bench/sequential_design.py``; ``--batches`` for 7b alone) or as section 7 of
verdict_calibration.py.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from repro500.verify import sequential, sequential_plan  # noqa: E402

ALPHA = 0.05
MARGIN = 1.0
POWER = 0.90  # group-sequential practice sizes N for 90% power (Jennison & Turnbull, ch. 2)
PLANNED_AT = (0.0, 1.5)  # the true differences (in margins) each design must decide with POWER
DRAWS = 20_000
Z_LIMIT = 3.0
RATIO_TARGET = 0.70
FIXED_LIMIT = 400  # the largest fixed design searched for equal power
REFERENCES = (20, 60, None)
DIFFS = (0.0, 0.5, 1.0, -1.0, 1.5, 2.0)


def equal_power_fixed(rng, power, true_diff, n_ref, right, limit=FIXED_LIMIT):
    """The fewest repeats a fixed design needs to take the right decision as often (None: more
    than *limit*); its power grows with n, so a bisection finds it."""
    def reaches(n):
        return np.mean(sequential_plan.fixed(n, true_diff, MARGIN, n_ref, ALPHA, draws=DRAWS, rng=rng) == right) >= power

    if not reaches(limit):
        return None
    low, high = 3, limit
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if reaches(middle) else (middle + 1, high)
    return low


def size(n_ref, spending):
    """(N, the plans behind it, lines to print): N for POWER at every reachable PLANNED_AT."""
    plans = [sequential_plan.plan(d * MARGIN, MARGIN, n_ref, POWER, ALPHA, spending) for d in PLANNED_AT]
    lines = []
    for d, p in zip(PLANNED_AT, plans, strict=True):
        if p.max_repeats is None:
            lines.append(f"      planned at {d:g} margins: UNREACHABLE, {p.reason}")
        else:
            lines.append(f"      planned at {d:g} margins: N = {p.max_repeats} (fixed design n = {p.fixed_repeats}, "
                         f"simulated power {p.achieved_power:.3f})")
    reachable = [p.max_repeats for p in plans if p.max_repeats]
    return (max(reachable) if reachable else None), plans, lines


def run_grid(rng, missed, ratio_missed=None, references=REFERENCES):
    """Print the grid; error-rate misses go to *missed*, ratio misses to *ratio_missed*."""
    ratio_missed = missed if ratio_missed is None else ratio_missed
    print(f"\n7. sequential design (--until-decided): looks after every repeat from the {sequential.MIN_REPEATS}rd, "
          f"{DRAWS} draws per cell, margin {MARGIN} sd; N planned for {POWER:.0%} power at "
          f"{' and '.join(f'{d:g}' for d in PLANNED_AT)} margins (repro500 plan's function)")
    print(f"   {'N':>3} {'n_ref':>5} {'spending':<15}{'true diff':>9}  {'wrong decision +- 3SE':>22}  "
          f"{'power':>6} {'E[n]':>6} {'n_fixed':>7} {'ratio':>6}")
    for n_ref in references:
        for spending in sequential.SPENDING:
            n_max, plans, lines = size(n_ref, spending)
            print(f"   reference {n_ref or 'one value'}, {spending}:")
            for line in lines:
                print(line)
            if n_max is None:
                missed.append(f"sequential n_ref={n_ref} {spending}: no N reaches the power")
                continue
            caps = {d: p.power_cap for d, p in zip(PLANNED_AT, plans, strict=True) if p.power_cap is not None}
            for diff in DIFFS:
                _cell(rng, n_max, n_ref, spending, diff, caps, missed, ratio_missed)
            if spending == "obrien-fleming":
                _futility(n_max, n_ref, spending)


def _futility(n_max, n_ref, spending):
    """The same design with a non-binding futility stop, on the same simulated runs: what it saves
    where nothing decides (the margin's edge) and what power it costs where the design decides."""
    shown = []
    for diff in (0.0, 1.5, 1.0):
        both = [sequential_plan.simulate(n_max, diff * MARGIN, MARGIN, n_ref, ALPHA, spending, draws=DRAWS,
                                         rng=np.random.default_rng(int(diff * 10)), futility=f)
                for f in (0.0, sequential_plan.FUTILITY)]
        right = sequential_plan.right_decision(diff * MARGIN, MARGIN, "equivalence")
        rate = "power" if right is not None else "wrong R"
        code = right if right is not None else 1
        (a, ua), (b, ub) = both
        shown.append(f"{diff:g}: {rate} {np.mean(a == code):.3f} -> {np.mean(b == code):.3f}, "
                     f"E[n] {ua.mean():.1f} -> {ub.mean():.1f}")
    print(f"      with a futility stop (chance < {sequential_plan.FUTILITY:g} from N/2): " + "; ".join(shown))


def _wrong_cells(decision, diff, missed, label):
    """The wrong-decision rates at true difference *diff* (in margins), each with 3 SE: REPRODUCED
    at or outside the margin, NOT REPRODUCED at or inside it (1.0 is tested both ways); a rate over
    alpha + 3 SE goes to *missed* under *label*."""
    cells = []
    for code in ((1, -1) if abs(diff) == 1.0 else ((1,) if abs(diff) > 1.0 else (-1,))):
        p = float(np.mean(decision == code))
        se = math.sqrt(max(p * (1 - p), 1e-12) / decision.size)
        ok = p <= ALPHA + Z_LIMIT * se
        if not ok:
            missed.append(f"{label} diff={diff} wrong {code}")
        cells.append(f"{'R' if code == 1 else 'N'} {p:.4f}+-{Z_LIMIT * se:.4f}{'' if ok else ' MISSED'}")
    return cells


def _cell(rng, n_max, n_ref, spending, diff, caps, missed, ratio_missed):
    decision, used = sequential_plan.simulate(n_max, diff * MARGIN, MARGIN, n_ref, ALPHA, spending, draws=DRAWS,
                                              rng=rng)
    cells_out = _wrong_cells(decision, diff, missed, f"sequential N={n_max} n_ref={n_ref} {spending}")
    right = sequential_plan.right_decision(diff * MARGIN, MARGIN, "equivalence")
    tail = ""
    if right is not None:
        power = float(np.mean(decision == right))
        n_fixed = equal_power_fixed(rng, power, diff * MARGIN, n_ref, right)
        # no fixed design within FIXED_LIMIT repeats is as powerful: the ratio is below E[n] / FIXED_LIMIT
        ratio = float(used.mean()) / (n_fixed or FIXED_LIMIT)
        judged = diff == 0.0 or abs(diff) >= 1.5
        flag = ""
        if judged and not ratio <= RATIO_TARGET:
            flag = " MISSED"
            ratio_missed.append(f"sequential n_ref={n_ref} {spending} diff={diff} E[n]/n_fixed {ratio:.3f}")
        cap = caps.get(abs(diff))
        note = f" (power capped at {cap:.2f} by the reference: {POWER:.0%} unreachable)" if cap is not None else ""
        shown = f"{ratio:.3f}" if n_fixed else f"<{ratio:.3f}"
        tail = f"{power:>6.3f} {used.mean():>6.2f} {n_fixed or f'>{FIXED_LIMIT}':>7} {shown:>6}{flag}{note}"
    print(f"   {n_max:>3} {n_ref or 'value':>5} {spending:<15}{diff:>+9.2f}  {'; '.join(cells_out):>22}  {tail}")


BATCHES = (2, 4, 8)  # run --until-decided --launcher ... --parallel B: a look after every batch of B


def run_batches(rng, missed, references=(60, None), spending="obrien-fleming"):
    """The same designs looked at after every batch of B repeats side by side (their levels
    calibrated for those looks): the wrong-decision rates must stay <= alpha + 3 SE (misses go to
    *missed*); the power and E[n] are shown beside the design that looks after every repeat."""
    print(f"\n7b. sequential design in batches (--until-decided with --parallel B): looks where a batch ends, "
          f"{spending}, {DRAWS} draws per cell")
    print(f"   {'N':>3} {'n_ref':>5} {'batch':>5} {'looks':>6}{'true diff':>10}  {'wrong decision +- 3SE':>22}  "
          f"{'power':>6} {'E[n]':>6}")
    for n_ref in references:
        n_max = size(n_ref, spending)[0]
        if n_max is None:
            continue
        for batch in (1, *BATCHES):
            counts = sequential.looks(n_max, sequential.MIN_REPEATS, batch)
            for diff in (0.0, 1.0, -1.0, 1.5):
                decision, used = sequential_plan.simulate(n_max, diff * MARGIN, MARGIN, n_ref, ALPHA, spending,
                                                          draws=DRAWS, rng=rng, batch=batch)
                cells = _wrong_cells(decision, diff, missed, f"batch {batch} N={n_max} n_ref={n_ref}")
                right = sequential_plan.right_decision(diff * MARGIN, MARGIN, "equivalence")
                power = f"{np.mean(decision == right):>6.3f}" if right is not None else f"{'':>6}"
                print(f"   {n_max:>3} {n_ref or 'value':>5} {batch:>5} {len(counts):>6}{diff:>+10.2f}  "
                      f"{'; '.join(cells):>22}  {power} {used.mean():>6.2f}")


def main() -> int:
    errors: list[str] = []
    ratios: list[str] = []
    run_grid(np.random.default_rng(20261124), errors, ratios)
    run_batches(np.random.default_rng(20261129), errors)
    print("RESULT (error rates): " + ("OK" if not errors else "MISSED: " + "; ".join(errors)))
    print("RESULT (expected repeats): " + ("OK" if not ratios else "MISSED: " + "; ".join(ratios)))
    return (1 if errors else 0) | (2 if ratios else 0)


if __name__ == "__main__":
    if sys.argv[1:] == ["--batches"]:
        found: list[str] = []
        run_batches(np.random.default_rng(20261129), found)
        print("RESULT (error rates in batches): " + ("OK" if not found else "MISSED: " + "; ".join(found)))
        raise SystemExit(1 if found else 0)
    raise SystemExit(main())
