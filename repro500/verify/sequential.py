"""Stop repeating when the verdict is decided: a group-sequential version of the verdict's tests.

``repro500 run --until-decided --max-repeats N`` looks at the results after every repeat from
the MIN_REPEATS-th to the N-th; with its repeats side by side (``--launcher``, ``--parallel B``)
after every batch of B (at B, 2B, ... from the MIN_REPEATS-th, and at N), the design's *batch*.  Each look runs the verdict's own one-sided tests (the bands'
bounds, the equivalence test's two one-sided tests) at a *nominal* level p_k below alpha, chosen
so that the chance of a wrong decision summed over all looks is still alpha: alpha is spent over
the information fraction by a Lan-DeMets spending function,

* ``obrien-fleming`` (the default): alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)); almost nothing
  is spent early, so the last look is nearly the fixed design's test;
* ``pocock``: alpha(t) = alpha ln(1 + (e - 1) t); more is spent early, so an easy question stops
  sooner, at the price of a larger N for the same power.

The nominal levels are calibrated for the t statistics the verdict computes, by simulating their
joint law under the boundary hypothesis (SIMULATED_PATHS paths, a fixed seed, so the same design
gets the same levels everywhere) and taking at each look the level whose first crossings spend
exactly the increment.  The textbook boundaries assume a known variance; applied to t statistics
at 3 to 20 repeats ("nominal p-values") they let 5.5-5.7% wrong decisions through at alpha = 5%,
which bench/sequential_design.py shows.  No library in repro500's dependencies computes
group-sequential boundaries (scipy and statsmodels have none).  The levels are recorded in
run.json with the design, so a verdict never depends on recomputing them.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from repro500 import untrusted
from repro500.statuses import FAIL, INCONCLUSIVE, NOT_REPRODUCED, PASS, REPRODUCED
from repro500.verify import distributions as dist
from repro500.verify import equivalence
from repro500.verify.bands import check_bands

MIN_REPEATS = 3  # the first look: the verdict's advice never trusts a spread from 2 repeats
SPENDING = ("obrien-fleming", "pocock")
SIMULATED_PATHS = 200_000  # the calibration's Monte-Carlo error on alpha is about 0.0005
SEED = 20261124
# The most repeats a sequential design may plan: its levels are simulated as SIMULATED_PATHS rows of
# one draw per repeat (1.6 GB of float64 at this bound), so a recorded max_repeats above it is refused
# where it is read (and --until-decided --max-repeats above it where it is given).
MAX_DESIGN_REPEATS = 1_000


def spent(t: float, alpha: float, spending: str = "obrien-fleming") -> float:
    """Cumulative alpha spent by information fraction *t* (0 < t <= 1)."""
    if spending == "obrien-fleming":
        return float(2.0 - 2.0 * dist.norm_cdf(dist.norm_isf(alpha / 2.0) / math.sqrt(t)))
    if spending == "pocock":
        return float(alpha * math.log(1.0 + (math.e - 1.0) * t))
    raise ValueError(f"unknown spending function {spending!r}; choose {' or '.join(SPENDING)}")


def looks(max_repeats: int, min_repeats: int = MIN_REPEATS, batch: int = 1) -> list[int]:
    """The repeat counts at which the verdict is looked at: every count from *min_repeats* on, or
    with repeats run *batch* at a time, each count a batch ends at (and the last)."""
    first = min(min_repeats, max_repeats)
    return [n for n in range(first, max_repeats + 1) if n % batch == 0 or n == max_repeats]


def information(n: int, reference_repeats: int | None = None) -> float:
    """1 / the variance of the estimate after n repeats (in units of one repeat's variance): n for
    a band or a published value, 1 / (1/n + 1/n_ref) against a reference of n_ref repeats, whose
    own noise does not shrink as the run grows."""
    return float(n) if not reference_repeats else 1.0 / (1.0 / n + 1.0 / reference_repeats)


def calibrate(p_values: list[np.ndarray], fractions: list[float], alpha: float,
              spending: str = "obrien-fleming", to_p: list[Any] | None = None) -> list[float]:
    """Per look, the nominal level whose first crossings spend alpha's increment at that look's
    information fraction, given each simulated path's one-sided p-value at every look.  With
    *to_p*, ``p_values`` hold a statistic that orders the paths as their p-values do (smaller is
    more significant) and ``to_p[i]`` turns look i's statistic into its p-value: the same levels,
    with two p-values computed per look instead of one per path."""
    alive = np.ones(p_values[0].shape, dtype=bool)
    total = alive.size
    levels, previous = [], 0.0
    for i, (p, t) in enumerate(zip(p_values, fractions, strict=True)):
        now = spent(t, alpha, spending)
        allowed = int(round((now - previous) * total))
        candidates = p[alive]
        # only the allowed-th and the next smallest matter: a partition, not a sort
        kth = sorted({min(max(allowed - 1, 0), candidates.size - 1), min(allowed, candidates.size - 1)})
        candidates = np.partition(candidates, kth)

        def level_of_(score: float, i: int = i) -> float:
            return float(score) if to_p is None else float(to_p[i](score))

        level = level_of_(candidates[allowed - 1]) if allowed >= 1 else 0.0
        if allowed < candidates.size:  # between the last crossing and the first path that stays
            level = (level + level_of_(candidates[allowed])) / 2.0 if allowed >= 1 else level_of_(candidates[0]) / 2.0
        levels.append(level)
        if allowed >= 1:  # no path's p-value lies between the last crossing and the level
            alive &= p > candidates[min(allowed, candidates.size) - 1]
        previous = now
    return levels


@functools.lru_cache(maxsize=64)
def nominal_levels(max_repeats: int, alpha: float, spending: str = "obrien-fleming",
                   min_repeats: int = MIN_REPEATS, reference_repeats: int | None = None,
                   paths: int = SIMULATED_PATHS, batch: int = 1) -> tuple[float, ...]:
    """The one-sided nominal level of each look (in the order of :func:`looks`) at which the
    verdict's t test (Welch's against a reference of *reference_repeats* values) crosses with
    probability *alpha* over all looks under the boundary hypothesis.  Fewer *paths* give
    noisier levels, for a search over designs (verify/sequential_plan.py), never for a run.
    Fewer looks (a *batch* above 1) spend the same alpha in larger steps: each look's level is
    calibrated for the looks there are."""
    counts = looks(max_repeats, min_repeats, batch)
    rng = np.random.default_rng(SEED)
    run = rng.standard_normal((paths, max_repeats))
    squares = np.cumsum(run**2, axis=1)
    sums = np.cumsum(run, axis=1, out=run)  # in place: a long design's paths are large
    if reference_repeats:
        ref = rng.standard_normal((paths, reference_repeats))
        ref_mean, ref_var = ref.mean(axis=1), ref.var(axis=1, ddof=1)
        del ref
    p_values, to_p = [], []
    for n in counts:
        mean = sums[:, n - 1] / n
        var = np.maximum(squares[:, n - 1] - n * mean**2, 1e-300) / (n - 1)
        if reference_repeats:
            se = np.sqrt(var / n + ref_var / reference_repeats)
            num, den = (var / n + ref_var / reference_repeats) ** 2, \
                (var / n) ** 2 / (n - 1) + (ref_var / reference_repeats) ** 2 / (reference_repeats - 1)
            p_values.append(dist.t_sf((mean - ref_mean) / se, num / den))  # Welch: each path its own df
        else:  # one df for every path: ordered by -t, and only the levels' p-values computed
            p_values.append(-mean / np.sqrt(var / n))
            to_p.append(functools.partial(lambda score, df: dist.t_sf(-score, df), df=n - 1))
    top = information(max_repeats, reference_repeats)
    fractions = [information(n, reference_repeats) / top for n in counts]
    return tuple(calibrate(p_values, fractions, alpha, spending, to_p or None))


def level_at(n: int, max_repeats: int, alpha: float, spending: str = "obrien-fleming",
             reference_repeats: int | None = None, batch: int = 1) -> float | None:
    """The nominal level of the look after *n* repeats (None where no look is)."""
    counts = looks(max_repeats, MIN_REPEATS, batch)
    if n not in counts:
        return None
    return nominal_levels(max_repeats, alpha, spending, MIN_REPEATS, reference_repeats, batch=batch)[counts.index(n)]


def bounds(design_doc: dict[str, Any]) -> tuple[int, int, int]:
    """(max_repeats, min_repeats, batch) of a recorded design, each a count within untrusted's
    bound: the looks and the simulated levels allocate a row per repeat (InvalidInput otherwise).
    A design recorded before batches existed looked after every repeat (batch 1)."""
    top = untrusted.count(design_doc.get("max_repeats"), "run.json design.max_repeats", MAX_DESIGN_REPEATS, least=1)
    return (top, untrusted.count(design_doc.get("min_repeats", MIN_REPEATS), "run.json design.min_repeats", top, least=1),
            untrusted.count(design_doc.get("batch", 1), "run.json design.batch", top, least=1))


def level_of(design_doc: dict[str, Any], n: int, alpha: float | None = None) -> float | None:
    """The nominal level of the look after *n* repeats of a recorded design: the levels run.json
    recorded, or (another alpha) computed for it."""
    counts = looks(*bounds(design_doc))
    recorded_levels = design_doc.get("nominal_levels")
    if (alpha is None or alpha == design_doc.get("alpha")) and isinstance(recorded_levels, list) \
            and len(recorded_levels) == len(counts):
        return float(recorded_levels[counts.index(n)]) if n in counts else None
    top, _, batch = bounds(design_doc)
    return level_at(n, top, float(design_doc["alpha"] if alpha is None else alpha),
                    str(design_doc.get("spending", "obrien-fleming")), design_doc.get("reference_repeats"), batch)


def design(max_repeats: int, alpha: float, spending: str = "obrien-fleming",
           reference_repeats: int | None = None, batch: int = 1) -> dict[str, Any]:
    """What run.json records of a sequential run before its first repeat."""
    return {"kind": "sequential", "max_repeats": max_repeats, "min_repeats": min(MIN_REPEATS, max_repeats),
            "batch": batch, "alpha": alpha, "spending": spending, "reference_repeats": reference_repeats,
            "nominal_levels": list(nominal_levels(max_repeats, alpha, spending, MIN_REPEATS, reference_repeats,
                                                  batch=batch)),
            "stopped_at": None, "decision": None}


def in_batches(design_doc: dict[str, Any], batch: int) -> dict[str, Any]:
    """A new design looked at after every *batch* repeats (its repeats side by side), its levels
    calibrated for those looks; what else it records (where its maximum came from) is kept."""
    redone = design(design_doc["max_repeats"], design_doc["alpha"], design_doc["spending"],
                    design_doc.get("reference_repeats"), min(batch, design_doc["max_repeats"]))
    return {**design_doc, **redone}


def next_look(design_doc: dict[str, Any], done: int) -> int:
    """The repeat count of the first look after *done* repeats (the maximum once past the last)."""
    counts = looks(*bounds(design_doc))
    return next((n for n in counts if n > done), counts[-1])


def recorded(run_meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """The sequential design run.json records, if the run has one."""
    doc = (run_meta or {}).get("design")
    return doc if isinstance(doc, dict) and doc.get("kind") == "sequential" else None


def look(run: Any, level: float, ref: Any = None, margins: dict[str, float] | None = None) -> dict[str, str]:
    """Each decision at this look, tested at the nominal *level*: the bands (PASS / FAIL /
    INCONCLUSIVE) or, with a reference, the equivalence test (the same three, REPRODUCED read as
    PASS).  *run* is a :class:`repro500.verify.rundir.RunData` holding the repeats so far."""
    if ref is None:
        return {b.metric: b.status for b in check_bands(run, level)}
    mapping = {REPRODUCED: PASS, NOT_REPRODUCED: FAIL}
    return {e.metric: mapping.get(e.status, INCONCLUSIVE) for e in equivalence.compare(run, ref, level, margins)}


def decided(statuses: dict[str, str]) -> bool:
    """Every decision taken, either way (nothing to decide is not decided)."""
    return bool(statuses) and all(s in (PASS, FAIL) for s in statuses.values())


def stop_check(run: Any, design_doc: dict[str, Any], alpha: float, ref: Any = None,
               margins: dict[str, float] | None = None) -> list[str]:
    """Problems with a sequential run's stopping point, re-derived from its repeats in order: it
    must have stopped at the first look that decided (or at its maximum), or a repeat was
    dropped or added after the fact."""
    values = {k: run.repeats[k] for k in sorted(run.repeats)}
    stopped, (top, least, batch) = design_doc.get("stopped_at"), bounds(design_doc)
    first = None
    for n in looks(top, least, batch):
        if n > len(values):
            break
        partial = type(run)(path=run.path, summary={}, repeats=dict(list(values.items())[:n]),
                            acceptance=run.acceptance)
        level = level_of(design_doc, n, alpha)
        if level is not None and decided(look(partial, level, ref, margins)):
            first = n
            break
    if stopped is None:
        return []
    expected = first if first is not None else top
    if stopped != expected:
        return [f"run.json says the sequential design stopped after {stopped} repeats, but its repeats decide the "
                f"verdict {'after ' + str(first) if first else 'at no look'}: a repeat was dropped or added"]
    return []
