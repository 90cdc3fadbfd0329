"""MLflow's own plug-in door for a wrapped script's runs: a run-context provider.

Registered as the entry point ``mlflow.run_context_provider`` (pyproject.toml), MLflow loads it in
every process that imports ``mlflow``.  Inside a repeat of a ``repro500 run`` (the command's
environment carries ``REPRO500_RUN_ID`` and ``REPRO500_REPEAT``) every run the script starts
(``mlflow.start_run``, with or without ``set_experiment`` or a run name, several per repeat, or
through autologging) is tagged with the repro500 run and the repeat, so repro500 finds the runs
wherever the script put them and reads its metrics from them (docs/command.md, "Metrics from the
script's MLflow runs").  Outside a repeat it adds nothing; the script is never changed.

The repeat's own MLflow run is named in the file ``REPRO500_MLFLOW_READY`` points to (repro500
writes it once that run exists; the command's ``import mlflow`` waits for it).  From it, a run
gets, as it starts, ``repro500.repeat_run_id`` (the way back to the repeat, from any experiment)
and, when ``mlflow.start_run`` starts it in the repeat's own experiment without a parent of the
script's, ``mlflow.parentRunId``: MLflow's UI nests a run under a parent of the same experiment
only, so a run in an experiment the script chose has no parent tag.  The experiment a run starts
in is read from ``mlflow.start_run``'s frame (MLflow hands providers no argument); where that is
not possible the tags are added after the repeat instead (repro500.tracking.client.Tracker.adopt_script_runs).

This module is imported while ``mlflow`` itself is being imported: it must stay this small.
"""

from __future__ import annotations

import json
import os
import sys

from mlflow.tracking.context.abstract_context import RunContextProvider

from repro500.tracking.names import (
    PARENT_TAG,
    READY_ENV,
    REPEAT_ENV,
    REPEAT_RUN_TAG,
    REPEAT_TAG,
    RUN_ID_ENV,
    RUN_ID_TAG,
    SCRIPT_TAG,
)

_FRAMES = 6  # tags() <- resolve_tags() <- start_run(): a few frames up, never the whole stack


def _repeat_run() -> dict[str, str]:
    """The repeat's own run, ``{"run_id", "experiment_id"}``, once repro500 has made it."""
    path = os.environ.get(READY_ENV)
    try:
        with open(path or "", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    return {k: str(v) for k, v in doc.items() if v} if isinstance(doc, dict) else {}


def _starting_experiment() -> str | None:
    """The experiment ``mlflow.start_run`` is starting a run in, or None when the tags are asked
    for by anything else (a logged model, a trace, a run made with the client)."""
    frame = sys._getframe(2)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_name == "start_run" and frame.f_code.co_filename.endswith(os.path.join("tracking", "fluent.py")):
            found = frame.f_locals.get("exp_id_for_run")
            return None if found is None else str(found)
        frame = frame.f_back
    return None


class RepeatRunContext(RunContextProvider):
    def in_context(self) -> bool:
        return bool(os.environ.get(RUN_ID_ENV)) and bool(os.environ.get(REPEAT_ENV))

    def tags(self) -> dict[str, str]:
        tags = {RUN_ID_TAG: os.environ[RUN_ID_ENV], REPEAT_TAG: os.environ[REPEAT_ENV], SCRIPT_TAG: "true"}
        repeat = _repeat_run()
        if repeat.get("run_id"):
            tags[REPEAT_RUN_TAG] = repeat["run_id"]
            # a parent the script gives (start_run(nested=True), parent_run_id=) overrides this one
            if repeat.get("experiment_id") and _starting_experiment() == repeat["experiment_id"]:
                tags[PARENT_TAG] = repeat["run_id"]
        return tags
