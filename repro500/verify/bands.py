"""Bands: did the run meet each acceptance criterion, judged across repeats?

A criterion is decided on a one-sided (1 - alpha) confidence bound of the mean, never on
the best repeat.  For "higher is better" with threshold ``target - tolerance``:

* PASS when the lower bound >= threshold (confident the mean meets the band);
* FAIL when the upper bound < threshold (confident it misses);
* INCONCLUSIVE otherwise (the interval straddles the threshold), with an estimate of the
  repeats that would decide it.

"Lower is better" mirrors this with threshold ``target + tolerance``.  With zero variance
the bounds equal the mean and the decision is exact; with one repeat it is INCONCLUSIVE.

A band cannot PASS while any repeat diverged, failed or was killed: deciding on the completed
repeats alone is deciding on the lucky ones.  It becomes INCONCLUSIVE naming those repeats; a
band that the completed repeats already FAIL stays FAIL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from repro500.statuses import FAIL, INCONCLUSIVE, PASS, REPEAT_DIVERGED
from repro500.verify import stats
from repro500.verify.rundir import Criterion, RunData


@dataclass
class BandResult:
    metric: str
    direction: str
    target: float
    tolerance: float
    threshold: float
    n: int
    mean: float | None
    lower_bound: float | None
    upper_bound: float | None
    bound_confidence: float
    status: str  # PASS | FAIL | INCONCLUSIVE
    reason: str
    repeats_needed: int | None = None
    advice: list[str] = field(default_factory=list)
    # The one bound the status rests on, named, and its distance from the threshold (positive on
    # the band's side): every record (terminal, verdict.json, DVC's view, MLflow) reads these.
    bound: float | None = None
    bound_side: str | None = None  # "lower" | "upper"
    margin: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_band(
    criterion: Criterion, values: list[float], alpha: float, *, unsuccessful: dict[int, str] | None = None
) -> BandResult:
    """Decide one criterion from the values of the completed repeats.

    ``unsuccessful`` maps the repeats that did not complete to their state; any of them keeps
    the band from passing.
    """
    res = _decide(criterion, values, alpha, len(unsuccessful or {}))
    if unsuccessful and res.status == PASS:
        _block_pass(res, unsuccessful)
    _name_the_bound(res)
    return res


def _name_the_bound(res: BandResult) -> None:
    """Record the bound the status rests on: a miss on the far bound (FAIL: the upper bound of a
    higher-is-better band is below the threshold), a pass on the near one; a band not decided is
    shown with the near bound, the one that would have to cross the threshold to pass."""
    if res.lower_bound is None or res.upper_bound is None:
        return
    higher = res.direction == "higher"
    far = res.status == FAIL
    res.bound_side = ("upper" if higher else "lower") if far else ("lower" if higher else "upper")
    res.bound = res.upper_bound if res.bound_side == "upper" else res.lower_bound
    res.margin = res.bound - res.threshold if higher else res.threshold - res.bound


def _block_pass(res: BandResult, unsuccessful: dict[int, str]) -> None:
    """Turn a PASS on the completed repeats into INCONCLUSIVE, naming the missing repeats."""
    shown = ", ".join(f"{k} ({state})" for k, state in sorted(unsuccessful.items()))
    steps = []
    if REPEAT_DIVERGED in unsuccessful.values():
        steps.append("investigate the divergence (NaN/Inf loss: e.g. a lower learning rate), then rerun")
    if any(state != REPEAT_DIVERGED for state in unsuccessful.values()):
        steps.append("rerun them (`repro500 run --resume RUN` completes killed ones)")
    todo = "; ".join(steps)
    res.status = INCONCLUSIVE
    res.reason = (f"repeat(s) {shown} did not complete, so the band cannot pass on the {res.n} that did "
                  f"({res.reason}); {todo}")
    res.advice.append(f"{res.metric}: repeat(s) {shown} did not complete: {todo}")


def _decide(c: Criterion, values: list[float], alpha: float, unsuccessful: int) -> BandResult:
    higher = c.direction == "higher"
    sign = ">=" if higher else "<="
    res = BandResult(
        metric=c.metric, direction=c.direction, target=c.target, tolerance=c.tolerance,
        threshold=c.threshold, n=len(values), mean=None, lower_bound=None, upper_bound=None,
        bound_confidence=1.0 - alpha, status=INCONCLUSIVE, reason="",
    )
    band = f"{sign} {c.threshold:.6g} (target {c.target:.6g}, tolerance {c.tolerance:.6g})"
    if not values:
        if unsuccessful:
            res.status = FAIL
            res.reason = f"no completed repeat reported {c.metric} ({unsuccessful} did not complete); band {band}"
        else:
            res.reason = f"no repeat reported {c.metric}; band {band}"
            res.advice.append(f"check that the workload records '{c.metric}' in each repeat summary")
        return res
    desc = stats.describe(values, alpha)
    res.mean = desc["mean"]
    if len(values) == 1:
        res.reason = f"one repeat ({values[0]:.6g}) cannot bound the mean; band {band}"
        res.advice.append("run at least 3 repeats (repro500 run --repeats 3) so a confidence bound exists")
        return res
    low, high = stats.one_sided_bounds(values, alpha)
    res.lower_bound, res.upper_bound = low, high
    level = f"{100 * (1.0 - alpha):.4g}%"  # a look's nominal level: 99.81%, not a rounded 100%
    decisive, opposite = (low, high) if higher else (high, low)
    meets = decisive >= c.threshold if higher else decisive <= c.threshold
    misses = opposite < c.threshold if higher else opposite > c.threshold
    which, other = ("lower", "upper") if higher else ("upper", "lower")
    if desc["zero_variance"]:
        # Decided in decimal on the values as written: 0.93 - 0.005 in binary floating point is
        # a hair above 0.925, so a repeat of exactly 0.925 would miss a band it meets on paper
        # (the same edge rule as equivalence; docs/verify.md).
        from decimal import Decimal

        v, t, tol = (Decimal(repr(float(x))) for x in (values[0], c.target, c.tolerance))
        meets = v >= t - tol if higher else v <= t + tol
        res.status = PASS if meets else FAIL
        res.reason = f"all {len(values)} repeats gave {values[0]:.6g} (zero variance): {'meets' if meets else 'misses'} band {band}"
    elif meets:
        res.status = PASS
        res.reason = f"{which} {level} bound {decisive:.6g} {sign} {c.threshold:.6g}: meets band {band}"
    elif misses:
        res.status = FAIL
        res.reason = f"{other} {level} bound {opposite:.6g} is beyond {c.threshold:.6g}: misses band {band}"
    else:
        res.reason = f"{level} bounds [{low:.6g}, {high:.6g}] straddle the threshold {c.threshold:.6g}"
        res.repeats_needed = stats.band_repeats(desc["mean"], desc["std"], c, alpha)  # as `repro500 plan`
        if res.repeats_needed:
            res.advice.append(
                f"{c.metric}: about {res.repeats_needed} repeats would decide the band "
                "(estimate from the observed spread)"
            )
        else:
            res.advice.append(f"{c.metric}: the mean sits on the threshold; more repeats will not decide it")
    return res


def check_bands(run: RunData, alpha: float) -> list[BandResult]:
    return [check_band(c, run.values(c.metric), alpha, unsuccessful=run.unsuccessful) for c in run.acceptance]
