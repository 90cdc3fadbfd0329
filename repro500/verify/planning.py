"""How many repeats a decision needs: ``repro500 plan`` and the advice lines of ``verify``.

One computation for both (:func:`band_repeats`, :func:`equivalence_repeats`, over
:func:`repro500.verify.stats.repeats_needed`), so what ``plan`` promises before a run is what
``verify`` advises after it.  Planning takes an observed or stated spread as the truth; with
few repeats the sample standard deviation is itself uncertain (with 3 repeats its 80% upper
bound is 2.2 times the estimate), so every figure comes with the count the spread's upper 80%
confidence bound would need.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from repro500.errors import InvalidInput, UsageError
from repro500.rundir.excluded import opened_run
from repro500.verify import distributions as dist
from repro500.verify import sequential, sequential_plan, stats
from repro500.verify.rundir import Criterion, load_run, parse_acceptance

SPREAD_CONFIDENCE = 0.8  # the conservative count plans with the spread's upper bound at this level


def until_decided(effect: float, sd: float, margin: float, alpha: float, power: float, spending: str,
                  n_ref: int | None = None, question: str = "equivalence") -> dict[str, Any]:
    """The ``--max-repeats`` a ``run --until-decided`` needs to decide with *power* if the true
    difference (a band: mean - threshold, in the good direction) is *effect* (verify/sequential_plan.py)."""
    if sd == 0.0:  # no spread: the first look decides exactly
        return {"max_repeats": sequential.MIN_REPEATS, "expected_repeats": float(sequential.MIN_REPEATS),
                "achieved_power": 1.0, "spending": spending, "reason": "zero spread"}
    found = sequential_plan.plan(effect / sd, margin / sd, n_ref, power, alpha, spending, question)
    return {"max_repeats": found.max_repeats, "expected_repeats": found.expected_repeats,
            "achieved_power": found.achieved_power, "power_cap": found.power_cap, "spending": spending,
            "reason": found.reason}


def sd_upper(sd: float, n: int, confidence: float = SPREAD_CONFIDENCE) -> float:
    """The one-sided upper confidence bound of a normal standard deviation estimated from n values."""
    return sd * math.sqrt((n - 1) / float(dist.chi2_ppf(1.0 - confidence, n - 1)))


@dataclass
class MetricPlan:
    metric: str
    sd: float
    spread_from: str  # "3 repeats of the run" | "stated CV 0.5%"
    center: float | None  # the run's mean, or the band's target for a recipe
    n_spread: int | None  # repeats behind the sd (None: stated)
    band: dict[str, Any] | None = None  # threshold, direction, repeats, conservative
    equivalence: dict[str, Any] | None = None  # margin, source, fresh, against_this_run, conservative
    notes: list[str] = field(default_factory=list)


@dataclass
class Plan:
    source: str  # the run directory or recipe planned from
    kind: str  # "run" | "recipe"
    alpha: float
    power: float
    metrics: list[MetricPlan]
    assumptions: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "repro500/plan/v1", **asdict(self)}


def plan_metric(name: str, values: list[float], criterion: Criterion | None, margin: tuple[float, str] | None,
                cv: float | None, alpha: float, power: float, n_run: int | None,
                spending: str = "obrien-fleming") -> MetricPlan:
    """The plan for one metric from its observed *values* (a run) or a stated *cv* (relative to
    the run's mean, or to the band's target for a recipe)."""
    mean = sum(values) / len(values) if values else (criterion.target if criterion else None)
    if cv is not None:
        if mean is None or mean == 0:
            raise UsageError(f"--cv {name}={cv}: a CV needs a non-zero mean to scale; give the run or an acceptance "
                             f"target for {name}")
        sd, spread_from, n_spread = abs(mean) * cv, f"stated CV {cv:.3g}", None
    elif len(values) >= 2:
        sd = float(stats.describe(values, alpha)["std"])
        spread_from, n_spread = f"{len(values)} repeats of the run", len(values)
    else:
        have = f"{len(values)} repeat" if values else "no repeats"
        raise UsageError(f"{name}: {have} to estimate the spread from; state it with --cv {name}=CV (e.g. 0.01)")
    out = MetricPlan(name, sd, spread_from, mean, n_spread)
    upper = sd_upper(sd, n_spread) if n_spread else None
    if criterion is not None and mean is not None:
        n = stats.band_repeats(mean, sd, criterion, alpha, power)
        out.band = {"threshold": criterion.threshold, "direction": criterion.direction, "repeats": n,
                    "conservative": stats.band_repeats(mean, upper, criterion, alpha, power) if upper else None,
                    "side": "meets" if (mean >= criterion.threshold) == (criterion.direction == "higher") else "misses"}
        shortfall = mean - criterion.threshold if criterion.direction == "higher" else criterion.threshold - mean
        out.band["until_decided"] = until_decided(shortfall, sd, 0.0, alpha, power, spending, question="one-sided")
        if n is None:
            out.notes.append(f"{name}: the mean sits on the band's threshold; no number of repeats decides it")
    if margin is not None:
        delta, source = margin
        fresh, _ = stats.equivalence_repeats(0.0, sd, delta, alpha, sd_ref=sd, power=power)
        out.equivalence = {"margin": delta, "margin_source": source, "fresh": fresh,
                           "conservative": stats.equivalence_repeats(0.0, upper, delta, alpha, sd_ref=upper,
                                                               power=power)[0] if upper else None}
        if n_run:  # a reproduction of this run, with its repeats as the reference
            against, both = stats.equivalence_repeats(0.0, sd, delta, alpha, sd_ref=sd, n_ref=n_run, power=power)
            out.equivalence["against_this_run"] = None if both else against
            out.equivalence["until_decided"] = until_decided(0.0, sd, delta, alpha, power, spending, n_ref=n_run)
            if against is None or both:
                out.notes.append(f"{name}: this run's {n_run} repeats are too few to reproduce against at margin "
                                 f"{delta:g}; rerun both sides with {fresh} repeats each")
    return out


def assumptions(alpha: float, power: float, kind: str, spending: str = "obrien-fleming") -> list[str]:
    return [
        "each metric's repeats are independent and normally distributed",
        ("the spread observed in the run (its sample standard deviation) is the true one; 'conservative' "
         f"uses its upper {SPREAD_CONFIDENCE:.0%} confidence bound" if kind == "run"
         else "the stated CV times the band's target is the true standard deviation"),
        "a reproduction differs from the reference by 0 in truth, with the same spread",
        (f"bands: one-sided {1 - alpha:.0%} bound beyond the threshold; equivalence: TOST at alpha {alpha:g} "
         f"(a {1 - 2 * alpha:.0%} interval inside the margin); power {power:.0%}, normal approximation with "
         "Welch t quantiles, as verify's advice"),
        (f"until decided: the smallest --max-repeats for run --until-decided ({spending} spending, a look after "
         f"every repeat from the 3rd) whose looks decide with power {power:.0%}, by simulating the design "
         "(20 000 runs; the band if the true mean is the one above; a reproduction against this run's repeats "
         "if it truly matches them)"),
    ]


def build(source: Any, margins: dict[str, float], cvs: dict[str, float], alpha: float, power: float,
          spending: str = "obrien-fleming") -> Plan:
    """The plan for a run (its directory, a packed run or a publication: its observed spread) or a
    recipe file (a stated CV)."""
    from pathlib import Path

    path = Path(source)
    with opened_run(path, "repro500-plan-") as opened:
        if opened.kind != "run" or path.is_dir():
            run = load_run(opened.root)
            kind, criteria, n_run = "run", run.acceptance, len(run.completed)
            values_of, known = run.values, set(run.metric_names())
        elif path.is_file():
            from repro500.recipe import load as recipes

            loaded = recipes.load(path)
            kind, n_run = "recipe", None
            criteria = parse_acceptance(loaded.acceptance, f"{path}: acceptance")
            known = {c.metric for c in criteria}

            def values_of(name: str) -> list[float]:
                return []
        else:
            raise InvalidInput(f"{path} does not exist: give a run directory (runs/<run-id>), a packed run, a "
                               "publication or a recipe file")
        by_metric = {c.metric: c for c in criteria}
        for name in [*margins, *cvs]:
            if name not in known:
                raise UsageError(f"{name!r} is not a metric of {path} (it has: {', '.join(sorted(known)) or 'none'})")
        chosen = {c.metric: (c.tolerance, "acceptance tolerance") for c in criteria if c.tolerance > 0}
        chosen.update({name: (delta, "--margin") for name, delta in margins.items()})
        names = [*by_metric, *[n for n in chosen if n not in by_metric]]
        if not names:
            raise UsageError(f"nothing to plan: {path} has no acceptance band; pass --margin METRIC=DELTA for the "
                             "metrics a reproduction must match")
        metrics = [plan_metric(name, values_of(name), by_metric.get(name), chosen.get(name), cvs.get(name),
                               alpha, power, n_run, spending) for name in names]
    return Plan(str(path), kind, alpha, power, metrics, assumptions(alpha, power, kind, spending))
