"""Sampling bias in the verdict: WARN when a repeat drew an epoch that was incomplete (a sample
drawn twice, or more left out than ``drop_last`` leaves) or whose class histogram disagrees with
the data set's (workloads/sampling.py records both per epoch).  A warning, not a failure: the
run's metrics are what they are, but a reader should know the batches did not represent the data."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from repro500.statuses import OK, WARN


@dataclass
class SamplingResult:
    status: str  # OK | WARN | SKIPPED
    reason: str
    repeats: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_sampling(repeats: dict[Any, dict[str, Any]]) -> SamplingResult | None:
    """None when no repeat recorded its sampling (a command, or a run before repro500 did)."""
    recorded = {str(k): doc["sampling"] for k, doc in sorted(repeats.items()) if (doc or {}).get("sampling")}
    if not recorded:
        return None
    problems = []
    for k, s in recorded.items():
        if s["incomplete_epochs"]:
            problems.append(f"repeat {k}: epoch(s) {_epochs(s['incomplete_epochs'])} incomplete "
                            f"({s['duplicated']} sample(s) drawn more than once, {s['missing_beyond_drop_last']} "
                            "never drawn beyond drop_last's remainder)")
        if s["biased_epochs"]:
            problems.append(f"repeat {k}: epoch(s) {_epochs(s['biased_epochs'])} drew classes unlike the data set "
                            f"(chi-square p = {s['min_p_value']:.3g})")
    if problems:
        return SamplingResult(WARN, "; ".join(problems), recorded)
    epochs = sum(s["epochs"] for s in recorded.values())
    balance = next((s["not_measured"] for s in recorded.values() if s.get("not_measured")), None)
    p_values = [s["min_p_value"] for s in recorded.values() if s.get("min_p_value") is not None]
    detail = (f"class balance not measured: {balance}" if balance else
              f"class histograms agree with the data set's (smallest chi-square p = {min(p_values):.3g})"
              if p_values else "class balance not tested")
    return SamplingResult(OK, f"{epochs} epoch(s) in {len(recorded)} repeat(s) drew every sample once "
                                f"(drop_last's remainder aside); {detail}", recorded)


def _epochs(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers[:5])) + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")
