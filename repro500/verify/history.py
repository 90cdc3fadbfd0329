"""References from history: the earlier runs of the same recipe on the same system.

``repro500 verify RUN --against history:SOURCE`` and ``repro500 history SOURCE METRIC`` read the
runs a SOURCE holds: a directory of run directories (``runs/``), the parent runs of an MLflow
experiment (SOURCE is its name), or the parent runs in any experiment that match an MLflow search
filter (``mlflow:FILTER``, e.g. ``mlflow:tags.`repro500.recipe` = 'quickstart'``); each MLflow
parent run records its run directory (tag ``repro500.run_dir``).  A run is part
of RUN's reference when (ReFrame keeps references per system and programming environment; this
is the same scoping, read from the manifests):

* its files match its SHA256SUMS (a tampered run is no reference) and a repeat completed;
* it measured the same benchmark (verify/reference.py, ``benchmark_difference``: the same fixed
  keys, whatever set them) and ran the same recipe: ``recipe.yaml`` equal but for ``repeats``,
  ``seed``, ``acceptance``, its description and the record of which keys were overridden (the
  resolved values are compared, not how they were set);
* it ran on the same system (:func:`system_key`): the hardware facet's CPU and GPUs and memory,
  the environment's Python and torch/CUDA, and the run's engine and world size;
* it was created before RUN (or, made in the same second, had finished by then).

The newest :data:`WINDOW` such runs are the reference.  Their repeats are pooled, unless the runs
differ among themselves more than repeats do (one-way ANOVA at alpha), when each run's mean is
one observation: pooling then would understate the spread a new run meets.
"""

from __future__ import annotations

import math
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro500.digest import canonical_digest
from repro500.errors import EXIT_INCONCLUSIVE, InvalidInput, ReproError, UsageError
from repro500.rundir import archive, layout
from repro500.statuses import FAIL, INCONCLUSIVE, PASS
from repro500.tracking import names
from repro500.tracking import store as mlflow_store
from repro500.verify import from_mlflow, integrity
from repro500.verify.diff import flatten
from repro500.verify.reference import (
    Reference,
    benchmark_difference,
    benchmark_of_run,
    repeat_field,
)
from repro500.verify.rundir import RunData

PREFIX = "history:"
MLFLOW_FILTER = "mlflow:"  # history:mlflow:FILTER searches every experiment of the store with MLflow's syntax
WINDOW = 10  # the newest matching runs that make a reference: old enough history is another system
# recipe keys that do not change what a run measures; ``overrides`` and ``open_division`` record
# how the resolved values were set (``-n 5`` is recorded as an override of repeats), which the
# resolved fixed and mutable parts already say
RECIPE_KEYS_IGNORED = ("repeats", "seed", "acceptance", "description", "overrides", "open_division")


class NoHistory(ReproError):
    """A history with no earlier run of the recipe on this system: nothing to decide yet (exit 3)."""

    exit_code = EXIT_INCONCLUSIVE


@dataclass
class Entry:
    """One earlier run of a history."""

    path: Path
    run: RunData

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def created(self) -> str:
        return str((self.run.run or {}).get("created_utc") or (self.run.manifest or {}).get("created_utc") or "")

    @property
    def recipe_name(self) -> str:
        return str((self.run.recipe or {}).get("name") or self.run.summary.get("recipe_name") or "?")

    def mean(self, metric: str) -> float | None:
        values = self.run.values(metric)
        return sum(values) / len(values) if values else None


def is_history(against: Any) -> bool:
    return against is not None and str(against).startswith(PREFIX)


