"""Order-statistic intervals for quantiles, and the timing harness behind repro500 ops."""

from __future__ import annotations

import time

import numpy as np
import pytest

from repro500.system import timing
from repro500.verify import quantiles
from repro500.verify.stats import median_interval


@pytest.mark.parametrize("n", [6, 10, 17, 30, 101])
def test_the_median_interval_is_the_verdict_statistics_own(n):
    values = np.random.default_rng(n).exponential(size=n)
    ours, theirs = quantiles.interval(values, 0.5, 0.05), median_interval(values, 0.05)
    assert (ours["low"], ours["high"]) == (theirs["low"], theirs["high"])
    assert ours["confidence"] == pytest.approx(theirs["confidence"])


def test_p99_needs_enough_values_and_says_how_many():
    few = quantiles.interval(np.arange(100.0), 0.99)
    assert few["high"] is None and few["low"] is not None
    assert "368 values would" in few["note"]
    enough = quantiles.interval(np.arange(400.0), 0.99)
    assert enough["low"] is not None and enough["high"] is not None and enough["note"] is None
    assert enough["low"] <= quantiles.point(np.arange(400.0), 0.99) <= enough["high"]
    assert enough["confidence"] >= 0.95


def test_quantile_intervals_cover_the_true_quantile_at_their_level():
    """A skewed distribution (exponential, p90 = ln 10): the 95% interval holds it in >= 95% of
    samples, whatever the shape: that is what 'distribution-free' promises."""
    rng = np.random.default_rng(7)
    truth, hits, trials = np.log(10.0), 0, 2000
    for _ in range(trials):
        ci = quantiles.interval(rng.exponential(size=60), 0.9, 0.05)
        hits += ci["low"] <= truth <= ci["high"]
    assert hits / trials >= 0.94  # 0.95 nominal, minus Monte Carlo noise (sd ~0.005)


def test_the_harness_excludes_warm_up_and_keeps_calling_until_the_budget():
    calls = []

    def call():
        calls.append(1)
        time.sleep(0.02 if len(calls) <= 2 else 0.0005)  # the first calls are slow, as a cold cache is

    t = timing.time_calls(call, lambda: None, timing.Budget(warmup=2, warmup_s=0.0, min_reps=10, budget_s=0.5))  # room for a stalled warm-up call
    assert t.warmup_calls == 2 and t.calls >= 10 and len(calls) == t.calls + 2
    # the slow warm-up calls are not in the median: timed calls sleep 0.5 ms, warm-up ones 20 ms;
    # 10 ms (half a warm-up call) leaves a loaded machine's wake-up delays (a few ms) below it
    assert t.median_s < 0.01
    assert t.ci_low_s <= t.median_s <= t.ci_high_s and t.ci_confidence >= 0.95


def test_a_very_slow_call_stops_after_three_and_says_how_sure_the_interval_is():
    t = timing.time_calls(lambda: time.sleep(0.03), lambda: None,
                          timing.Budget(warmup=2, warmup_s=0.0, min_reps=10, budget_s=0.005))
    assert t.warmup_calls == 1  # one call longer than the whole budget has warmed up
    assert t.calls == timing.SLOW_MIN_REPS
    assert t.ci_confidence == pytest.approx(0.75)  # [min, max] of 3 values
