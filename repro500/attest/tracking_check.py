"""Two independent records: a run directory's repeats against what MLflow recorded as each finished.

The runner logs every repeat to its own MLflow run (repro500/tracking/client.py): the summary's numeric
metrics under their own names as the run's latest values, beside the steps' and epochs' histories
(:func:`repro500.tracking.names.is_history` tells them apart; runs logged before: as ``final_<name>``),
its status and final parameter digest as the tags ``repro500.status`` and ``repro500.final_param_digest``.  :func:`check_tracking` reads those back
from the store named in ``run.json`` (``mlflow.tracking_uri``; the store a run was downloaded from
replaces it, and ``MLFLOW_TRACKING_URI`` when set replaces both, e.g. to add the credentials
run.json never holds) and reports every disagreement.
Numbers agree when they are equal to 1e-12 relative (the stores keep doubles exactly; the
tolerance only absorbs a server's decimal round trip).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput
from repro500.rundir import layout
from repro500.rundir import sums as bundle
from repro500.tracking import names
from repro500.tracking.names import LEGACY_NAMES_TAG, NAMES_TAG, is_history
from repro500.tracking.store import check_readable, read_run, reason, safe_uri

_REL_TOL = 1e-12


@dataclass
class TrackingResult:
    uri: str | None = None
    compared: int = 0
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"uri": self.uri, "repeats_compared": self.compared, "problems": self.problems}


def _same(a: Any, b: float) -> bool:
    try:
        a = float(a)
    except (TypeError, ValueError):
        return False
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=0.0)


def _store_uri(recorded: str | None, store: str | None = None) -> tuple[str | None, str | None]:
    """(URI to open, or None) and why it cannot be opened."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or store or recorded
    if not uri:
        return None, "run.json records no MLflow tracking store (the run was made with --no-tracking)"
    if "[REDACTED]" in uri:
        return None, (f"run.json's tracking URI {uri} had its credentials removed: "
                      "set MLFLOW_TRACKING_URI to the same store with them")
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
        if not db.is_file():  # opening a missing SQLite store would create an empty one
            return None, f"the MLflow store {uri} does not exist here ({db.resolve()}); set MLFLOW_TRACKING_URI to it"
    return uri, None


def check_tracking(run_dir: str | Path, *, store: str | None = None) -> TrackingResult:
    """Compare each repeat's summary with its MLflow run; problems name the repeat and the value.

    *store*: the store the run was downloaded from (``verify mlflow:RUN_ID``), read instead of the
    one run.json names, a path on the machine that made it; ``MLFLOW_TRACKING_URI`` still comes first."""
    root = Path(run_dir)
    try:
        run = untrusted.load_json(untrusted.read_bytes(root / layout.RUN_JSON, layout.RUN_JSON), layout.RUN_JSON)
    except (OSError, InvalidInput):
        return TrackingResult(problems=["run.json is missing or not JSON: the tracking records cannot be found"])
    record = run.get("mlflow") or {}
    uri, why = _store_uri(record.get("tracking_uri"), store)
    result = TrackingResult(uri=safe_uri(uri) if uri else record.get("tracking_uri"))
    if uri is None:
        result.problems.append(str(why))
        return result
    ids = {int(k): v for k, v in (record.get("repeat_run_ids") or {}).items() if str(k).isdigit() and v}
    on_disk = {int(p.parent.name) for p in (root / "repeats").glob("*/summary.json") if p.parent.name.isdigit()}
    for k in sorted(on_disk - set(ids)):
        result.problems.append(f"repeat {k} has no MLflow run recorded in run.json")
    try:
        check_readable(uri, advice="set MLFLOW_TRACKING_URI to the store the run was logged to")
    except InvalidInput as err:  # a wrong password or a server that is down: one line, not MLflow's retries
        result.problems.append(f"{err}: the repeats were not compared with their tracking records")
        return result
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        for k in sorted(ids):
            result.problems += _compare(client, root, k, ids[k], uri)
            result.compared += 1
    except InvalidInput as err:  # the store did not answer about one run: not an answer about the others
        result.problems.append(f"{err}: the repeats were not compared with their tracking records")
    except Exception as err:  # noqa: BLE001 - any store failure means "could not compare"
        result.problems.append(f"the MLflow store {result.uri} could not be read ({reason(err)}): "
                               "the repeats were not compared with their tracking records")
    return result


def _compare(client: Any, root: Path, k: int, run_id: str, uri: str) -> list[str]:
    tracked = read_run(client, run_id, uri)
    if tracked is None:
        return [f"repeat {k}: MLflow run {run_id} is not in the store"]
    path = bundle.repeat_dir(root, k) / layout.REPEAT_SUMMARY
    if not path.is_file():
        return [f"repeat {k} was recorded in MLflow (run {run_id}) but repeats/{k}/summary.json is missing"]
    try:
        summary = untrusted.load_json(untrusted.read_bytes(path, "a repeat summary"), str(path))
    except (OSError, InvalidInput):
        return [f"repeats/{k}/summary.json is not JSON"]
    problems = []
    tags, logged = tracked.data.tags, tracked.data.metrics
    status = tags.get(names.STATUS_TAG)
    if status is not None and status != summary.get("status"):
        problems.append(f"repeat {k}: status is {summary.get('status')!r} in the run directory, {status!r} in MLflow")
    digest = tags.get(names.FINAL_PARAM_DIGEST_TAG)
    if digest and digest != (summary.get("final_param_digest") or ""):
        problems.append(f"repeat {k}: final parameter digest differs between the run directory and MLflow")
    metrics = {name: v for name, v in (summary.get("metrics") or {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}

    if NAMES_TAG in tags or LEGACY_NAMES_TAG in tags:  # docs/contracts.md, "MLflow names": each outcome under its own name
        finals = {name: logged[name] for name in metrics if name in logged}
        # the other way round, every key no history has alone (a user's metric named like one is
        # still compared above; it only escapes this reverse check)
        finals.update({name: v for name, v in logged.items() if name not in metrics and not is_history(name)})
    else:  # logged by a repro500 before one name per quantity: outcomes as final_<name>
        finals = {name.removeprefix("final_"): v for name, v in logged.items() if name.startswith("final_")}
    for name in sorted(set(metrics) | set(finals)):
        if name not in finals:
            problems.append(f"repeat {k}: {name} = {metrics[name]!r} in the run directory was never logged to MLflow")
        elif name not in metrics:
            if name in (summary.get("metrics") or {}):  # undefined at the end (None): MLflow has its epochs' values
                continue
            problems.append(f"repeat {k}: MLflow recorded {name} = {finals[name]!r}, the run directory has none")
        elif not _same(metrics[name], finals[name]):
            problems.append(f"repeat {k}: {name} is {metrics[name]!r} in the run directory, {finals[name]!r} in MLflow")
    return problems