def system_key(run: RunData, environment: bool = True) -> dict[str, Any]:
    """What makes two runs' figures comparable, as ``facet.key -> value`` (docs/verify.md).

    ``environment=False`` leaves out Python and torch/CUDA: ``repro500 history`` follows one
    machine across software updates, to show where an update moved a metric."""
    facets = (run.manifest or {}).get("facets") or {}
    hardware = facets.get("hardware") or {}
    cpu = hardware.get("cpu") if isinstance(hardware.get("cpu"), dict) else {}
    gpus = [g.get("name") or g.get("model") for g in hardware.get("gpus") or [] if isinstance(g, dict)]
    memory = (hardware.get("memory") or {}).get("total_bytes")
    env = facets.get("environment") or {}
    # a manifest is what a run wrote (or someone else's edit, sealed again): a field of another shape is data
    python = env.get("python") if isinstance(env.get("python"), dict) else {"version": env.get("python")}
    python = str(python.get("version") or "")
    torch_build = env.get("torch_build") if isinstance(env.get("torch_build"), dict) else {}
    meta = run.run or {}
    key = {
        "hardware.cpu.model": cpu.get("model"), "hardware.cpu.cores": cpu.get("cores"),
        "hardware.cpu.sockets": cpu.get("sockets"), "hardware.gpus": ", ".join(sorted(map(str, gpus))) or "none",
        # the figure the OS reports moves by a few MB between boots: whole GiB
        "hardware.memory_gib": round(memory / 2**30) if isinstance(memory, (int, float)) else None,
        "run.engine": meta.get("engine"), "run.world_size": meta.get("world_size"),
        "run.deterministic": meta.get("deterministic"),  # other kernels: other numbers and speed
    }
    if environment:
        key.update({"environment.python": ".".join(python.split(".")[:2]) or None,
                    "environment.torch": torch_build.get("version"), "environment.cuda": torch_build.get("cuda")})
    return key


def recipe_key(run: RunData) -> str:
    recipe = {k: v for k, v in (run.recipe or {}).items() if k not in RECIPE_KEYS_IGNORED}
    return canonical_digest({"recipe": recipe})


def recipe_difference(a: RunData, b: RunData) -> str | None:
    """The first recipe key in which two runs differ, ``None`` when they ran the same recipe."""
    flat_a = flatten({k: v for k, v in (a.recipe or {}).items() if k not in RECIPE_KEYS_IGNORED})
    flat_b = flatten({k: v for k, v in (b.recipe or {}).items() if k not in RECIPE_KEYS_IGNORED})
    for key in sorted(set(flat_a) | set(flat_b)):
        if flat_a.get(key) != flat_b.get(key):
            return f"recipe {key} is {flat_b.get(key)!r}, not {flat_a.get(key)!r}"
    return None


def system_difference(a: RunData, b: RunData) -> str | None:
    """The first system key in which ``b`` differs from ``a``, ``None`` on the same system."""
    key_a, key_b = system_key(a), system_key(b)
    for key, value in key_a.items():
        if key_b.get(key) != value:
            return f"another system: {key} is {key_b.get(key)!r}, not {value!r}"
    return None


# ----- finding the runs -------------------------------------------------------------------------------
def locate(spec: str, downloads: Path | None = None) -> tuple[list[Path], list[dict[str, str]]]:
    """The run directories SOURCE names, and the runs it names that cannot be read (with why).

    With *downloads* (a directory the caller removes when done), an MLflow parent whose run
    directory is not here, or holds another run now, is read from the sealed run the store keeps
    (as ``verify mlflow:RUN_ID`` reads it); without, such a run is left out and said so."""
    if spec.startswith(MLFLOW_FILTER):
        return _from_mlflow(spec, downloads)
    source = Path(spec)
    if source.is_dir():
        if (source / layout.RUN_JSON).is_file() or (source / layout.SUMS_NAME).is_file():
            raise InvalidInput(f"history:{spec} is one run directory: give the directory that holds the runs "
                               f"(e.g. history:{source.parent}) or an MLflow experiment's name")
        return sorted(p for p in source.iterdir() if p.is_dir() and (p / layout.SUMS_NAME).is_file()), []
    return _from_mlflow(spec, downloads)


