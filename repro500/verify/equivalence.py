"""Equivalence to a reference: REPRODUCED, NOT REPRODUCED or INCONCLUSIVE, per metric.

The question "does the rerun reproduce the reference within +-margin?" is an equivalence
question, decided on the (1 - 2 alpha) confidence interval of ``diff = run - reference``
(two one-sided tests at level alpha each; stats.py):

* **REPRODUCED**: the interval lies inside [-margin, +margin], edges included; a difference
  known exactly (zero variance) is compared in decimal (``decide_exact``), so 0.935 against
  0.93 with margin 0.005 is on the edge, hence inside.
* **NOT REPRODUCED**: the interval lies entirely outside it (all of it above +margin or all
  below -margin): the run differs by more than the margin, itself shown at level alpha.
  This is a positive finding of a difference, not merely "equivalence not shown".
* **INCONCLUSIVE**: the interval straddles a margin edge; the verdict says how many
  repeats would likely decide it, from the observed spread.

``non_inferiority`` (a published claim such as "accuracy >= 93 %") is one-sided: for
higher-is-better, REPRODUCED when the lower end of the interval is >= -margin, NOT
REPRODUCED when its upper end is < -margin (mirrored for lower-is-better).

References: another run (two-sample Welch TOST on per-repeat values), published
per-repeat values (Welch TOST), or a single published value (one-sample TOST, the value
taken as exact).  Where the rerun's repeats share seeds with the reference's (a run, or a
publication's packed run), the pairs decide: a paired TOST on the per-seed differences
(reference.py, ``pair_by_seed``; stats.py, ``tost_paired``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np

from repro500.errors import InvalidInput, UsageError
from repro500.statuses import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED
from repro500.verify import stats
from repro500.verify.reference import Pairing, Reference
from repro500.verify.rundir import RunData


@dataclass
class EquivalenceResult:
    metric: str
    test: str  # equivalence | non_inferiority
    direction: str
    margin: float
    margin_source: str
    status: str
    reason: str
    tost: dict[str, Any]
    p_value: float | None = None  # of the test that decides: TOST max, or the one-sided test
    repeats_needed: int | None = None
    advice: list[str] = field(default_factory=list)
    change: str | None = None  # against a history: regression | improvement | equivalent | inconclusive

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric, "test": self.test, "direction": self.direction,
            "margin": self.margin, "margin_source": self.margin_source, "status": self.status,
            "reason": self.reason, "p_value": self.p_value, "tost": self.tost,
            "repeats_needed": self.repeats_needed, "advice": self.advice, "change": self.change,
        }


def decide(low: Any, high: Any, margin: float, test: str = "equivalence", direction: str = "higher") -> Any:
    """The decision rules, vectorised: 1 REPRODUCED, -1 NOT REPRODUCED, 0 INCONCLUSIVE.

    ``low``/``high`` are the (1 - 2 alpha) interval of ``diff = run - reference`` (arrays or
    scalars).  ``classify`` and the calibration benchmark both decide through this function.
    """
    low, high, m = np.asarray(low, dtype=float), np.asarray(high, dtype=float), float(margin)
    if test == "equivalence":
        shown, beyond = (low >= -m) & (high <= m), (low > m) | (high < -m)
    elif direction == "higher":  # non-inferiority: only a shortfall in the good direction counts
        shown, beyond = low >= -m, high < -m
    else:
        shown, beyond = high <= m, low > m
    return np.where(shown, 1, np.where(beyond, -1, 0))


def decide_exact(diff: Decimal, margin: Decimal, test: str = "equivalence", direction: str = "higher") -> int:
    """``decide`` for a difference known exactly (zero variance): decimal arithmetic, no rounding,
    so a difference equal to the margin in decimal terms is inside it (docs/verify.md)."""
    if test == "equivalence":
        return 1 if -margin <= diff <= margin else -1
    if direction == "higher":
        return 1 if diff >= -margin else -1
    return 1 if diff <= margin else -1


def classify(res: stats.TostResult, test: str, direction: str) -> tuple[str, str]:
    """(status, reason) from a TOST result; see the module docstring for the rules."""
    m = res.margin
    if res.ci_low is None or res.ci_high is None:
        return INCONCLUSIVE, "; ".join(res.notes) or "no interval could be computed"
    level = f"{100 * res.ci_confidence:.4g}%"  # at a look's nominal level: 99.9%, not a rounded 100%
    if res.exact and res.exact_diff is not None:
        where = f"difference {Decimal(res.exact_diff):+} (zero variance, exact in decimal)"
    elif res.exact:
        where = f"difference {res.diff:+.6g} (zero variance, exact)"
    else:
        where = f"{level} CI of the difference [{res.ci_low:+.6g}, {res.ci_high:+.6g}]"
    if res.exact and res.exact_diff is not None:
        exact_diff = Decimal(res.exact_diff)
        code = decide_exact(exact_diff, Decimal(repr(float(m))), test, direction)
        above = exact_diff > 0
    else:
        code = int(decide(res.ci_low, res.ci_high, m, test, direction))
        above = res.ci_low > m
    if test == "equivalence":
        if code == 1:
            return REPRODUCED, f"{where} lies inside ±{m:.6g}"
        if code == -1:
            side = "above +" if above else "below -"
            return NOT_REPRODUCED, f"{where} lies entirely {side}{m:.6g}"
        return INCONCLUSIVE, f"{where} straddles the margin ±{m:.6g}"
    if direction == "higher":
        edge = f"{-m:+.6g}" if m else "0"
        if code == 1:
            return REPRODUCED, f"{where}: lower end >= {edge} (not worse than the reference by more than the margin)"
        if code == -1:
            return NOT_REPRODUCED, f"{where}: entirely below {edge} (worse than the reference)"
        return INCONCLUSIVE, f"{where} straddles {edge}"
    edge = f"{m:+.6g}" if m else "0"
    if code == 1:
        return REPRODUCED, f"{where}: upper end <= {edge} (not worse than the reference by more than the margin)"
    if code == -1:
        return NOT_REPRODUCED, f"{where}: entirely above {edge} (worse than the reference)"
    return INCONCLUSIVE, f"{where} straddles {edge}"


def compare_values(
    metric: str,
    run_values: list[float],
    ref_values: list[float],
    margin: float,
    alpha: float,
    *,
    single_value: bool = False,
    test: str = "equivalence",
    direction: str = "higher",
    margin_source: str = "--margin",
    reference_kind: str = "run",
    pairing: Pairing | None = None,
) -> EquivalenceResult:
    """Compare one metric; ``single_value`` treats the reference as one exact number; a
    ``pairing`` that is paired tests its per-seed differences instead (and says why either way).

    ``reference_kind`` (``run`` or ``published``) only shapes the advice.
    """
    if single_value:
        res = stats.tost_one_sample(run_values, ref_values[0], margin, alpha)
    elif pairing is not None and pairing.paired:
        res = stats.tost_paired(pairing.run_values, pairing.reference_values, margin, alpha)
        res.pairs = [{k: p[k] for k in ("repeat", "reference_repeat", "seed")} for p in pairing.pairs]
    else:
        res = stats.tost_two_sample(run_values, ref_values, margin, alpha)
    res.design_reason = pairing.reason if pairing is not None else None
    status, reason = classify(res, test, direction)
    if res.design == "paired":
        reason += f" (paired by seed, {res.n_a} pairs)"
    if test == "equivalence":
        p_value = res.p_value
    else:  # non-inferiority: only the test against a shortfall in the good direction
        p_value = res.p_lower if direction == "higher" else res.p_upper
    out = EquivalenceResult(metric=metric, test=test, direction=direction, margin=float(margin),
                            margin_source=margin_source, status=status, reason=reason,
                            tost=res.to_dict(), p_value=p_value)
    if status == INCONCLUSIVE:
        _advise(out, res, test, direction, alpha, single_value, reference_kind)
    return out


def _advise(out: EquivalenceResult, res: stats.TostResult, test: str, direction: str,
            alpha: float, single_value: bool, reference_kind: str) -> None:
    if res.ci_low is None:
        out.advice.append(_too_few_advice(out.metric, res, reference_kind))
        return
    if res.design == "paired":  # the spread of the differences, not of the values, sets the pairs needed
        n, _ = stats.equivalence_repeats(res.diff, res.std_diff or 0.0, res.margin, alpha, test=test,
                                         direction=direction)
        out.repeats_needed = n
        out.advice.append(f"{out.metric}: the difference sits too close to the margin for more repeats to decide it"
                          if n is None else f"{out.metric}: about {n} repeats on both, with the same seeds, would "
                          "decide it (paired: estimate from the spread of the per-seed differences)")
        return
    # the computation `repro500 plan` makes before a run (repro500/verify/planning.py)
    n, both = stats.equivalence_repeats(res.diff, res.std_a or 0.0, res.margin, alpha,
                                           sd_ref=None if single_value else res.std_b,
                                           n_ref=None if single_value else res.n_b, test=test, direction=direction)
    out.repeats_needed = n
    if n is None:
        out.advice.append(f"{out.metric}: the difference sits too close to the margin for more repeats to decide it")
    elif both:
        out.advice.append(f"{out.metric}: about {n} repeats on both the run and the reference would decide it")
    else:
        out.advice.append(f"{out.metric}: about {n} run repeats would decide it (estimate from the observed spread)")


def _too_few_advice(metric: str, res: stats.TostResult, reference_kind: str) -> str:
    """Advice when no interval exists: name the side that has too few values."""
    run_short = res.n_a < 2
    ref_short = res.n_b is not None and res.n_b < 2
    run_fix = "run at least 3 repeats (repro500 run --repeats 3)"
    if reference_kind == "published":
        ref_fix = (f"the published file lists {res.n_b} value(s) under `values`: list at least 3 per-repeat "
                   "values, or give a single number as `value` (compared one-sample, taken as exact)")
    else:
        ref_fix = f"the reference has {res.n_b} repeat(s): rerun it with at least 3 (repro500 run --repeats 3)"
    if run_short and ref_short:
        return f"{metric}: {run_fix}; {ref_fix}"
    if ref_short:
        return f"{metric}: {ref_fix}; the run's {res.n_a} repeats are enough"
    return f"{metric}: {run_fix} so an interval exists"


def compare(run: RunData, ref: Reference, alpha: float, margins: dict[str, float] | None = None) -> list[EquivalenceResult]:
    """Compare every metric the reference and the margins name (see docs/verify.md).

    As with the bands, a rerun with repeats that diverged, failed or were killed cannot be
    REPRODUCED on the repeats that completed: that result becomes INCONCLUSIVE.
    """
    results = _compare(run, ref, alpha, margins)
    if run.unsuccessful:
        for res in results:
            if res.status == REPRODUCED:
                _block_reproduced(res, run.unsuccessful)
    return results


def _block_reproduced(res: EquivalenceResult, unsuccessful: dict[int, str]) -> None:
    shown = ", ".join(f"{k} ({state})" for k, state in sorted(unsuccessful.items()))
    res.status = INCONCLUSIVE
    res.reason = (f"repeat(s) {shown} of the run did not complete, so it cannot count as reproduced on the "
                  f"others ({res.reason}); investigate or rerun them (`repro500 run --resume RUN` completes killed ones)")
    res.advice.append(f"{res.metric}: repeat(s) {shown} did not complete")


def _compare(run: RunData, ref: Reference, alpha: float, margins: dict[str, float] | None) -> list[EquivalenceResult]:
    margins = dict(margins or {})
    for name, value in margins.items():
        if not value > 0:
            raise UsageError(f"--margin {name}={value}: an equivalence margin must be > 0")
    run_metrics = set(run.metric_names())
    results = []
    if ref.published is not None:
        pub = ref.published
        missing = [name for name in pub.metrics if name not in run_metrics]
        if missing:
            raise InvalidInput(
                f"{pub.path} names metric {missing[0]!r}, which the run does not report "
                f"(run metrics: {', '.join(sorted(run_metrics)) or 'none'})"
            )
        unknown = sorted(set(margins) - set(pub.metrics))
        if unknown:
            raise UsageError(f"--margin names {unknown[0]!r}, which {pub.path.name} does not publish (it has: {', '.join(pub.metrics)})")
        for name, metric in pub.metrics.items():
            margin, source = (margins[name], "--margin") if name in margins else (metric.margin, "published file")
            results.append(compare_values(
                name, run.values(name), metric.values, margin, alpha, single_value=metric.single,
                test=metric.test, direction=metric.direction, margin_source=source, reference_kind="published",
                pairing=ref.pairing(run, name),
            ))
        return results
    shared = [name for name in run.metric_names() if ref.values.get(name)]
    if not shared:
        raise InvalidInput(
            f"reference {ref.path} has no metric in common with the run (reference: "
            f"{', '.join(sorted(ref.values)) or 'none'}; run: {', '.join(sorted(run_metrics)) or 'none'})"
        )
    unknown = sorted(set(margins) - set(shared))
    if unknown:
        raise UsageError(f"--margin names {unknown[0]!r}, which the run and the reference do not both report (shared: {', '.join(shared)})")
    chosen: dict[str, tuple[float, str, str]] = {}
    for c in run.acceptance:
        if c.tolerance > 0 and c.metric not in margins:
            if c.metric not in shared:
                raise InvalidInput(
                    f"reference {ref.path} does not report {c.metric!r}, the run's acceptance metric "
                    f"(reference metrics: {', '.join(sorted(ref.values)) or 'none'})"
                )
            chosen[c.metric] = (c.tolerance, "acceptance tolerance", c.direction)
    directions = {c.metric: c.direction for c in run.acceptance}
    for name, value in margins.items():
        chosen[name] = (value, "--margin", directions.get(name, "higher"))
    if not chosen:
        raise UsageError(
            "no equivalence margin: pass --margin METRIC=DELTA for the metrics to compare "
            f"(shared metrics: {', '.join(shared)})"
        )
    for name in [n for n in shared if n in chosen]:
        margin, source, direction = chosen[name]
        results.append(compare_values(name, run.values(name), ref.values[name], margin, alpha,
                                      direction=direction, margin_source=source, pairing=ref.pairing(run, name)))
    return results
