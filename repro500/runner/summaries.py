"""Stage: summaries.  The aggregate ``summary.json`` across repeats, and the run's identity."""

from __future__ import annotations

import secrets
import time
from typing import Any

from repro500.recipe import load as recipes
from repro500.rundir import layout
from repro500.statuses import REPEAT_COMPLETED


def utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_run_id(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40]
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{safe}-{secrets.token_hex(2)}"


def aggregate(run_id: str, recipe: recipes.Recipe, summaries: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The aggregate ``summary.json`` (repro500/summary/v1): values of completed repeats per metric."""
    metrics: dict[str, dict[str, list[Any]]] = {}
    for k in sorted(summaries):
        s = summaries[k]
        if s.get("status") != REPEAT_COMPLETED:
            continue
        for name, value in (s.get("metrics") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                entry = metrics.setdefault(name, {"repeats": [], "values": []})
                entry["repeats"].append(k)
                entry["values"].append(value)
    return {
        "schema": layout.SUMMARY_SCHEMA,
        "run_id": run_id,
        "recipe_name": recipe.name,
        "workload": recipe.fixed["workload"],
        "repeats_planned": recipe.repeats,
        "repeats": {str(k): summaries[k].get("status", "unknown") for k in sorted(summaries)},
        "acceptance": recipe.acceptance,
        "target": recipe.fixed.get("target"),
        "metrics": metrics,
        "final_param_digests": {str(k): s.get("final_param_digest") for k, s in sorted(summaries.items()) if s.get("final_param_digest")},
        "seeds": {str(k): (s.get("seeds") or {}).get("torch") for k, s in sorted(summaries.items())},
    }
