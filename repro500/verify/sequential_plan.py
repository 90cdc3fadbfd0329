"""How many repeats a sequential run needs: ``--max-repeats`` planned for a power, by simulation.

A group-sequential design is sized as a fixed one is, by the power it must reach at an assumed
true difference; its maximum N is then somewhat larger than the fixed design's n, since the last
look tests at a level below alpha.  Textbook inflation factors (about 1.03 for O'Brien-Fleming
over 5-10 looks, 1.2-1.3 for Pocock, Jennison & Turnbull 2000, ch. 2) assume a known variance and
a fixed reference; here the looks are t tests from the 3rd repeat on, at calibrated nominal levels
(verify/sequential.py), and a reference run's own noise does not shrink as the run grows.  So N is
found by simulating the design itself: the smallest N whose looks, decided by the verdict's own
code (:func:`decide_at`), take the right decision with the requested power.  A reference of few
repeats caps the power any number of run repeats reaches; :func:`plan` then says so with the cap.

The same functions drive ``repro500 plan`` (the ``until decided`` row), ``repro500 run
--until-decided`` without ``--max-repeats`` (planned from the reference's spread), and
bench/sequential_design.py (its grid sized per cell by :func:`plan`).  All figures are in units
of one repeat's standard deviation; the reference is assumed to have the same spread.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from repro500.statuses import DEFAULT_ALPHA
from repro500.verify import distributions as dist
from repro500.verify import equivalence, sequential, stats

QUESTIONS = ("equivalence", "one-sided")  # TOST within +-margin | the sign of (mean - threshold)
POWER_DRAWS = 20_000  # simulated runs per candidate N: power to about +-0.003
SEARCH_PATHS = 40_000  # calibration paths while searching; the chosen N is confirmed with the full set
SEARCH_DRAWS = 10_000
MAX_PLANNED_REPEATS = 100  # beyond this a plan says "not reachable"
SEED = 20261125
# A non-binding futility stop, studied by the bench (docs/verify.md says why no run uses it): give
# up, INCONCLUSIVE, when the last look's chance to decide is below FUTILITY, from FUTILITY_FROM N on.
FUTILITY = 0.05
FUTILITY_FROM = 0.5


@dataclass
class SequentialPlan:
    """What ``--until-decided`` needs to decide with the requested power."""

    question: str
    effect_sd: float  # the assumed true difference (or mean - threshold), in standard deviations
    margin_sd: float  # the equivalence margin in standard deviations (0 for a one-sided question)
    reference_repeats: int | None
    power: float  # requested
    alpha: float
    spending: str
    max_repeats: int | None  # None: not reachable
    achieved_power: float | None = None  # simulated, at max_repeats
    fixed_repeats: int | None = None  # a fixed design's n at the requested power (normal approximation)
    expected_repeats: float | None = None  # E[n] at the assumed difference
    power_cap: float | None = None  # the most any number of run repeats reaches, when below the request
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide_at(sums: np.ndarray, squares: np.ndarray, n: int, ref_mean: np.ndarray, ref_var: np.ndarray,
              n_ref: int | None, level: float, margin: float, question: str = "equivalence") -> np.ndarray:
    """The verdict's decision after n repeats, vectorised over simulated runs (1 REPRODUCED or
    PASS, -1 NOT REPRODUCED or FAIL, 0 undecided): the TOST interval the verdict computes
    (``stats.tost_interval``, inside ``tost_from_stats``) decided by ``equivalence.decide``, or a
    band's one-sided bounds (the interval at margin 0), at the nominal *level*."""
    mean = sums / n
    var = np.maximum(squares - n * mean**2, 0.0) / (n - 1)
    if n_ref is None:  # against one value taken as exact (a band's threshold, a published value)
        se, df = np.sqrt(var / n), np.full(mean.shape, n - 1.0)
    else:
        se, df = np.sqrt(var / n + ref_var / n_ref), stats.welch_df(var, n, ref_var, n_ref)
    m = margin if question == "equivalence" else 0.0
    low, high = stats.tost_interval(mean - ref_mean, se, df, level)
    if question == "equivalence":
        return equivalence.decide(low, high, m)
    return equivalence.decide(low, high, 0.0, "non_inferiority", "higher")


def reference_draws(rng: np.random.Generator, n_ref: int | None, draws: int) -> tuple[np.ndarray, np.ndarray]:
    """Each simulated reference's mean and variance (zeros for an exact value)."""
    if n_ref is None:
        return np.zeros(draws), np.zeros(draws)
    ref = rng.standard_normal((draws, n_ref))
    return ref.mean(axis=1), ref.var(axis=1, ddof=1)


