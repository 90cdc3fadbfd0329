"""A verdict's numbers as a flat DVC metrics file (``repro500 verify --metrics FILE``), and a
run's values per repeat and per epoch as DVC plots files (``repro500 run --plots DIR``).

``verdict.json`` is a deep document with lists and sentences; ``dvc metrics show`` and
``dvc metrics diff`` compare leaves by their dotted key, and a list makes its elements
anonymous.  This view keeps the numbers and statuses a reader compares across experiments,
keyed by metric name (docs/dvc.md, "metrics/verdict.json")::

    {"status": "PASS", "exit_code": 0, "alpha": 0.05,
     "accuracy": {"n": 3, "mean": 0.93, "std": 0.004, "cv": 0.0043, "ci_low": 0.92, "ci_high": 0.94,
                  "band": {"threshold": 0.92, "bound": 0.923, "bound_side": "lower", "margin": 0.003,
                           "status": "PASS"},
                  "reproduced": {"diff": 0.001, "ci_low": -0.004, "ci_high": 0.006,
                                 "margin": 0.03, "p_value": 0.001, "status": "REPRODUCED"}},
     "throughput_samples_per_s": {"mean": 480.2, "cv": 0.034}, ...,
     "time_to_train": {"status": "SKIPPED"}, "determinism": {"status": "SKIPPED"}}

Metrics the verdict decides on (acceptance bands, equivalence) get their interval; every
other metric only its mean and coefficient of variation, so that ``dvc metrics show`` stays
a readable table.  ``null`` values are left out (DVC shows them as "-" anyway).  It is a view of the verdict,
not a contract of its own, so it carries no ``schema`` key (that would be one more column in
every ``dvc exp show``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from repro500.errors import InvalidInput
from repro500.rundir import atomic, layout
from repro500.rundir.names import METRICS

# The files ``--plots DIR`` writes, each a list of flat records (``dvc plots show`` draws one
# field against another): a record per finished repeat, and one per epoch of each repeat
REPEATS_PLOT = "repeats.json"
EPOCHS_PLOT = "epochs.json"

DECIDED_KEYS = ("n", "mean", "std", "cv", "ci_low", "ci_high")  # metrics with a band or an equivalence test
OTHER_KEYS = ("mean", "cv")
BAND_KEYS = ("threshold", "bound", "bound_side", "margin", "status")


def _numbers(source: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: source[key] for key in keys if source.get(key) is not None}


def verdict_metrics(doc: dict[str, Any]) -> dict[str, Any]:
    """The flat metrics view of a verdict document (``Verdict.to_dict()``)."""
    out: dict[str, Any] = {"status": doc.get("status"), "exit_code": doc.get("exit_code"), "alpha": doc.get("alpha")}
    decided = {b.get("metric") for b in doc.get("bands") or []} | {e.get("metric") for e in doc.get("equivalence") or []}
    for name, stats in sorted((doc.get("statistics") or {}).items()):
        out[name] = _numbers(stats, DECIDED_KEYS if name in decided else OTHER_KEYS)
    for band in doc.get("bands") or []:
        # the bound the verdict decided on, as it named it (verify/bands.py), never re-derived here
        entry = out.setdefault(band["metric"], {})
        entry["band"] = _numbers(band, BAND_KEYS)
    for item in doc.get("equivalence") or []:
        tost = item.get("tost") or {}
        entry = out.setdefault(item["metric"], {})
        entry["reproduced"] = _numbers(
            {"diff": tost.get("diff"), "ci_low": tost.get("ci_low"), "ci_high": tost.get("ci_high"),
             "margin": item.get("margin"), "p_value": item.get("p_value"), "status": item.get("status")},
            ("diff", "ci_low", "ci_high", "margin", "p_value", "status"))
    timing = doc.get("time_to_train") or {}
    if timing.get("status"):
        out["time_to_train"] = {"status": timing["status"]}
    determinism = doc.get("determinism") or {}
    if determinism.get("status"):
        out["determinism"] = {"status": determinism["status"]}
    return {key: value for key, value in out.items() if value is not None}


def write_metrics(doc: dict[str, Any], path: str | Path) -> Path:
    """Write :func:`verdict_metrics` of ``doc`` to ``path`` atomically; returns the path."""
    target = Path(path)
    try:
        atomic.write_json(target, verdict_metrics(doc))
    except OSError as err:
        raise InvalidInput(f"could not write the metrics file {target} ({err.strerror or err.__class__.__name__}): "
                           "give a writable path") from None
    return target


def _plain_numbers(values: Any) -> dict[str, float]:
    """The finite numbers of a flat mapping (a plot has nothing to draw for text, null or inf)."""
    if not isinstance(values, dict):
        return {}
    return {str(k): v for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def plot_records(run_dir: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(a record per finished repeat: ``repeat`` and its final metrics; a record per epoch of each
    finished repeat: ``repeat``, ``epoch`` and that epoch's metrics), from the run's own files."""
    run = layout.RunDir(run_dir)
    planned = run.meta().get("repeats")
    summaries = run.summaries(planned if isinstance(planned, int) else 0, finished_only=True)
    repeats, epochs = [], []
    for k, summary in sorted(summaries.items()):
        repeats.append({"repeat": k, **_plain_numbers(summary.get("metrics"))})
        records, _ = layout.metric_records(run.repeat(k) / METRICS)
        for record in records:
            if record.get("kind") == "epoch" and isinstance(record.get("epoch"), int):
                epochs.append({"repeat": k, "epoch": record["epoch"], **_plain_numbers(record.get("metrics"))})
    return repeats, epochs


def write_plots(run_dir: str | Path, folder: str | Path) -> Path:
    """Write :func:`plot_records` of the run to ``folder``: :data:`REPEATS_PLOT`, and :data:`EPOCHS_PLOT`
    when the workload records epochs (a wrapped command does not)."""
    repeats, epochs = plot_records(run_dir)
    target = Path(folder)
    try:
        for name, records in ((REPEATS_PLOT, repeats), (EPOCHS_PLOT, epochs)):
            if records or name == REPEATS_PLOT:
                atomic.write_json(target / name, records)
    except OSError as err:
        raise InvalidInput(f"could not write the plots into {target} ({err.strerror or err.__class__.__name__}): "
                           "give a writable directory") from None
    return target
