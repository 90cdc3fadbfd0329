"""MLflow's own plug-in door for a wrapped script's runs: a run-context provider.

Registered as the entry point ``mlflow.run_context_provider`` (pyproject.toml), MLflow loads it in
every process that imports ``mlflow``.  Inside a repeat of a ``repro500 run`` (the command's
environment carries ``REPRO500_RUN_ID`` and ``REPRO500_REPEAT``) every run the script starts
(``mlflow.start_run``, with or without ``set_experiment`` or a run name, several per repeat, or
through autologging) is tagged with the repro500 run and the repeat, so repro500 finds the runs
wherever the script put them, reads its metrics from them, and nests them under the repeat's
own run where they share its experiment (docs/command.md, "Metrics from the script's MLflow
runs").  Outside a repeat it adds nothing; the script is never changed.

This module is imported while ``mlflow`` itself is being imported: it must stay this small.
"""

from __future__ import annotations

import os

from mlflow.tracking.context.abstract_context import RunContextProvider

from repro500.tracking import REPEAT_ENV, REPEAT_TAG, RUN_ID_ENV, RUN_ID_TAG, SCRIPT_TAG


class RepeatRunContext(RunContextProvider):
    def in_context(self) -> bool:
        return bool(os.environ.get(RUN_ID_ENV)) and bool(os.environ.get(REPEAT_ENV))

    def tags(self) -> dict[str, str]:
        return {RUN_ID_TAG: os.environ[RUN_ID_ENV], REPEAT_TAG: os.environ[REPEAT_ENV], SCRIPT_TAG: "true"}
