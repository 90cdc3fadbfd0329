"""One name per quantity in MLflow: the keys repro500 logs, and how they follow the run directory's.

A quantity keeps its name from the epoch to the repeat to the parent (docs/contracts.md, "MLflow
names"): the evaluation's ``accuracy`` is ``accuracy`` in each epoch's record and in the repeat's
``summary.json``, so it is ``accuracy`` on the repeat's MLflow run too (a history by step, its last
point the repeat's outcome); across repeats it becomes ``accuracy_mean``, ``accuracy_ci_low``, ...
on the parent, the keys of the DVC metrics file (``accuracy.mean``) with the dots as underscores.
Per-step training records, whose keys (``loss``, ``lr``, ``step_time_s``) would otherwise collide
with the evaluation's ``loss`` or the repeat's ``compression_ratio``, are ``train/<key>``: MLflow's
charts group them in a section of their own.

Every metric of a repeat's run is stepped by the global training step, so one chart's x-axis means
one thing; ``epoch`` is a metric too (its value at the step that ended the epoch).
"""

from __future__ import annotations

import re
from typing import Any

from repro500.rundir.dvcmetrics import verdict_metrics as dvc_view

# MLflow's UI (3.x) picks an experiment's page by this tag; without it, it guesses, and an experiment
# with no traces opens on the GenAI overview instead of the runs table. MLflow exports no constant
# for it (its UI's ExperimentKind enum holds the values); "custom_model_development" is the runs table.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
# The tags repro500's run-context provider (repro500.tracking.context) puts on every run a wrapped
# script starts inside a repeat, from the variables the repeat's environment carries.
RUN_ID_ENV, REPEAT_ENV = "REPRO500_RUN_ID", "REPRO500_REPEAT"
# a file that exists once the repeat's own run does, holding {"run_id", "experiment_id"} (runner/track.py)
READY_ENV = "REPRO500_MLFLOW_READY"
STEP_PREFIX = "train/"
EPOCH_METRIC = "epoch"
# repro500's own tags (docs/contracts.md, "MLflow"): one owner, as MLflow's mlflow_tags.py holds its own.
# On the parent run (runner/track.py):
RUN_ID_TAG = "repro500.run_id"
RUN_DIR_TAG = "repro500.run_dir"  # absolute: how `--against history:EXPERIMENT` finds the run's files
RECIPE_TAG = "repro500.recipe"
WORKLOAD_TAG = "repro500.workload"
WORLD_SIZE_TAG = "repro500.world_size"
ENGINE_TAG = "repro500.engine"
COMPRESSOR_TAG = "repro500.compressor"
OPEN_DIVISION_TAG = "repro500.open_division"
DETERMINISTIC_TAG = "repro500.deterministic"
REPEATS_TAG = "repro500.repeats"
MANIFEST_DIGEST_TAG = "repro500.manifest_digest"
DIRTY_TAG = "repro500.dirty"
GPU_MODEL_TAG = "repro500.gpu_model"
DESIGN_TAG = "repro500.design"  # and repro500.design.<key>: a sequential or factorial design
# the DVC experiment a run is (`dvc exp run` gives its stages DVC_EXP_NAME and DVC_EXP_BASELINE_REV),
# as DVC spelt it: the run id repro500 init's stage derives from it may be normalised (runner/dvcexp.py)
DVC_EXPERIMENT_TAG = "repro500.dvc.experiment"
DVC_BASELINE_TAG = "repro500.dvc.baseline_rev"
SEALED_TAG = "repro500.sealed"  # why the sealed run is not among the parent's artifacts, where it is not
# On each repeat's run:
REPEAT_TAG = "repro500.repeat"
# the seeds named for what received them (runner/track.py seed_tags): the one a wrapped command
# gets ({seed}, $REPRO500_SEED) and torch's; a bare "repro500.seed" said neither
PROGRAM_SEED_TAG = "repro500.seed.program"
TORCH_SEED_TAG = "repro500.seed.torch"
STATUS_TAG = "repro500.status"
ERROR_TAG = "repro500.error"
FINAL_PARAM_DIGEST_TAG = "repro500.final_param_digest"
# On every run a wrapped script starts inside a repeat (the run-context provider, tracking/context.py):
SCRIPT_TAG = "repro500.script"  # "true": a run the script started, not one of repro500's own
REPEAT_RUN_TAG = "repro500.repeat_run_id"  # the repeat's own MLflow run: the way back from any experiment
PARENT_TAG = "mlflow.parentRunId"  # MLflow's UI nests a run under this one, within one experiment
VERDICT_TAG = "repro500.verdict"
# What a reader of the runs table wants first, named plainly: the verdict's status (as VERDICT_TAG,
# which filters and `history:` read), and a view of the experiment that shows it beside the headline
# metrics, their bound and margin (glance_view). MLflow's UI (3.x) shows only Run Name, Created,
# Dataset, Duration, Source and Models until a reader picks columns, and opens a view kept as the
# experiment tag mlflow.sharedViewState.<key> when its address carries viewStateShareKey=<key>.
PLAIN_VERDICT_TAG = "verdict"
VIEW_KEY = "repro500"
VIEW_TAG = "mlflow.sharedViewState." + VIEW_KEY
VIEW_PARAM = "viewStateShareKey=" + VIEW_KEY
HEADLINE_METRICS = 3  # the acceptance metrics a view shows, at most
DIVERGENCE_TAG = VERDICT_TAG + ".divergence"  # where same-seed repeats (or a rerun and its reference) part
DIVERGENCE_METRIC = "divergence_first_step"  # on the parent: the first step at which they part
# On every repeat run logged under these names (runs logged before have `final_<name>` outcomes),
# saying so in words; runs logged before it was named so carry LEGACY_NAMES_TAG = "1".
NAMES_TAG, NAMES_VERSION = "repro500.metric_names", "each metric under its own name (v1)"
LEGACY_NAMES_TAG = "repro500.mlflow_names"
# The keys of a repeat's run that only a history has (the steps', the epochs'), besides the
# evaluation's, which the repeat's outcome shares: `verify --check-tracking` tells the outcome by them.
EPOCH_PREFIX = "epoch_"  # the epoch's own figures: epoch_train_time_s, epoch_energy_j, ... (system.epochs)
SAMPLING_PREFIX = "sampling_"
_WIRE_PER_RANK = re.compile(r"wire_bytes_(sent|received)_per_step_rank\d+")