def _from_mlflow(spec: str, downloads: Path | None = None) -> tuple[list[Path], list[dict[str, str]]]:
    """The parent runs of an MLflow experiment (SOURCE is its name), or of every experiment in the
    store that match an MLflow search filter (SOURCE is ``mlflow:FILTER``)."""
    uri = mlflow_store.tracking_uri()
    db = mlflow_store.sqlite_path(uri)
    where = mlflow_store.safe_uri(uri)
    query = spec[len(MLFLOW_FILTER):].strip() if spec.startswith(MLFLOW_FILTER) else None
    if query is not None and not query:
        raise UsageError(f"history:{spec} names no filter: give MLflow's search syntax, e.g. "
                         f"history:mlflow:\"tags.`repro500.recipe` = 'quickstart'\"")
    missing = (f"history:{spec}: there is no directory {spec!r}, and no MLflow experiment of that name in {where}; "
               f"give a directory of runs (history:runs), an experiment's name or history:mlflow:FILTER "
               f"(MLFLOW_TRACKING_URI selects the store)")
    if query is not None:
        missing = f"history:{spec}: there is no MLflow store at {where} to search (MLFLOW_TRACKING_URI selects it)"
    if db is not None and not db.is_file():  # reading history never creates a store
        raise InvalidInput(missing)
    mlflow_store.check_reachable()
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    if query is None:
        experiment = client.get_experiment_by_name(spec)
        if experiment is None:
            raise InvalidInput(missing)
        ids = [experiment.experiment_id]
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    try:
        found_runs = client.search_runs(ids, query or "", max_results=5000) if ids else []
    except MlflowException as err:
        first = str(err.message if hasattr(err, "message") else err).strip().splitlines()[0]
        raise UsageError(f"history:{spec}: MLflow cannot search with that filter ({first}); see MLflow's search "
                         f"syntax, e.g. tags.`repro500.recipe` = 'quickstart' and params.batch_size = '64'") from None
    paths, skipped = [], []
    for found in found_runs:
        tags = found.data.tags
        if names.RUN_ID_TAG not in tags or names.PARENT_TAG in tags:
            continue  # a repeat's nested run, or a run repro500 did not make
        run_dir = tags.get(names.RUN_DIR_TAG)
        if run_dir and _holds(Path(run_dir), tags.get(names.MANIFEST_DIGEST_TAG)):
            paths.append(Path(run_dir))
            continue
        where = (f"its run directory {run_dir} is not here" if run_dir and not Path(run_dir, layout.SUMS_NAME).is_file()
                 else f"its run directory {run_dir} holds another run now" if run_dir
                 else "its MLflow run records no run directory")
        if downloads is None:
            skipped.append({"run": tags[names.RUN_ID_TAG], "why": where})
            continue
        try:  # the sealed run the parent holds, checked against its SHA256SUMS as any packed run is
            paths.append(_sealed(found.info.run_id, downloads / found.info.run_id))
        except InvalidInput as err:
            skipped.append({"run": tags[names.RUN_ID_TAG], "why": f"{where}, and the store's copy cannot be read ({err})"})
    return sorted(set(paths)), skipped


def _holds(run_dir: Path, digest: str | None) -> bool:
    """Whether *run_dir* is still the run an MLflow parent recorded: sealed, with the manifest
    whose digest the parent was tagged with (a later run of the same id may have replaced it)."""
    if not (run_dir / layout.SUMS_NAME).is_file():
        return False
    if not digest:
        return True  # a parent logged before the manifest's digest was tagged: the directory is all there is
    try:
        manifest = layout.read_json(run_dir / layout.MANIFEST, "the run's manifest")
    except InvalidInput:
        return True  # unreadable: load() says why, as for a run directory named directly
    recorded = manifest.get("digest")
    return not isinstance(recorded, dict) or recorded.get("value") == digest


def _sealed(parent_id: str, dest: Path) -> Path:
    """The run directory of the sealed run MLflow parent *parent_id* holds, unpacked under *dest*."""
    packed = from_mlflow.download(f"{from_mlflow.PREFIXES[0]}{parent_id}", dest / "download")
    return archive.unpack(packed, dest / "run")


def load(paths: list[Path], skipped: list[dict[str, str]]) -> list[Entry]:
    """Every run of ``paths`` whose integrity checks pass, oldest first; the others go to ``skipped``."""
    entries = []
    for path in paths:
        try:
            check, run = integrity.check_run(path, label="history run", deep=False)
        except InvalidInput as err:
            skipped.append({"run": path.name, "why": str(err)})
            continue
        if run is None or not check.ok:
            skipped.append({"run": path.name, "why": "; ".join(check.problems[:1]) or "unreadable"})
        elif not run.completed:
            skipped.append({"run": path.name, "why": "no repeat completed"})
        else:
            entries.append(Entry(path=path, run=run))
    # finished_utc breaks a tie of runs made in the same second (the timestamps' resolution)
    return sorted(entries, key=lambda e: (e.created, str((e.run.run or {}).get("finished_utc") or ""), e.run_id))


