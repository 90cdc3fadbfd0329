"""Valid FLOPS (HPC AI500), shown with the inputs it was computed from.

``valid_flops = flops_per_s * (achieved / target) ** exponent`` (exponent 5 for image
classification; ``target / achieved`` when lower is better): throughput is penalised when
the quality target is missed.  Each repeat
summary records its inputs under ``valid_flops``; this section lists them, summarises the
recorded values and recomputes each one.  BenchCouncil does not say whether quality above
the target is rewarded, so a recorded value is accepted when it matches either the plain
formula or the one with the ratio capped at 1; any other value is reported.
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


def recompute(inputs: dict[str, Any]) -> tuple[float | None, float | None]:
    """(uncapped, capped) Valid FLOPS from recorded inputs; None when an input is missing."""
    fps, achieved, target, exponent = (_num(inputs.get(k)) for k in ("flops_per_s", "achieved", "target", "exponent"))
    if None in (fps, achieved, target, exponent) or target == 0 or achieved < 0 or target < 0:
        return None, None
    if inputs.get("direction") == "lower":  # lower is better: the quality ratio is inverted
        if achieved == 0:
            return None, None
        ratio = target / achieved
    else:
        ratio = achieved / target
    return fps * ratio**exponent, fps * min(1.0, ratio) ** exponent


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
        plain, capped = recompute(inputs)
        entry = {
            "repeat": k, "flops_per_s": _num(inputs.get("flops_per_s")), "achieved": _num(inputs.get("achieved")),
            "target": _num(inputs.get("target")), "exponent": _num(inputs.get("exponent")),
            "train_flops": _num(metrics.get("train_flops")), "time_to_quality_s": _num(metrics.get("time_to_quality_s")),
            "valid_flops": recorded, "recomputed": plain,
        }
        res.repeats.append(entry)
        if recorded is not None:
            recorded_values.append(recorded)
            if plain is not None and not any(math.isclose(recorded, v, rel_tol=_REL_TOL, abs_tol=1e-9) for v in (plain, capped)):
                res.mismatches.append(f"repeat {k}: recorded valid_flops {recorded:.6g} but the inputs give {plain:.6g}")
    if recorded_values:
        res.summary = stats.describe(recorded_values, alpha)
    return res
