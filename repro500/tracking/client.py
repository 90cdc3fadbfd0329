"""MLflow tracking: one parent run per ``repro500 run``, one nested run per repeat.

Uses ``MlflowClient`` with explicit run ids rather than MLflow's fluent API, so that nested runs,
resumed runs and runs fed from another process (distributed engines) need no global state.
MLflow derives git tags from ``sys.argv[0]``, which is the console script here, so repro500 sets
``mlflow.source.git.*`` itself (docs/contracts.md, "MLflow").  Everything logged goes through
:func:`repro500.redact.scrub` first: no secret reaches a tracking server.  Where the store is and
whether it can be used is :mod:`repro500.tracking.store`'s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from repro500.errors import ReproError
from repro500.redact import redact_text, scrub
from repro500.rundir import archive as archives
from repro500.rundir.archive import packed_files
from repro500.statuses import REPEAT_KILLED
from repro500.tracking import store as mlflow_store
from repro500.tracking.names import (
    EPOCH_METRIC,
    ERROR_TAG,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    FINAL_PARAM_DIGEST_TAG,
    NAMES_TAG,
    NAMES_VERSION,
    PARENT_TAG,
    REPEAT_RUN_TAG,
    REPEAT_TAG,
    RUN_ID_TAG,
    SCRIPT_TAG,
    SEALED_TAG,
    STATUS_TAG,
    VIEW_TAG,
    is_number,
    step_metric,
)

# MLflow caps: 6000 characters per param value, 8000 per tag, 100 params/tags and 1000 metrics per batch
PARAM_MAX_CHARS = 6000
TAG_MAX_CHARS = 8000
BATCH_PARAMS = 100
BATCH_METRICS = 1000
UPLOADS_AT_ONCE = 4  # artifact uploads in flight per call (requests to a server: latency, not bandwidth)

# Every numeric field of a step record in metrics.jsonl (docs/contracts.md), so the per-step
# history in MLflow is the file's.
STEP_METRIC_KEYS = (
    "loss", "lr", "step_time_s", "time_data_s", "time_forward_s", "time_backward_s", "time_comm_s",
    "time_comm_wait_s", "time_compress_s", "time_decompress_s", "time_optimizer_s", "peak_memory_bytes",
    "bytes_sent", "bytes_received", "dense_bytes_sent", "compression_ratio",
)


SEALED_PATH = "run"  # the parent's artifact folder holding the sealed run as one archive


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class Tracker:
    """Logs one ``repro500 run`` to MLflow."""

    def __init__(self, experiment: str, uri: str | None = None, artifacts: str | None = None) -> None:
        from mlflow.tracking import MlflowClient

        mlflow_store.quiet()
        self.uri = uri or mlflow_store.tracking_uri()
        self.artifacts = artifacts or mlflow_store.default_artifacts(self.uri)
        mlflow_store.open_store(self.uri, self.artifacts)
        self.client = MlflowClient(self.uri)
        self.notes: list[str] = []  # warnings for the user, shown by the run between repeats (runner/track.py)
        self.experiment_id = self._experiment(experiment, explicit=artifacts is not None)
        self._local_artifacts = _is_local(self.client.get_experiment(self.experiment_id).artifact_location)
        self.parent_id: str | None = None
        # per repeat run: the last global step logged, the evaluation at it, the last timestamp
        # (the repeat's outcome lands at that step, after the history: MLflow's "latest" value)
        self._last: dict[str, tuple[int, dict[str, float], int]] = {}

    def _experiment(self, name: str, explicit: bool) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found:
            if explicit and found.artifact_location.rstrip("/") != mlflow_store.artifact_uri(self.artifacts):
                self.notes.append(f"MLflow experiment {name!r} keeps its artifacts in {found.artifact_location} "
                                  f"(fixed when it was created); --artifacts applies to new experiments only")
            return self._kind(found)
        try:
            return self.client.create_experiment(name, artifact_location=self.artifacts,
                                                 tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except MlflowException:
            # Another process created it between the lookup and the creation.
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return self._kind(found)

    def _kind(self, experiment: Any) -> str:
        """Tag an experiment made before repro500 tagged them (or by someone else), so MLflow's UI
        opens it on its runs table; a kind already set is the owner's choice and stays."""
        from mlflow.exceptions import MlflowException

        if EXPERIMENT_KIND_TAG not in experiment.tags:
            try:
                self.client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            except MlflowException as err:  # a page layout is no reason to refuse logging the run
                self.notes.append(f"MLflow experiment {experiment.name!r} could not be tagged "
                                  f"{EXPERIMENT_KIND_TAG}={EXPERIMENT_KIND} ({err.message}); its UI page may "
                                  f"open on the traces overview: choose its runs tab")
        return experiment.experiment_id

    # ----- parent ---------------------------------------------------------------------------
    # A time given here (``start_ms``, ``end_ms``: epoch milliseconds) is when it happened in the run;
    # without one, MLflow takes the moment the call lands, which is late: the calls are queued and
    # answered by a process of lower priority (runner/track.py, tracking/process.py), so on a busy
    # machine a 48 s run showed a duration of 1 s and a start at its end.
    def start_parent(self, name: str, params: dict[str, str], tags: dict[str, str], start_ms: int | None = None) -> str:
        run = self.client.create_run(self.experiment_id, start_time=start_ms, run_name=name, tags=self._tags(tags))
        self.parent_id = run.info.run_id
        self.log_params(self.parent_id, params)
        return self.parent_id

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param


        items = [Param(k[:250], str(v)[:PARAM_MAX_CHARS]) for k, v in sorted(scrub(params).items())]
        for chunk in _chunks(items, BATCH_PARAMS):
            self.client.log_batch(run_id, params=chunk)

    def resume_parent(self, parent_id: str) -> None:
        self.parent_id = parent_id
        self.client.update_run(parent_id, status="RUNNING")

    def end_parent(self, status: str, metrics: dict[str, float] | None = None, tags: dict[str, str] | None = None,
                   end_ms: int | None = None) -> None:
        if self.parent_id is None:
            return
        if metrics or tags:
            self.log_metrics(self.parent_id, metrics or {}, tags=tags)
        self.client.set_terminated(self.parent_id, status=status, end_time=end_ms)

    # ----- repeats --------------------------------------------------------------------------
    def start_repeat(self, repeat: int, tags: dict[str, str], params: dict[str, str] | None = None,
                     start_ms: int | None = None) -> str:
        run_tags = {PARENT_TAG: self.parent_id or "", **tags, REPEAT_TAG: str(repeat),
                    NAMES_TAG: NAMES_VERSION}
        # unique across the store and readable in the runs table: the parent's name is the run's id
        name = f"{tags.get(RUN_ID_TAG) or 'run'}-repeat-{repeat}"
        run = self.client.create_run(self.experiment_id, start_time=start_ms, run_name=name, tags=self._tags(run_tags))
        if params:  # the recipe on every repeat too: repeats and reruns compare side by side in the UI
            self.log_params(run.info.run_id, params)
        return run.info.run_id

    def log_epoch(self, run_id: str, epoch_record: dict[str, Any], step_records: list[dict[str, Any]]) -> None:
        """One epoch: its steps as ``train/<key>`` at their global step; the evaluation under the
        metrics' own names, the epoch's figures and ``epoch`` itself at the step that ended it
        (repro500.tracking.names)."""
        from mlflow.entities import Metric

        last_step, _, last_ms = self._last.get(run_id, (0, {}, 0))
        now = max(int(time.time() * 1000), last_ms + 1)  # later than anything before: MLflow's "latest"
        metrics: list[Any] = []
        for rec in step_records:
            for key in STEP_METRIC_KEYS:
                value = rec.get(key)
                if is_number(value):
                    metrics.append(Metric(step_metric(key), float(value), now, int(rec["step"])))
        step = max([last_step, *(int(r["step"]) for r in step_records)])
        evaluation = {k: float(v) for k, v in (epoch_record.get("metrics") or {}).items() if is_number(v)}
        at_end: dict[str, float] = {**evaluation, EPOCH_METRIC: float(epoch_record["epoch"]),
                                    "epoch_train_time_s": float(epoch_record.get("train_time_s") or 0.0)}
        at_end.update(epoch_record.get("system") or {})  # joules, utilization, data wait (system.epochs)
        sampling = epoch_record.get("sampling") or {}  # workloads/sampling.py: was the epoch's draw representative?
        at_end.update({key: float(value) for key, value in (
            ("sampling_duplicated", sampling.get("duplicated")),
            ("sampling_p_value", (sampling.get("balance") or {}).get("p_value"))) if is_number(value)})
        wire = epoch_record.get("wire")  # measured TCP bytes of every rank (distributed runs)
        if wire and wire.get("steps"):
            for direction in ("sent", "received"):
                for rank, total in enumerate(wire[f"bytes_{direction}"]):
                    at_end[f"wire_bytes_{direction}_per_step_rank{rank}"] = total / wire["steps"]
        metrics += [Metric(key, float(value), now, step) for key, value in at_end.items()]
        for chunk in _chunks(metrics, BATCH_METRICS):
            self.client.log_batch(run_id, metrics=chunk)
        self._last[run_id] = (step, evaluation, now)

    def end_repeat(self, run_id: str, summary: dict[str, Any], files: Iterable[Path], status: str,
                   end_ms: int | None = None) -> None:
        """The repeat's outcome (its summary's numbers) under their own names at its last step,
        after its history, so they are the run's latest values; those the last evaluation already
        logged with the same value are not logged twice."""
        from mlflow.entities import Metric

        outcome = {k: float(v) for k, v in (summary.get("metrics") or {}).items() if is_number(v)}
        step, evaluation, last_ms = self._last.pop(run_id, (0, {}, 0))
        now = max(int(time.time() * 1000), last_ms + 1)
        items = [Metric(k, v, now, step) for k, v in outcome.items() if evaluation.get(k) != v]
        self._batch(run_id, items, {STATUS_TAG: summary.get("status", "unknown"),
                                    FINAL_PARAM_DIGEST_TAG: summary.get("final_param_digest") or ""})
        self.log_artifacts(run_id, files)
        self.client.set_terminated(run_id, status=status, end_time=end_ms)

    def log_datasets(self, run_id: str, entries: list[dict[str, Any]], contexts: dict[str, str]) -> None:
        """The data a run read, as MLflow dataset inputs (the runs table's Dataset column): named by
        file, the digest the DVC-compatible md5 of the manifest or ``inputs.json``, the source its
        path; *contexts* maps a path to ``training``/``evaluation`` (else ``input``)."""
        import json

        from mlflow.entities import Dataset, DatasetInput, InputTag


        inputs = []
        for entry in entries:
            path, md5 = entry.get("path"), entry.get("md5")
            if not path or not md5:
                continue
            profile = json.dumps({k: entry[k] for k in ("size", "nfiles", "kind") if entry.get(k) is not None})
            shown = redact_text(str(path))  # a path can carry a token (a signed URL's query)
            dataset = Dataset(name=Path(shown).name or shown, digest=str(md5)[:36], source_type="local",
                              source=shown, profile=profile)
            inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", contexts.get(path, "input"))]))
        if inputs:
            self.client.log_inputs(run_id, datasets=inputs)

    def adopt_script_runs(self, run_id: str, repeat: int, repeat_run_id: str) -> list[str]:
        """The fallback for the runs a wrapped script started in repeat *repeat* that the run-context
        provider could not link when they started (repro500.tracking.context: a run made before the
        repeat's own run existed, or by a process that does not load the provider, or outside
        ``mlflow.start_run``): give each the tags it lacks, ``repro500.repeat_run_id`` and, where it
        shares the repeat's experiment and has no parent of its own, ``mlflow.parentRunId`` (the
        UI nests within one experiment only).  Nothing is overwritten.  Returns the runs' ids."""
        from mlflow.entities import RunTag

        found = script_runs(self.client, run_id, repeat)
        for run in found:
            tags = []
            if REPEAT_RUN_TAG not in run.data.tags:
                tags.append(RunTag(REPEAT_RUN_TAG, repeat_run_id))
            if run.info.experiment_id == self.experiment_id and PARENT_TAG not in run.data.tags:
                tags.append(RunTag(PARENT_TAG, repeat_run_id))
            if tags:
                self.client.log_batch(run.info.run_id, tags=tags)
        return [run.info.run_id for run in found]

    def log_sealed(self, run_id: str, run_dir: Path) -> None:
        """The sealed run directory as one archive (``repro500 pack``'s), artifact ``run/<run-id>.tar.gz``:
        with it the store alone holds a run ``repro500 verify`` can check (docs/contracts.md, "MLflow
        names").  A run larger than ``REPRO500_MLFLOW_SEALED_MAX_MB`` (heavy outputs: checkpoints)
        is not copied into the store a second time; the tag ``repro500.sealed`` says why."""
        import tempfile


        limit_mb = mlflow_store.sealed_limit_mb()
        try:
            size = sum((Path(run_dir) / rel).stat().st_size for rel in packed_files(Path(run_dir)))
            if size > limit_mb * 2**20:
                self.set_tags(run_id, {SEALED_TAG: f"not logged: the run holds {size / 2**20:,.0f} MiB, over "
                                                   f"{mlflow_store.SEALED_MAX_ENV}={limit_mb:g}; publish or pack it instead"})
                return
            with tempfile.TemporaryDirectory(prefix="repro500-sealed-") as tmp:
                packed = archives.pack(run_dir, tmp)
                self.client.log_artifact(run_id, str(packed), artifact_path=SEALED_PATH)
        except (ReproError, OSError) as err:  # the run is complete on disk: say why the store lacks it
            self.set_tags(run_id, {SEALED_TAG: f"not logged: {err}"})

    def set_view(self, state: dict[str, Any]) -> None:
        """The experiment's reader view (names.glance_view), which ``repro500 ui``'s address opens."""
        import json

        self.client.set_experiment_tag(self.experiment_id, VIEW_TAG, json.dumps(state, sort_keys=True))

    def terminate(self, run_id: str, status: str, end_ms: int | None = None) -> None:
        self.client.set_terminated(run_id, status=status, end_time=end_ms)

    def kill(self, run_id: str, reason: str, end_ms: int | None = None) -> None:
        self.set_tags(run_id, {STATUS_TAG: REPEAT_KILLED, ERROR_TAG: reason})
        self.client.set_terminated(run_id, status="KILLED", end_time=end_ms)

    # ----- plumbing -------------------------------------------------------------------------
    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0,
                    tags: dict[str, str] | None = None) -> None:
        """*metrics* at *step* and, in the same requests, *tags*."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._batch(run_id, [Metric(k, float(v), now, step) for k, v in metrics.items() if v is not None], tags or {})

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        self._batch(run_id, [], tags)

    def _batch(self, run_id: str, metrics: list[Any], tags: dict[str, str]) -> None:
        """Metrics and tags in as few ``log_batch`` requests as MLflow's limits allow (each request
        is a round trip to a tracking server, and a transaction)."""
        from mlflow.entities import RunTag

        tag_items = [RunTag(k, v) for k, v in self._tags(tags).items()]
        metric_chunks = list(_chunks(metrics, BATCH_METRICS))
        tag_chunks = list(_chunks(tag_items, BATCH_PARAMS))
        for i in range(max(len(metric_chunks), len(tag_chunks))):
            self.client.log_batch(run_id, metrics=metric_chunks[i] if i < len(metric_chunks) else [],
                                  tags=tag_chunks[i] if i < len(tag_chunks) else [])

    def log_artifacts(self, run_id: str, files: Iterable[Path]) -> None:
        """Log files as artifacts, several uploads at once to a remote artifact store (each is a
        request of its own), one after another to a local one; a text file holding a secret is
        logged as a redacted copy."""
        from concurrent.futures import ThreadPoolExecutor

        def upload(path: Path) -> None:
            with redacted_copy(path) as clean:
                self.client.log_artifact(run_id, str(clean))

        paths = [Path(p) for p in files if Path(p).is_file()]
        # Into a local directory a copy takes a millisecond, and four threads contending for the
        # GIL and the store's lookups took 55 ms for a repeat's four files (15-20 ms in turn):
        # on the path from a run's last repeat to its exit.
        if len(paths) <= 1 or self._local_artifacts:
            for path in paths:
                upload(path)
            return
        with ThreadPoolExecutor(max_workers=min(UPLOADS_AT_ONCE, len(paths)),
                                thread_name_prefix="repro500-upload") as pool:
            for done in [pool.submit(upload, path) for path in paths]:
                done.result()  # the first failure is the call's

    @staticmethod
    def _tags(tags: dict[str, str]) -> dict[str, str]:
        clean = scrub({k: "" if v is None else str(v) for k, v in tags.items()})
        return {k[:250]: str(v)[:TAG_MAX_CHARS] for k, v in clean.items()}


def _is_local(location: str | None) -> bool:
    """Whether an artifact location is a directory of this machine (a path or a ``file:`` URI)."""
    from urllib.parse import urlparse

    return urlparse(location or "").scheme in ("", "file")


def script_runs(client: Any, run_id: str, repeat: int) -> list[Any]:
    """The MLflow runs a wrapped script started during one repeat, in any experiment of the store,
    oldest first: those the run-context provider tagged (repro500.tracking.context)."""
    from mlflow.entities import ViewType

    def quoted(value: str) -> str:
        return "'" + value.replace("'", "\\'") + "'"

    ids, token = [], None
    while True:
        page = client.search_experiments(view_type=ViewType.ALL, max_results=1000, page_token=token)
        ids += [e.experiment_id for e in page]
        token = page.token
        if not token:
            break
    query = (f"tags.`{RUN_ID_TAG}` = {quoted(run_id)} and tags.`{REPEAT_TAG}` = {quoted(str(repeat))} "
             f"and tags.`{SCRIPT_TAG}` = 'true'")
    runs: list[Any] = []
    for start in range(0, len(ids), 100):  # a store's search takes a bounded list of experiments
        token = None
        while True:
            page = client.search_runs(ids[start:start + 100], query, run_view_type=ViewType.ALL,
                                      max_results=1000, page_token=token)
            runs += list(page)
            token = page.token
            if not token:
                break
    return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))


# Artifacts read as text and redacted before they leave the machine; others are logged as they are.
TEXT_ARTIFACT_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".txt", ".log", ".diff", ".patch", ".md",
                          ".csv", ".tsv", ".html", ".cfg", ".ini", ".toml", ".py", ".sh", ".out", ".err")


@contextlib.contextmanager
def redacted_copy(path: Path) -> Iterator[Path]:
    """*path* itself, or a redacted copy of the same name in a temporary directory when the text
    file holds something :func:`repro500.redact.redact_text` removes (a secret value, a token)."""
    import tempfile


    if path.suffix.lower() not in TEXT_ARTIFACT_SUFFIXES:
        yield path
        return
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        yield path
        return
    clean = redact_text(text)
    if clean == text:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="repro500-artifact-") as tmp:
        copy = Path(tmp) / path.name
        copy.write_text(clean, encoding="utf-8")
        yield copy
