"""One repeat of a run, as the serial loop runs it and as a fanned-out task runs it: one function,
so that a repeat run side by side (runner/fanout.py) is the same repeat as one run in turn."""

from __future__ import annotations

from typing import Any

from repro500.capture import source
from repro500.rundir import layout
from repro500.runner.capture import own_outputs
from repro500.runner.plan import Plan
from repro500.workloads.workload import Progress, Repeat


def run_one(plan: Plan, run: layout.RunDir, k: int, run_id: str, hooks: Progress, mlflow: Any) -> dict[str, Any]:
    """Run repeat *k* of *plan* into ``run``'s fresh ``repeats/<k>/``; its summary (the workload
    writes it last).  Raises what the workload raised: the caller records the failure."""
    out = run.fresh_repeat(k)
    return plan.workload.run_repeat(Repeat(
        k, plan.seeds(k), out, hooks, run_id=run_id, mlflow=mlflow, own_outputs=own_outputs(run),
        source_files=source.copied_files(run.path), deterministic=plan.deterministic_at(k), varied=plan.varied(k)))