# ----- the reference -----------------------------------------------------------------------------------
def reference(spec: str, run: RunData, alpha: float) -> Reference:
    """RUN's reference from the history SOURCE (``spec`` without the prefix)."""
    if not spec:
        raise InvalidInput("--against history: names no history: give history:DIR (a directory of runs) or "
                           "history:EXPERIMENT (an MLflow experiment)")
    with tempfile.TemporaryDirectory(prefix="repro500-history-") as downloads:  # runs the store alone keeps
        return _reference(spec, run, alpha, *locate(spec, Path(downloads)))


def _reference(spec: str, run: RunData, alpha: float, paths: list[Path], skipped: list[dict[str, str]]) -> Reference:
    here = run.path.resolve()
    paths = [p for p in paths if p.resolve() != here]
    matched: list[Entry] = []
    for entry in load(paths, skipped):
        why = _why_not(entry, run)
        if why:
            skipped.append({"run": entry.run_id, "why": why})
        else:
            matched.append(entry)
    matched = matched[-WINDOW:]
    if not matched:
        seen = f"{len(paths)} run(s) there, none of them comparable" if paths else "no run there"
        reasons = "; ".join(f"{s['run']}: {s['why']}" for s in skipped[:3])
        raise NoHistory(f"history:{spec} has no earlier run of recipe {_name(run)!r} on this system ({seen}"
                        f"{': ' + reasons if reasons else ''}); run it here first, then verify against the history")
    values, pooling = pooled(matched, run.metric_names(), alpha)
    latest = matched[-1].run
    ref = Reference(kind="history", path=f"{PREFIX}{spec}",
                    label=f"history:{spec} ({len(matched)} earlier run(s) on this system)", values=values,
                    manifest=latest.provenance_manifest,
                    epochs_to_quality=_pooled_field(matched, "epochs_to_quality"),
                    time_to_quality_s=_pooled_field(matched, "time_to_quality_s"))
    ref.history = {
        "source": spec, "window": WINDOW, "runs": [e.run_id for e in matched],
        "latest": latest.run_id, "pooling": pooling, "system": system_key(run),
        "skipped": skipped,
    }
    return ref


def _name(run: RunData) -> str:
    return str((run.recipe or {}).get("name") or run.summary.get("recipe_name") or "?")


def _why_not(entry: Entry, run: RunData) -> str | None:
    if entry.run_id == run.run_id:
        return "the run being verified"
    began = str((run.run or {}).get("created_utc") or "")
    if entry.created and began and not _before(entry, began):
        return f"created after the run being verified ({entry.created}, not before {began})"
    other = benchmark_difference(benchmark_of_run(entry.run), benchmark_of_run(run))
    if other:
        return f"another benchmark: {other}"
    if recipe_key(entry.run) != recipe_key(run):
        return recipe_difference(run, entry.run) or "another recipe"
    return system_difference(run, entry.run)


def _before(entry: Entry, began: str) -> bool:
    """Whether ``entry`` ran before a run created at ``began``.  The timestamps have one-second
    resolution, so a short run made in the same second counts as earlier only if it had also
    finished by then (the same second: a run cannot finish before a later one is created)."""
    if entry.created != began:
        return entry.created < began
    finished = str((entry.run.run or {}).get("finished_utc") or "")
    return bool(finished) and finished <= began


def pooled(entries: list[Entry], metrics: list[str], alpha: float) -> tuple[dict[str, list[float]], dict[str, str]]:
    """metric -> reference values, and how each was formed (``repeats`` or ``run means`` and why)."""
    from scipy import stats as sps

    values: dict[str, list[float]] = {}
    how: dict[str, str] = {}
    for metric in metrics:
        groups = [e.run.values(metric) for e in entries]
        groups = [g for g in groups if g]
        if not groups:
            continue
        flat = [v for g in groups for v in g]
        how[metric] = f"{len(flat)} repeats of {len(groups)} run(s), pooled"
        values[metric] = flat
        if len(groups) >= 2 and all(len(g) >= 2 for g in groups):
            with warnings.catch_warnings():  # constant groups: a NaN p-value, handled below
                warnings.simplefilter("ignore", RuntimeWarning)
                p = float(sps.f_oneway(*groups).pvalue)
            if math.isfinite(p) and p < alpha:
                values[metric] = [sum(g) / len(g) for g in groups]
                how[metric] = (f"means of {len(groups)} runs (the runs differ among themselves more than their "
                               f"repeats do: one-way ANOVA p = {p:.2g})")
    return values, how


