"""The run's MLflow side: the parent run's tags, and starting, resuming and ending it.

The run directory is the source of truth; MLflow mirrors it (docs/contracts.md, "MLflow").
"""

from __future__ import annotations

import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from repro500.capture.hardware import gpu_model
from repro500.errors import InvalidInput, ReproError
from repro500.rundir import atomic, layout
from repro500.runner import dvcexp
from repro500.runner.background import Worker
from repro500.runner.plan import Plan
from repro500.statuses import REPEAT_FAILED
from repro500.tracking import names
from repro500.tracking import process as tracking_process
from repro500.tracking import store as mlflow_store
from repro500.tracking.names import verdict_metrics


def parent_tags(plan: Plan, run_id: str, source_name: str, run_dir: str = "") -> dict[str, str]:
    """The tags of a run's parent known from the plan, before the capture ends.  ``repro500.run_dir``
    (absolute) is how ``--against history:EXPERIMENT`` finds the run's files (verify/history.py)."""
    recipe = plan.recipe
    compressor = plan.compressor
    return {
        names.RUN_ID_TAG: run_id,
        names.RUN_DIR_TAG: run_dir,
        names.RECIPE_TAG: recipe.name,
        names.WORKLOAD_TAG: plan.workload.kind,
        names.WORLD_SIZE_TAG: str(plan.world_size),
        names.ENGINE_TAG: plan.engine,
        names.COMPRESSOR_TAG: compressor if isinstance(compressor, str) else compressor.get("name", "?"),
        names.OPEN_DIVISION_TAG: str(recipe.open_division).lower(),
        names.DETERMINISTIC_TAG: str(plan.deterministic).lower(),
        names.REPEATS_TAG: str(recipe.repeats),
        "mlflow.source.name": source_name,
        "mlflow.source.type": "LOCAL",
        **dvc_experiment_tags(),
    }


def dvc_experiment_tags() -> dict[str, str]:
    """The DVC experiment this run is, where ``dvc exp run`` started it (its name as DVC gave it)."""
    experiment = dvcexp.current()
    return experiment.tags() if experiment else {}


def compressor_params(compressor: Any) -> dict[str, str]:
    """The parent's ``compressor.<field>`` params: the plan's resolved compressor spec, every
    default filled in (``compressor.ratio`` = 0.01 for a recipe that said only ``topk``), so
    runs are compared in MLflow by what ran, not by how the recipe spelled it.  Values are
    written as the recipe's params are (YAML/JSON scalars: ``null``, ``true``, ``0.01``)."""
    import json

    if not isinstance(compressor, dict):
        return {"compressor.name": str(compressor)}
    return {f"compressor.{key}": value if isinstance(value, str) else json.dumps(value)
            for key, value in compressor.items()}


def manifest_tags(manifest: dict[str, Any]) -> dict[str, str]:
    """The parent's tags that come from the manifest: its digest, the code's git state, the GPU
    (MLflow would derive the git tags from ``sys.argv[0]``, the console script, so they are set
    here from the manifest)."""
    facets = manifest.get("facets", {})
    # The experiment's own repository when it has one (a command's or plug-in's), else repro500's.
    code = (facets.get("experiment") or {}).get("repository") or facets.get("code", {}) or {}
    tags = {
        names.MANIFEST_DIGEST_TAG: manifest["digest"]["value"],
        names.DIRTY_TAG: str(bool(code.get("dirty"))).lower(),
        names.GPU_MODEL_TAG: gpu_model(manifest),
    }
    if code.get("commit"):
        tags["mlflow.source.git.commit"] = code["commit"]
    if code.get("branch"):
        tags["mlflow.source.git.branch"] = code["branch"]
    remotes = {r["name"]: r["url"] for r in code.get("remotes") or [] if r.get("url")}
    if remotes:
        tags["mlflow.source.git.repoURL"] = remotes.get("origin") or next(iter(remotes.values()))
    return tags


# The parent's tags every repeat's run carries too: where the code came from (the UI's Source and
# Version columns, a search by commit).
INHERITED_PREFIXES = ("mlflow.source.", names.MANIFEST_DIGEST_TAG, names.DIRTY_TAG)