def step_metric(key: str) -> str:
    """The MLflow key of a step record's field (``loss`` -> ``train/loss``)."""
    return STEP_PREFIX + key


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_history(key: str) -> bool:
    """Whether a repeat run's metric *key* is a step's or an epoch's only, never the repeat's outcome."""
    return (key == EPOCH_METRIC or key.startswith((STEP_PREFIX, EPOCH_PREFIX, SAMPLING_PREFIX))
            or _WIRE_PER_RANK.fullmatch(key) is not None)


def glance_view(headline: list[str]) -> dict[str, Any]:
    """The runs table's columns for a reader (MLflow's shared view state): how long each run took, the
    data it read, its verdict, then per headline metric its value on each repeat, its mean across
    repeats, and the band's bound and margin on the parent (the names verdict_metrics gives)."""
    def column(kind: str, key: str) -> str:
        return f"{kind}.`{key}`"  # MLflow's UI's canonical column key

    columns = [column("attributes", "Duration"), column("attributes", "Dataset"), column("tags", PLAIN_VERDICT_TAG)]
    for name in headline[:HEADLINE_METRICS]:
        columns += [column("metrics", key) for key in (name, f"{name}_mean", f"{name}_band_bound", f"{name}_band_margin")]
    return {"selectedColumns": columns}


def verdict_metrics(doc: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """The verdict's numbers as the parent's metrics and its statuses as tags.

    Built from the DVC view (:func:`repro500.rundir.dvcmetrics.verdict_metrics`), so both tools
    carry the same figures under the same names: ``accuracy.ci_low`` there is ``accuracy_ci_low``
    here, ``accuracy.band.bound`` is ``accuracy_band_bound``.  A status is a tag:
    ``repro500.verdict`` (and plainly ``verdict``) for the verdict, ``repro500.verdict.<dotted key>``
    for one of its parts (``repro500.verdict.accuracy.band.status``)."""
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}

    def walk(path: list[str], value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk([*path, str(key)], inner)
        elif is_number(value):
            metrics["_".join(path)] = float(value)
        elif isinstance(value, str):
            tags[VERDICT_TAG if path == ["status"] else ".".join([VERDICT_TAG, *path])] = value

    walk([], dvc_view(doc))
    if VERDICT_TAG in tags:
        tags[PLAIN_VERDICT_TAG] = tags[VERDICT_TAG]
    return metrics, tags