def _pooled_field(entries: list[Entry], name: str) -> list[float]:
    return [v for e in entries for v in repeat_field(e.run, name)]


# ----- regression, improvement or equivalent -------------------------------------------------------------
# Performance figures compared by default, with their good direction; a margin of RELATIVE_MARGIN
# of the history's mean unless --margin names one.
PERFORMANCE = {"throughput_samples_per_s": "higher", "time_to_quality_s": "lower"}
RELATIVE_MARGIN = 0.05
LOWER_IS_BETTER_WORDS = ("loss", "error", "latency", "time")
CHANGE_OUTCOME = {"regression": FAIL, "inconclusive": INCONCLUSIVE, "equivalent": PASS, "improvement": PASS}


def direction_of(metric: str, run: RunData) -> str:
    """The metric's good direction: the acceptance criterion's, else the known performance
    figures', else lower for names of losses, errors and times, higher otherwise."""
    for criterion in run.acceptance:
        if criterion.metric == metric:
            return criterion.direction
    if metric in PERFORMANCE:
        return PERFORMANCE[metric]
    lower = any(word in metric for word in LOWER_IS_BETTER_WORDS) or metric.endswith("_s")
    return "lower" if lower else "higher"


def compare(run: RunData, ref: Reference, alpha: float, margins: dict[str, float] | None) -> list[Any]:
    """Per metric, whether RUN is a regression, an improvement or equivalent to the history.

    The equivalence test decides on the (1 - 2 alpha) interval of run - history: inside +-margin
    is *equivalent*; entirely beyond the margin on the bad side a *regression*, on the good side an
    *improvement*; straddling an edge *inconclusive*.  A change smaller than the margin is
    equivalent by design: the margin says what difference matters.
    """
    from repro500.verify import equivalence

    margins = dict(margins or {})
    unknown = sorted(n for n in margins if not (ref.values.get(n) and run.values(n)))
    if unknown:
        shared = ", ".join(n for n in run.metric_names() if ref.values.get(n)) or "none"
        raise UsageError(f"--margin names {unknown[0]!r}, which the run and its history do not both report "
                         f"(shared: {shared})")
    chosen: dict[str, tuple[float, str]] = {}
    for criterion in run.acceptance:
        if criterion.tolerance > 0:
            chosen[criterion.metric] = (criterion.tolerance, "acceptance tolerance")
    for metric in PERFORMANCE:
        reference_values = ref.values.get(metric) or []
        mean = abs(sum(reference_values) / len(reference_values)) if reference_values else 0.0
        if mean > 0 and run.values(metric):
            chosen[metric] = (RELATIVE_MARGIN * mean, f"{RELATIVE_MARGIN:.0%} of the history's mean")
    chosen.update({name: (value, "--margin") for name, value in margins.items()})
    results = []
    for name, (margin, source) in chosen.items():
        if not (ref.values.get(name) and run.values(name)):
            continue
        direction = direction_of(name, run)
        res = equivalence.compare_values(name, run.values(name), ref.values[name], margin, alpha,
                                         direction=direction, margin_source=source, reference_kind="history")
        res.change = change_of(res.status, res.tost.get("diff"), direction)
        res.reason = f"{res.change}: {res.reason}"
        results.append(res)
    if not results:
        raise UsageError("nothing to compare with the history: the run has no acceptance tolerance and reports "
                         "no throughput or time-to-quality; pass --margin METRIC=DELTA")
    if run.unsuccessful:  # as against any reference: the repeats that completed cannot vouch for the rest
        for res in results:
            if res.change in ("equivalent", "improvement"):
                equivalence._block_reproduced(res, run.unsuccessful)
                res.change = "inconclusive"
    return results


def change_of(status: str, diff: float | None, direction: str) -> str:
    from repro500.verify.equivalence import NOT_REPRODUCED, REPRODUCED

    if status == REPRODUCED:
        return "equivalent"
    if status == NOT_REPRODUCED and diff is not None:
        better = diff > 0 if direction == "higher" else diff < 0
        return "improvement" if better else "regression"
    return "inconclusive"
