"""Valid FLOPS (HPC AI500), shown with the inputs it was computed from.

``valid_flops = flops_per_s * (achieved / target) ** exponent`` (exponent 5 for image
classification; ``target / achieved`` when lower is better).  The ratio is not capped: HPC
AI500's penalty coefficient penalises quality below the target and awards quality above it
(Jiang et al., HPC AI500, section 4.3).  Each repeat summary records its inputs under
``valid_flops``; this section lists them, summarises the recorded values and recomputes each
one.  A recorded value that the formula does not give from its inputs is reported.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from repro500.verify import stats
from repro500.verify.rundir import RunData

FORMULA = "valid_flops = flops_per_s * (achieved / target) ** exponent"
_REL_TOL = 1e-6


@dataclass
class FlopsResult:
    formula: str = FORMULA
    repeats: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    mismatches: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def recompute(inputs: dict[str, Any]) -> float | None:
    """Valid FLOPS from recorded inputs; None when an input is missing or the ratio is undefined."""
    fps, achieved, target, exponent = (_num(inputs.get(k)) for k in ("flops_per_s", "achieved", "target", "exponent"))
    if fps is None or achieved is None or target is None or exponent is None or target <= 0 or achieved < 0:
        return None
    if inputs.get("direction") == "lower":  # lower is better: the quality ratio is inverted
        if achieved == 0:
            return None
        ratio = target / achieved
    else:
        ratio = achieved / target
    try:
        value = fps * ratio**exponent
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _problem(k: int, recorded: float | None, recomputed: float | None) -> str | None:
    """The sentence reporting a recorded value that its inputs do not give, else None."""
    if recorded is None:
        return None
    if recomputed is None:
        return f"repeat {k}: recorded valid_flops {recorded:.6g} cannot be recomputed: its inputs are missing or undefined"
    if math.isclose(recorded, recomputed, rel_tol=_REL_TOL, abs_tol=1e-9):
        return None
    return f"repeat {k}: recorded valid_flops {recorded:.6g} but its inputs give {recomputed:.6g}"


def valid_flops(run: RunData, alpha: float) -> FlopsResult:
    res = FlopsResult()
    recorded_values = []
    for k in run.completed:
        doc = run.repeats[k]
        inputs = doc.get("valid_flops") if isinstance(doc.get("valid_flops"), dict) else {}
        metrics = doc.get("metrics") or {}
        recorded = _num(metrics.get("valid_flops"))
        if not inputs and recorded is None:
            continue
        recomputed = recompute(inputs)
        res.repeats.append({
            "repeat": k, "flops_per_s": _num(inputs.get("flops_per_s")), "achieved": _num(inputs.get("achieved")),
            "target": _num(inputs.get("target")),
            "direction": "lower" if inputs.get("direction") == "lower" else "higher",
            "exponent": _num(inputs.get("exponent")), "train_flops": _num(metrics.get("train_flops")),
            "time_to_quality_s": _num(metrics.get("time_to_quality_s")), "valid_flops": recorded,
            "recomputed": recomputed,
        })
        if recorded is not None:
            recorded_values.append(recorded)
        problem = _problem(k, recorded, recomputed)
        if problem:
            res.mismatches.append(problem)
    if recorded_values:
        res.summary = stats.describe(recorded_values, alpha)
    return res