def simulate(n_max: int, effect: float, margin: float, n_ref: int | None, alpha: float = DEFAULT_ALPHA,
             spending: str = "obrien-fleming", question: str = "equivalence", draws: int = POWER_DRAWS,
             rng: np.random.Generator | None = None, levels: tuple[float, ...] | None = None,
             futility: float = 0.0, batch: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(decision, repeats used) of *draws* simulated sequential runs whose true difference is
    *effect*, looked at as ``run --until-decided`` looks (every repeat from the 3rd to *n_max*,
    or after every *batch* of repeats side by side)."""
    rng = rng if rng is not None else np.random.default_rng(SEED)
    run = rng.normal(effect, 1.0, (draws, n_max))
    ref_mean, ref_var = reference_draws(rng, n_ref, draws)
    sums, squares = np.cumsum(run, 1), np.cumsum(run**2, 1)
    decision, used = np.zeros(draws, dtype=int), np.full(draws, n_max)
    alive = np.arange(draws)  # the runs still undecided: only they are looked at again
    levels = levels or sequential.nominal_levels(n_max, alpha, spending, sequential.MIN_REPEATS, n_ref, batch=batch)
    for n, level in zip(sequential.looks(n_max, sequential.MIN_REPEATS, batch), levels, strict=True):
        code = decide_at(sums[alive, n - 1], squares[alive, n - 1], n, ref_mean[alive], ref_var[alive], n_ref,
                         level, margin, question)
        now = alive[code != 0]
        decision[now], used[now] = code[code != 0], n
        alive = alive[code == 0]
        if futility and alive.size and FUTILITY_FROM * n_max <= n < n_max:
            chance = decision_chance(sums[alive, n - 1], squares[alive, n - 1], n, n_max, ref_mean[alive],
                                     ref_var[alive], n_ref, levels[-1], margin, question)
            quit_ = chance < futility
            used[alive[quit_]] = n
            alive = alive[~quit_]
        if not alive.size:
            break
    return decision, used


def decision_chance(sums: np.ndarray, squares: np.ndarray, n: int, n_max: int, ref_mean: np.ndarray,
                    ref_var: np.ndarray, n_ref: int | None, last_level: float, margin: float,
                    question: str = "equivalence") -> np.ndarray:
    """The chance that the last look decides (either way), if each simulated run's mean and spread
    after n repeats were the truth: the remaining repeats move the difference by a normal amount
    of sd sqrt(var (N - n)) / N, and the last look's interval has the half-width its level gives
    with the spread as it is (a futility rule's "conditional power under the current trend")."""
    mean = sums / n
    var = np.maximum(squares - n * mean**2, 0.0) / (n - 1)
    diff = mean - ref_mean
    if n_ref:
        se = np.sqrt(var / n_max + ref_var / n_ref)
        with np.errstate(divide="ignore", invalid="ignore"):
            df = np.where(se > 0, stats.welch_df(var, n_max, ref_var, n_ref), n_max + n_ref - 2.0)
    else:
        se, df = np.sqrt(var / n_max), np.full(diff.shape, n_max - 1.0)
    half = dist.t_isf(last_level, df) * se
    move = np.maximum(np.sqrt(var * (n_max - n)) / n_max, 1e-300)
    m = margin if question == "equivalence" else 0.0

    def below(x: np.ndarray) -> np.ndarray:  # P(the last look's difference < x)
        return dist.norm_cdf((x - diff) / move)

    beyond = (1.0 - below(m + half)) + below(-(m + half))  # NOT REPRODUCED; a band's PASS or FAIL (m = 0)
    return beyond + np.where(m > half, below(m - half) - below(half - m), 0.0)  # + REPRODUCED


def fixed(n: int, effect: float, margin: float, n_ref: int | None, alpha: float = DEFAULT_ALPHA,
          question: str = "equivalence", draws: int = POWER_DRAWS,
          rng: np.random.Generator | None = None) -> np.ndarray:
    """The decisions of a fixed design of n repeats (one test at alpha)."""
    rng = rng if rng is not None else np.random.default_rng(SEED)
    run = rng.normal(effect, 1.0, (draws, n))
    ref_mean, ref_var = reference_draws(rng, n_ref, draws)
    return decide_at(run.sum(1), (run**2).sum(1), n, ref_mean, ref_var, n_ref, alpha, margin, question)


def right_decision(effect: float, margin: float, question: str) -> int | None:
    """The decision that is right at this true difference (None on the margin's edge)."""
    edge = abs(effect) - margin if question == "equivalence" else -effect
    return 1 if edge < 0 else -1 if edge > 0 else None


def power_cap(effect: float, margin: float, n_ref: int | None, alpha: float = DEFAULT_ALPHA,
              question: str = "equivalence", draws: int = POWER_DRAWS) -> float:
    """The power a run with infinitely many repeats reaches against a reference of n_ref repeats
    (1 against an exact value): the reference's own noise is all that is left."""
    right = right_decision(effect, margin, question)
    if n_ref is None or right is None:
        return 1.0 if right is not None else 0.0
    ref_mean, ref_var = reference_draws(np.random.default_rng(SEED), n_ref, draws)
    half = dist.t_ppf(1.0 - alpha, n_ref - 1.0) * np.sqrt(ref_var / n_ref)
    diff = effect - ref_mean
    m = margin if question == "equivalence" else 0.0
    if question == "equivalence":
        code = equivalence.decide(diff - half, diff + half, m)
    else:
        code = equivalence.decide(diff - half, diff + half, 0.0, "non_inferiority", "higher")
    return float(np.mean(code == right))


def plan(effect: float, margin: float, n_ref: int | None, power: float = stats.DEFAULT_POWER,
         alpha: float = DEFAULT_ALPHA, spending: str = "obrien-fleming", question: str = "equivalence") -> SequentialPlan:
    """The smallest ``--max-repeats`` whose sequential design takes the right decision with
    *power* if the true difference is *effect* (sd units), or why none does."""
    out = SequentialPlan(question, effect, margin if question == "equivalence" else 0.0, n_ref, power, alpha,
                         spending, None)
    right = right_decision(effect, margin, question)
    if right is None:
        out.reason = "the assumed difference sits on the margin's edge: no number of repeats decides it"
        return out
    cap = power_cap(effect, margin, n_ref, alpha, question)
    if cap < power:
        out.power_cap = cap
        out.reason = (f"a reference of {n_ref} repeats caps the power at {cap:.2f} however many repeats the run "
                      f"has (its own noise does not shrink); a reference with more repeats or a wider margin is "
                      f"needed")
        return out
    kind = "equivalence" if question == "equivalence" and right == 1 else \
        "difference" if question == "equivalence" else "one-sided"
    shifted = effect if question == "equivalence" else effect
    out.fixed_repeats = stats.repeats_needed(shifted, 1.0, out.margin_sd, alpha, std_b=1.0 if n_ref else None,
                                             n_b=n_ref, kind=kind, power=power)

    def achieved(n_max: int, paths: int) -> float:
        levels = sequential.nominal_levels(n_max, alpha, spending, sequential.MIN_REPEATS, n_ref, paths)
        decision, _ = simulate(n_max, effect, margin, n_ref, alpha, spending, question, SEARCH_DRAWS, levels=levels)
        return float(np.mean(decision == right))

    low = max(sequential.MIN_REPEATS, out.fixed_repeats or sequential.MIN_REPEATS)
    if low > MAX_PLANNED_REPEATS:
        out.reason = f"more than {MAX_PLANNED_REPEATS} repeats would be needed"
        return out
    # grow from the fixed design's n until the power is reached, then bisect back
    high, factor = low, 1.0
    while achieved(high, SEARCH_PATHS) < power:
        if high >= MAX_PLANNED_REPEATS:
            out.reason = f"more than {MAX_PLANNED_REPEATS} repeats would be needed"
            return out
        low, factor = high + 1, factor + 0.15
        high = min(MAX_PLANNED_REPEATS, max(high + 1, math.ceil((out.fixed_repeats or low) * factor)))
    while low < high:
        middle = (low + high) // 2
        if achieved(middle, SEARCH_PATHS) >= power:
            high = middle
        else:
            low = middle + 1
    # confirmed with the levels a run records (the full calibration)
    n_max = high
    while True:
        decision, used = simulate(n_max, effect, margin, n_ref, alpha, spending, question)
        out.achieved_power = float(np.mean(decision == right))
        if out.achieved_power >= power or n_max >= MAX_PLANNED_REPEATS:
            break
        n_max += 1
    out.max_repeats, out.expected_repeats = n_max, float(used.mean())
    if out.achieved_power < power:
        out.max_repeats, out.reason = None, f"more than {MAX_PLANNED_REPEATS} repeats would be needed"
    return out
