"""The ``dvc.yaml`` files repro500 writes: one owner for their shape and conventions.

Two commands write a pipeline: ``repro500 init`` (the user's own experiment, docs/dvc.md) and
``repro500 publish`` (a publication's rerun, docs/publish.md).  What they share is spelt here
once: how a stage tolerates a verdict that is a result, where the verdict's DVC metrics go, and
how the text is laid out; each command keeps the stages that are its own.  What DVC then owns in
a directory is read back by :mod:`repro500.capture.dvcowned` from the same documented shape.
"""

from __future__ import annotations

from typing import Any

import yaml

from repro500.rundir import dvcmetrics, names

DVC_FILE = names.DVC_FILE
# A FAIL (1) or INCONCLUSIVE (3) verdict is a result, not a failed stage: the stage succeeds and
# the verdict is the metric.  Every other exit (4 invalid input, 2 usage) fails the stage.
RESULT_OK = "|| test $? -eq 1 -o $? -eq 3"
VERDICT_METRICS = "metrics/verdict.json"  # repro500's flat verdict view (rundir/dvcmetrics.py)
# Where repro500 init's stage keeps its runs side by side, one directory per DVC experiment
RUNS = "runs/dvc"
PLOTS = "plots"  # the folder ``--plots`` fills for ``dvc plots show`` (rundir/dvcmetrics.py)


def metrics_entry(path: str = VERDICT_METRICS) -> dict[str, dict[str, bool]]:
    """A ``metrics:`` entry DVC keeps in git, not in its cache: a small file read by ``dvc metrics``."""
    return {path: {"cache": False}}


def persistent(path: str) -> dict[str, dict[str, bool]]:
    """An ``outs:`` entry DVC neither deletes before the stage runs nor restores from its run-cache."""
    return {path: {"persist": True}}


def plots_entries(headline: list[str], *, epochs: bool = True) -> list[dict[str, dict[str, Any]]]:
    """A stage's ``plots:`` for what ``--plots PLOTS`` writes: each repeat's final value of the first
    *headline* metric, and (*epochs*: a workload that records epochs) its value at each epoch of each
    repeat, as points (``scatter``: the repeats are not one series).  Kept in git like the metrics."""
    y = {"y": headline[0]} if headline else {}
    entries = [{f"{PLOTS}/{dvcmetrics.REPEATS_PLOT}": {"x": "repeat", **y, "template": "scatter", "cache": False}}]
    if epochs:
        entries.append({f"{PLOTS}/{dvcmetrics.EPOCHS_PLOT}": {"x": "epoch", **y, "template": "scatter", "cache": False}})
    return entries


def render(head: list[str], stages: dict[str, Any]) -> str:
    """The file's text: comment lines saying who wrote it and how to run it, then the stages."""
    lines = "".join(f"# {line}\n" if line else "#\n" for line in head)
    return lines + yaml.safe_dump({"stages": stages}, sort_keys=False, width=1000)
