"""The run's MLflow side: the parent run's tags, and starting, resuming and ending it.

The run directory is the source of truth; MLflow mirrors it (docs/contracts.md, "MLflow").
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path
from typing import Any

from repro500.runner.plan import Plan


def parent_tags(plan: Plan, run_id: str, manifest: dict[str, Any], source_name: str) -> dict[str, str]:
    """The ``repro500.*`` and ``mlflow.source.*`` tags of a run's parent (MLflow would derive the
    git tags from ``sys.argv[0]``, the console script, so they are set here from the manifest)."""
    from repro500.capture.hardware import gpu_model

    recipe = plan.recipe
    facets = manifest.get("facets", {})
    # The experiment's own repository when it has one (a command's or plug-in's), else repro500's.
    code = (facets.get("experiment") or {}).get("repository") or facets.get("code", {}) or {}
    compressor = plan.compressor
    tags = {
        "repro500.run_id": run_id,
        "repro500.manifest_digest": manifest["digest"]["value"],
        "repro500.recipe": recipe.name,
        "repro500.workload": plan.workload.kind,
        "repro500.dirty": str(bool(code.get("dirty"))).lower(),
        "repro500.gpu_model": gpu_model(manifest),
        "repro500.world_size": str(plan.world_size),
        "repro500.engine": plan.engine,
        "repro500.compressor": compressor if isinstance(compressor, str) else compressor.get("name", "?"),
        "repro500.open_division": str(recipe.open_division).lower(),
        "repro500.deterministic": str(plan.deterministic).lower(),
        "repro500.repeats": str(recipe.repeats),
        "mlflow.source.name": source_name,
        "mlflow.source.type": "LOCAL",
    }
    if code.get("commit"):
        tags["mlflow.source.git.commit"] = code["commit"]
    if code.get("branch"):
        tags["mlflow.source.git.branch"] = code["branch"]
    remotes = {r["name"]: r["url"] for r in code.get("remotes") or [] if r.get("url")}
    if remotes:
        tags["mlflow.source.git.repoURL"] = remotes.get("origin") or next(iter(remotes.values()))
    return tags


class Tracking:
    """The parent run of one ``repro500 run`` and its nested repeat runs."""

    def __init__(self, experiment: str) -> None:
        from repro500 import tracking

        self.tracker = tracking.Tracker(experiment)
        self.ended = False

    @property
    def uri(self) -> str:
        return self.tracker.uri

    def open(self, plan: Plan, meta: dict[str, Any], manifest: dict[str, Any], run_id: str,
             source_name: str, artifacts: list[Path]) -> None:
        """Resume the recorded parent when the run is resumed against the same store; else start one."""
        from repro500 import tracking

        previous = meta.get("mlflow") or {}
        if previous.get("parent_run_id") and previous.get("tracking_uri") == tracking._safe_uri(self.uri):
            self.tracker.resume_parent(previous["parent_run_id"])
            return
        params = plan.recipe.flat_params()
        parent = self.tracker.start_parent(run_id, params, parent_tags(plan, run_id, manifest, source_name))
        meta["mlflow"] = {"tracking_uri": tracking._safe_uri(self.uri), "experiment_id": self.tracker.experiment_id,
                          "parent_run_id": parent, "repeat_run_ids": {}}
        self.tracker.log_artifacts(parent, [p for p in artifacts if p.is_file()])

    def start_repeat(self, k: int, seed: int, run_id: str, params: dict[str, str]) -> str:
        return self.tracker.start_repeat(k, {"repro500.seed": str(seed), "repro500.run_id": run_id}, params=params)

    def end_repeat(self, mlflow_id: str, summary: dict[str, Any], files: list[Path], status: str) -> None:
        try:
            self.tracker.end_repeat(mlflow_id, summary, files, status)
        except BaseException:
            # the repeat is complete on disk: whatever stopped the logging, MLflow must not keep it
            # RUNNING (a Ctrl-C here used to leave it so)
            with suppress(Exception):
                self.tracker.client.set_terminated(mlflow_id, status=status)
            raise

    def log_epoch(self, mlflow_id: str, record: dict[str, Any], steps: list[dict[str, Any]]) -> None:
        self.tracker.log_epoch(mlflow_id, record, steps)

    def kill(self, mlflow_id: str, reason: str) -> None:
        self.tracker.kill(mlflow_id, reason)

    def close(self, status: str, **logged: Any) -> None:
        if not self.ended:
            self.tracker.end_parent(status, **logged)
            self.ended = True

    def log_parent_artifacts(self, files: list[Path]) -> None:
        self.tracker.log_artifacts(self.tracker.parent_id, [p for p in files if p.is_file()])