def data_contexts(dataset: Any) -> dict[str, str]:
    """MLflow's dataset context of each data path the recipe names: ``training`` for its
    ``dataset.path``, ``evaluation`` for ``dataset.eval_path``."""
    if not isinstance(dataset, dict):
        return {}
    return {str(dataset[key]): context for key, context in (("path", "training"), ("eval_path", "evaluation"))
            if dataset.get(key)}


def now_ms() -> int:
    """The moment of a call on the run's side, for MLflow's start and end times: the call itself lands
    later, through the queue (client.Tracker)."""
    return int(time.time() * 1000)


def seed_tags(seeds: dict[str, Any], program_seed: int | None) -> dict[str, str]:
    """A repeat's seeds as tags named for what received them: ``repro500.seed.program`` the one seed
    a wrapped command gets (``{seed}``, ``$REPRO500_SEED``), ``repro500.seed.torch`` torch's."""
    tags = {names.TORCH_SEED_TAG: str(seeds["torch"])} if seeds.get("torch") is not None else {}
    if program_seed is not None:
        tags[names.PROGRAM_SEED_TAG] = str(program_seed)
    return tags


class Tracking:
    """The parent run of one ``repro500 run`` and its nested repeat runs, written off the critical
    path: every call is queued, in order, to one background thread (:mod:`repro500.runner.background`),
    so no repeat waits for MLflow's import (1-2 s), its store's creation and migrations (seconds on
    first use), or an artifact upload.  The run directory is the source of truth; this mirrors it.

    A failure in the background stops the queue; the runner finds it with :meth:`check` after the
    repeat in flight and stops the run there (finished repeats are kept, ``--resume`` completes it).
    """

    def __init__(self, experiment: str, uri: str, artifacts: str | None = None) -> None:
        import tempfile


        self.experiment, self.uri, self.artifacts = experiment, uri, artifacts
        self.tracker: Any = None
        self.parent_id: str | None = None
        self.repeat_ids: dict[int, str] = {}
        self.error: BaseException | None = None
        self.ended = False
        # A wrapped script's `import mlflow` waits for its repeat's file here (workloads/childsite):
        # the store is created or migrated by one process at a time (repeat_file).
        self._scratch = Path(tempfile.mkdtemp(prefix="repro500-mlflow-"))
        self._worker = Worker("repro500-mlflow")
        self._started: list[Any] = []
        self._closed_repeats: set[int] = set()  # their runs ended (FINISHED, FAILED or KILLED)
        # what every repeat's run carries besides its own: the parent's source and git tags and the
        # data it read, known once the plan (source) and the manifest (git, data) are
        self._inherited: dict[str, str] = {}
        self._data: list[dict[str, Any]] = []
        self._contexts: dict[str, str] = {}
        self._is_command = False  # a wrapped command's repeats are tagged with the seed it receives
        self._connected = self._queue(self._connect)

    # ----- the queue ------------------------------------------------------------------------------
    def _queue(self, fn: Any, *args: Any) -> Any:
        def call() -> Any:
            if self.error is not None:
                return None  # everything after a failure would fail alike
            try:
                return fn(*args)
            except BaseException as err:  # noqa: BLE001 - reported by check() on the main thread
                self.error = err
                return None
        return self._worker.submit(call)

    def _connect(self) -> None:
        self.tracker = tracking_process.connect(self.experiment, self.uri, self.artifacts)

    def check(self) -> None:
        """Raise what went wrong in the background, as one sentence (exit 4)."""
        death = getattr(self.tracker, "death", None)  # the MLflow process (tracking_process)
        if self.error is None and not self.ended and death is not None:
            # a logging process that died (killed, out of memory) fails the next call; its death is
            # found here even before a queued call has failed, so the run stops after this repeat
            self.error = death()
        if self.error is None:
            return

        if isinstance(self.error, ReproError):
            raise self.error
        raise InvalidInput(f"logging to the MLflow tracking store {mlflow_store.safe_uri(self.uri)} failed "
                           f"({mlflow_store.reason(self.error)})")

    def take_notes(self) -> list[str]:
        """The warnings for the user so far (once each), for the run to show between repeats."""
        notes = list(getattr(self.tracker, "notes", None) or [])
        if notes:
            self.tracker.notes = []
        return notes

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until the store is open (a script's MLflow runs can be read), then :meth:`check`."""
        self._connected.result(timeout=timeout_s)
        self.check()

    # ----- what the runner records ----------------------------------------------------------------
    def open(self, plan: Plan, meta: dict[str, Any], run_id: str, source_name: str, run_dir: str = "",
             started_ms: int | None = None) -> bool:
        r"""Resume the recorded parent when the run is resumed against the same store; else start one
        (its manifest-derived tags and artifacts follow with :meth:`describe`), begun at *started_ms*
        (the run's start; default now).  True when an earlier attempt logged to another store: its
        finished repeats are then :meth:`replay`\ ed here."""
        previous = dict(meta.get("mlflow") or {})
        self._is_command = bool(plan.recipe.is_command)
        self._queue(self._open, plan, previous, run_id, source_name, run_dir, started_ms or now_ms())
        return bool(previous.get("parent_run_id")) and previous.get("tracking_uri") != mlflow_store.safe_uri(self.uri)

    def _open(self, plan: Plan, previous: dict[str, Any], run_id: str, source_name: str, run_dir: str,
              started_ms: int) -> None:
        tags = parent_tags(plan, run_id, source_name, run_dir)
        self._inherited.update({k: v for k, v in tags.items() if k.startswith(INHERITED_PREFIXES)})
        self._contexts = data_contexts(plan.recipe.fixed.get("dataset"))
        if previous.get("parent_run_id") and previous.get("tracking_uri") == mlflow_store.safe_uri(self.uri):
            self.tracker.resume_parent(previous["parent_run_id"])
            self.repeat_ids.update({int(k): v for k, v in (previous.get("repeat_run_ids") or {}).items()})
            self.parent_id = previous["parent_run_id"]
            if run_dir:  # where the run is now (a run moved, or made before the tag existed)
                self.tracker.set_tags(self.parent_id, {names.RUN_DIR_TAG: run_dir})
            return
        params = plan.recipe.flat_params()
        if plan.engine != "command":  # a command exchanges no gradients of repro500's
            params.update(compressor_params(plan.compressor))
        self.parent_id = self.tracker.start_parent(run_id, params, tags, start_ms=started_ms)

    def replay(self, run: Any, planned: int, run_id: str, params: dict[str, str]) -> None:
        """The repeats an earlier attempt finished, from their files, into this store: the records
        their own runs would have got, so a resume into another store holds every repeat."""
        for k, summary in sorted(run.summaries(planned, finished_only=True).items()):
            # the times the repeat ran: its summary was written last, after its total_time_s
            ended_ms = int(run.repeat(k).joinpath(layout.REPEAT_SUMMARY).stat().st_mtime * 1000)
            started_ms = ended_ms - int(1000 * float(summary.get("total_time_s") or 0.0))
            seeds = summary.get("seeds") or {}
            self.start_repeat(k, seeds, run_id, params, started_ms=started_ms)
            self.log_epochs(run, k)
            self.end_repeat(k, summary, run.repeat_artifacts(k), "FINISHED" if summary.get("status") != REPEAT_FAILED
                            else "FAILED", ended_ms=ended_ms)

    def log_epochs(self, run: Any, k: int) -> None:
        """Repeat *k*'s epochs from its metrics.jsonl: for a repeat that ran where no hook could log
        them as they came (an earlier attempt, a task of its own)."""
        steps: list[dict[str, Any]] = []
        for record in layout.metric_records(run.repeat(k) / layout.METRICS)[0]:
            if record.get("kind") == "step":
                steps.append(record)
            elif record.get("kind") == "epoch" and record.get("epoch") is not None:
                self.log_epoch(k, record, steps)
                steps = []

    def describe(self, manifest: dict[str, Any], artifacts: list[Path]) -> None:
        """The parent's manifest tags and artifacts, once the manifest is written (beside repeat 0)."""
        def describe() -> None:
            tags = manifest_tags(manifest)
            self.tracker.set_tags(self.parent_id, tags)
            self._inherited.update({k: v for k, v in tags.items() if k.startswith(INHERITED_PREFIXES)})
            data = manifest.get("facets", {}).get("data") or {}
            # the recipe's data sets and a wrapped command's declared inputs (--input, fixed.inputs)
            self._data = [*(data.get("entries") or []), *(data.get("inputs") or [])]
            for run_id in [self.parent_id, *self.repeat_ids.values()]:  # the repeats started before it
                if run_id != self.parent_id:
                    self.tracker.set_tags(run_id, self._inherited)
                self.tracker.log_datasets(run_id, self._data, self._contexts)
            self.tracker.log_artifacts(self.parent_id, [p for p in artifacts if p.is_file()])
        self._queue(describe)

    def record(self, meta: dict[str, Any]) -> None:
        """What is known so far into run.json's ``mlflow`` section (the runner writes it)."""

        if self.parent_id is None or self.tracker is None:
            return
        meta["mlflow"] = {"tracking_uri": mlflow_store.safe_uri(self.uri), "experiment": self.experiment,
                          "experiment_id": self.tracker.experiment_id,
                          "parent_run_id": self.parent_id,
                          "repeat_run_ids": {str(k): v for k, v in sorted(dict(self.repeat_ids).items())}}

    def repeat_file(self, k: int) -> Path:
        """A file that exists once repeat *k*'s own MLflow run does (or could not be made), holding
        its ``run_id`` and ``experiment_id``: a wrapped script's ``import mlflow`` waits for it
        (``REPRO500_MLFLOW_READY``), and repro500's run-context provider reads it to give the
        script's runs their parent when they start (repro500.tracking.context)."""
        return self._scratch / f"repeat-{k}.json"

    def program_seed(self, seeds: dict[str, Any]) -> int | None:
        """The seed a wrapped command receives in a repeat with *seeds* (None for a trained workload)."""
        from repro500.capture.seeds import Seeds
        from repro500.workloads.command.recipe import child_seed

        if not self._is_command or not seeds:
            return None
        return child_seed(Seeds(**seeds))

    def start_repeat(self, k: int, seeds: dict[str, Any], run_id: str, params: dict[str, str],
                     started_ms: int | None = None) -> None:
        """Open repeat *k*'s run, begun now (or at *started_ms*), tagged with its seeds (``Seeds.as_dict()``)."""
        started_ms = started_ms or now_ms()
        tags = {**seed_tags(seeds, self.program_seed(seeds)), names.RUN_ID_TAG: run_id}

        def start() -> None:
            try:
                if self.error is None:  # everything after a failure would fail alike
                    self.repeat_ids[k] = self.tracker.start_repeat(k, {**self._inherited, **tags}, params=params,
                                                                   start_ms=started_ms)
                    self.tracker.log_datasets(self.repeat_ids[k], self._data, self._contexts)
            except BaseException as err:  # noqa: BLE001 - reported by check() on the main thread
                self.error = err
            finally:  # whatever happened, a script waiting for the file goes on
                self._announce(k)
        self._started.append(self._worker.submit(start))

    def _announce(self, k: int) -> None:
        made = self.repeat_ids.get(k) if self.error is None else None
        atomic.write_json(self.repeat_file(k), {"run_id": made, "experiment_id": self.tracker.experiment_id
                                                if made and self.tracker is not None else None})

    def wait_started(self, timeout_s: float = 120.0) -> None:
        """Until every repeat's run exists (its id goes into run.json), not for the uploads after."""
        from concurrent.futures import wait

        wait([self._connected, *self._started], timeout=timeout_s)

    def log_epoch(self, k: int, record: dict[str, Any], steps: list[dict[str, Any]]) -> None:
        self._queue(lambda: self.tracker.log_epoch(self.repeat_ids[k], record, steps))

    def end_repeat(self, k: int, summary: dict[str, Any], files: list[Path], status: str,
                   script_runs_of: str | None = None, ended_ms: int | None = None) -> None:
        """Close repeat *k*'s run, ended now (or at *ended_ms*); with *script_runs_of* (the repro500
        run id), nest the runs a wrapped script started in the repeat under it first."""
        ended_ms = ended_ms or now_ms()

        def end() -> None:
            mlflow_id = self.repeat_ids[k]
            try:
                if script_runs_of:
                    self.tracker.adopt_script_runs(script_runs_of, k, mlflow_id)
                self.tracker.end_repeat(mlflow_id, summary, files, status, end_ms=ended_ms)
                self._closed_repeats.add(k)
            except BaseException:
                # the repeat is complete on disk: whatever stopped the logging, MLflow must not keep
                # it RUNNING
                with suppress(Exception):
                    self.tracker.terminate(mlflow_id, status, end_ms=ended_ms)
                raise
        self._queue(end)

    def kill(self, k: int, reason: str) -> None:
        ended_ms = now_ms()

        def kill() -> None:
            if k in self.repeat_ids:
                self.tracker.kill(self.repeat_ids[k], reason, end_ms=ended_ms)
                self._closed_repeats.add(k)
        self._queue(kill)

    def conclude(self, run: Any, verdict: Any, design: dict[str, Any] | None) -> None:
        """The parent's last records: the verdict's figures as metrics and its statuses as tags
        (repro500.tracking.names), the data a command was seen reading as dataset inputs, the
        summary, verdict and inputs files, and the whole sealed run as one archive (``run/<run-id>.tar.gz``:
        ``repro500 verify mlflow:RUN_ID`` verifies it from the store alone)."""
        from repro500.verify.divergence import mlflow_records
        from repro500.verify.variance import design_tags, mlflow_metrics, mlflow_tags

        metrics, tags = verdict_metrics(verdict.to_dict())
        metrics.update(mlflow_metrics(verdict.variance))
        tags.update({**design_tags(design), **mlflow_tags(verdict.variance)})
        parted_at, parted = mlflow_records(getattr(verdict, "divergence", None))  # where same-seed repeats part
        metrics.update(parted_at)
        tags.update(parted)
        files = [run.file(n) for n in (layout.SUMMARY, layout.VERDICT, layout.INPUTS)]
        observed = list(run.inputs().get("observed") or [])
        view = names.glance_view([band.metric for band in verdict.bands])

        def conclude() -> None:
            self.tracker.log_metrics(self.parent_id, metrics, tags=tags)
            self.tracker.set_view(view)
            self.tracker.log_datasets(self.parent_id, observed, self._contexts)
            for k, run_id in self.repeat_ids.items():
                self.tracker.log_datasets(run_id, [e for e in observed if k in (e.get("repeats") or [])], self._contexts)
            self.tracker.log_artifacts(self.parent_id, [p for p in files if p.is_file()])
            self.tracker.log_sealed(self.parent_id, run.path)
        self._queue(conclude)

    def close(self, status: str, timeout_s: float | None = None, **logged: Any) -> None:
        """End the parent and wait until everything queued has landed (then :meth:`check`)."""
        import shutil

        if self.ended:
            return
        self.ended = True
        drained = interrupted = False
        try:  # from here on, a Ctrl-C still ends the parent (below)
            # no end time given: the parent ends when this, the last record, lands, and the run waits
            # for that (the drain), so its end is the run's end as its user saw it
            self._queue(lambda: self.tracker.end_parent(status, **logged))
            drained = self._worker.drain(timeout_s)
            if drained and self.error is not None:
                self._terminate_after_failure(status)
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            self._worker.stop()
            closing = getattr(self.tracker, "close", None)  # the MLflow process (tracking_process)
            if closing is not None:
                closing(timeout_s=10.0 if drained else 0)
            shutil.rmtree(self._scratch, ignore_errors=True)
            if interrupted:  # Ctrl-C while the last records were landing: the parent must not stay RUNNING
                with suppress(Exception):
                    self._terminate_after_failure("KILLED")
        self.check()

    def leave(self) -> None:
        """The head leaves its repeats to SLURM (--detach): everything queued lands, the parent and
        the repeats' runs stay RUNNING for the resume to end (it reopens them by the ids run.json
        holds).  The repeats' ready files stay: a task SLURM starts later still finds its own."""
        if self.ended:
            return
        self.ended = True
        try:
            self._worker.drain(None)
        finally:
            self._worker.stop()
            closing = getattr(self.tracker, "close", None)
            if closing is not None:
                closing(timeout_s=10.0)
        self.check()

    def _terminate_after_failure(self, status: str) -> None:
        """After a failure stopped the queue, no run may stay RUNNING: end what was started, best effort."""
        if self.tracker is None:
            return
        tracker = self.tracker
        if not getattr(tracker, "alive", True):  # the MLflow process died (killed): a new one ends the runs
            try:
                tracker = tracking_process.connect(self.experiment, self.uri, self.artifacts)
            except Exception:  # noqa: BLE001 - best effort: the failure itself is what check() reports
                return
        try:
            for k, mlflow_id in dict(self.repeat_ids).items():
                if k not in self._closed_repeats:
                    with suppress(Exception):
                        tracker.terminate(mlflow_id, "FAILED")
            if self.parent_id is not None:
                with suppress(Exception):
                    tracker.terminate(self.parent_id, "FAILED" if status == "FINISHED" else status)
        finally:
            if tracker is not self.tracker:
                tracker.close()
