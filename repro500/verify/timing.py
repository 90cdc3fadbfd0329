"""Time-to-train: MLPerf-style olympic mean and the "converged suspiciously fast" check.

The run's time-to-quality is summarised by the olympic mean (drop the fastest and the
slowest repeat; MLPerf's result summarizer).  Against a reference that reports
epochs-to-quality (another run, or a published file's ``epochs_to_quality``), the run's
mean epochs-to-quality is compared with the lowest mean a one-sided pooled t-test would
not call faster than the reference (MLPerf's reference-convergence-point check):

    bound = ref_mean - t(1 - alpha, n_ref + n_run - 2) * s_ref * sqrt(1/n_ref + 1/n_run)

MLPerf finds this bound by binary search with ``scipy.stats.ttest_ind_from_stats`` and the
reference's standard deviation on both sides; the closed form above is the same number.
Differences from MLPerf, for the small n of repro500 runs: the means are olympic only with
3 or more values (plain means otherwise), the sample sizes are the counts themselves (not
count - 2), and the sample standard deviation (ddof=1) is used.  A zero reference spread
falls back to the pooled spread of both samples, and to an exact comparison when that is
zero too.  A run faster than the bound FAILS ("converged suspiciously fast": a different
evaluation, data or budget is more likely than a real 2x).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from repro500.statuses import FAIL, INCONCLUSIVE, PASS, REPEAT_COMPLETED, SKIPPED
from repro500.verify import distributions as dist
from repro500.verify.stats import olympic_mean, welch_p_less


@dataclass
class TimingResult:
    status: str  # PASS | FAIL | INCONCLUSIVE | SKIPPED
    reason: str
    repeats_reached: int = 0
    repeats_not_reached: int = 0
    time_to_quality_s: dict[str, Any] = field(default_factory=dict)
    epochs_to_quality: dict[str, Any] = field(default_factory=dict)
    reference_epochs: dict[str, Any] | None = None
    min_epochs_bound: float | None = None
    reference_time_ratio: float | None = None  # run olympic time / reference olympic time
    p_faster_than_reference: float | None = None  # one-sided Welch on time_to_quality_s
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "values": []}
    x = np.asarray(values, dtype=float)
    return {
        "n": int(x.size), "values": [float(v) for v in x], "mean": float(x.mean()),
        "olympic_mean": olympic_mean(x), "min": float(x.min()), "max": float(x.max()),
        "std": float(x.std(ddof=1)) if x.size > 1 else None,
    }


def _central(values: list[float]) -> float:
    om = olympic_mean(values) if len(values) >= 3 else None
    return om if om is not None else float(np.mean(values))


def min_epochs_bound(ref: list[float], n_run: int, alpha: float, *, run: list[float] | None = None) -> tuple[float, str]:
    """The RCP-style lower bound on a run's mean epochs-to-quality, and how its spread was chosen."""
    ref_mean = _central(ref)
    n_ref = len(ref)
    s = float(np.std(ref, ddof=1))
    how = "reference standard deviation"
    if s == 0.0 and run is not None and len(run) > 1:
        pooled = np.concatenate([np.asarray(ref, float) - np.mean(ref), np.asarray(run, float) - np.mean(run)])
        s = float(math.sqrt(np.sum(pooled**2) / (n_ref + len(run) - 2)))
        how = "pooled standard deviation (the reference has none)"
    if s == 0.0:
        return ref_mean, "exact comparison (no spread on either side)"
    df = n_ref + n_run - 2
    bound = ref_mean - float(dist.t_ppf(1.0 - alpha, df)) * s * math.sqrt(1.0 / n_ref + 1.0 / n_run)
    return bound, how


def check_time_to_train(
    repeats: list[dict[str, Any]],
    alpha: float,
    *,
    reference_epochs: list[float] | None = None,
    reference_times_s: list[float] | None = None,
) -> TimingResult:
    """Summarise time/epochs-to-quality and run the convergence check.

    ``repeats`` are repeat summaries; those that did not complete or did not reach the
    target count as not converged.
    """
    times, epochs, not_reached = [], [], 0
    for doc in repeats:
        metrics = doc.get("metrics") or {}
        if doc.get("status", REPEAT_COMPLETED) != REPEAT_COMPLETED or doc.get("reached_target") is False:
            not_reached += 1
            continue
        t = doc.get("time_to_quality_s", metrics.get("time_to_quality_s"))
        e = doc.get("epochs_to_quality", metrics.get("epochs_to_quality"))
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            times.append(float(t))
        if isinstance(e, (int, float)) and not isinstance(e, bool):
            epochs.append(float(e))
    res = TimingResult(status=SKIPPED, reason="", repeats_reached=len(epochs) or len(times),
                       repeats_not_reached=not_reached, time_to_quality_s=_summary(times),
                       epochs_to_quality=_summary(epochs))
    if not_reached > 1:
        res.notes.append(f"{not_reached} repeats did not reach the target (MLPerf calls more than one insufficient convergence)")
    if reference_times_s and len(reference_times_s) >= 2 and len(times) >= 2:
        res.reference_time_ratio = _central(times) / _central(reference_times_s)
        p_faster = welch_p_less(times, reference_times_s)
        if math.isfinite(p_faster):
            res.p_faster_than_reference = p_faster
    if not reference_epochs:
        res.reason = "no reference epochs-to-quality: convergence check not run"
        return res
    res.reference_epochs = _summary(reference_epochs)
    if len(reference_epochs) < 2:
        res.status = INCONCLUSIVE
        res.reason = "the reference gives fewer than 2 epochs-to-quality values: no spread to test against"
        return res
    if not epochs:
        res.status = INCONCLUSIVE
        res.reason = "no repeat of this run reached the target: epochs-to-quality unknown"
        return res
    bound, how = min_epochs_bound(reference_epochs, len(epochs), alpha, run=epochs)
    res.min_epochs_bound = bound
    run_mean, ref_mean = _central(epochs), _central(reference_epochs)
    text = f"mean epochs-to-quality {run_mean:.4g} vs reference {ref_mean:.4g} (lower bound {bound:.4g}, {how})"
    if run_mean < bound:
        res.status = FAIL
        res.reason = f"converged suspiciously fast: {text}"
    else:
        res.status = PASS
        res.reason = f"convergence consistent with the reference: {text}"
    return res
