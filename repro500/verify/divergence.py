"""Where two runs part: the first step, from the per-step records the runs already keep, and
which recorded difference is the likely cause.

The verdict compares the pairs determinism compares (same-seed repeats of a run) and, against a
reference run, each repeat with the reference repeat of its seed.  For each pair, in the order
things happened:

* every **step** record (``repeats/<k>/metrics.jsonl``, kind ``step``): the loss and every other
  per-step quantity that follows from the computation (``lr``, a loss scale, the bytes a
  compressor produced, ...); times, rates, memory and wall clock are the machine's, never compared
  (:func:`repro500.verify.determinism.machine_dependent`).  The first step whose quantities are not
  bitwise equal is where the runs part; the first whose difference exceeds :data:`REL_TOL`
  (relative, ``|a - b| / max(|a|, |b|)``) is where they have visibly separated;
* each epoch's **evaluation** (the epoch record's metrics) and **parameters** (``params.jsonl``),
  placed after the epoch's last step: identical steps with a different evaluation point at the
  evaluation, identical evaluations with different parameters at the epoch's last update;
* for a wrapped command, the numbers its regex metrics match on each line of its output, one
  series per metric, the n-th match standing for step n (its MLflow step metrics are in the
  MLflow store, not the run directory, and are not read here).

Nothing is claimed past the first divergence: after it everything may differ.  Where the runs
parted is then joined with what the records say differs between them (the one comparison of two
runs, :mod:`repro500.verify.compare`, of the pair), every result-relevant difference ranked by how
well it fits the shape of the divergence (the pair's seeds first, whatever the shape):

* at the very first step: the kernels (torch build, CPU ISA, thread counts, oneDNN/cuDNN
  choices, determinism flags), then the initialisation and the data;
* at the first step of a later epoch, every step before it identical: the data order or its
  augmentation's seeding;
* within training, after identical steps: a non-deterministic operator or an unseeded random
  source (the determinism setting, the code);
* in the evaluation only: the evaluation (its data, its evaluator, its batch size).

* every step, evaluation and parameter digest identical, the declared outputs (or the final
  parameter digests) not: what the runs wrote at their end, read as the exact replay reads it.

Only when the comparison finds no result-relevant difference is the answer "no recorded difference
explains it".
``repro500 locate`` goes further, to the operator (docs/verify.md, "Where two runs part"): the
replays are planned and run by :mod:`repro500.locate`; the cause of the operator they part at is
:func:`explain_operator`'s, here, beside the causes of the records.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.capture.seeds import pair_repeats, seed_key
from repro500.rundir import layout
from repro500.rundir.excluded import opened_run
from repro500.statuses import FOUND, SKIPPED
from repro500.tracking import names
from repro500.verify import compare as comparison
from repro500.verify.determinism import (
    locate_divergence,
    machine_dependent,
    read_params,
    seed_groups,
)
from repro500.verify.diff import is_result_relevant
from repro500.verify.rundir import RunData

# The stated relative tolerance: a float32 loss carries about 7 significant digits, and a
# difference in the last few of them is rounding that a different reduction order makes; 1e-3
# is four orders of magnitude above float32's epsilon (1.2e-7), so a difference beyond it is the
# runs having separated, not rounding.
REL_TOL = 1e-3
# fields of a step record that name it, and the machine's fields besides times and rates
_IDENTITY = frozenset({"kind", "repeat", "epoch", "step", "rank"})
_MACHINE = frozenset({"wall_s", "peak_memory_bytes", "backward_end"})
TAG, METRIC = names.DIVERGENCE_TAG, names.DIVERGENCE_METRIC  # the MLflow tag and metric (tracking/names owns them)

# What each shape of divergence points at, as patterns over "facet.key" of the recorded
# differences, most likely first.  A code change can do anything, so it comes last everywhere.
_KERNELS = ("recipe.mutable.threads", "environment.env.values.*_NUM_THREADS", "runtime.torch.num_threads",
            "runtime.torch.num_interop_threads", "environment.env.values.DNNL_*", "environment.env.values.ONEDNN_*",
            "environment.env.values.MKL_*", "environment.env.values.ATEN_*", "environment.env.values.KMP_*",
            "environment.env.values.OMP_*", "environment.env.values.CUBLAS*", "environment.env.values.NVIDIA_TF32*",
            "recipe.mutable.deterministic", "runtime.determinism.*",
            "environment.torch_build.*", "runtime.torch.*", "environment.distributions.torch",
            "environment.distributions.nvidia-*", "environment.distributions.triton*",
            "environment.distributions.numpy*", "hardware.cpu.flags", "hardware.cpu.model*", "hardware.cpu.vendor",
            "hardware.cpu.architecture", "hardware.cpu.usable_cpus", "hardware.cgroup.cpu_limit_cores",
            "hardware.gpus.*", "hardware.gpu_count", "hardware.gpu_driver.*", "distributed.*",
            "plan.precision", "plan.device", "plan.*", "recipe.mutable.micro_batch_size",
            "recipe.mutable.batch_size", "environment.env.values.TORCH*", "environment.env.values.PYTORCH_*",
            "environment.python.version", "environment.distributions.torchvision")
_INIT_AND_DATA = ("seeds.*", "data.*", "recipe.fixed.dataset.*", "recipe.fixed.model_options.*")
_DATA = ("seeds.loader", "seeds.*", "data.*", "recipe.fixed.dataset.*", "recipe.mutable.workers",
         "recipe.mutable.batch_size", "environment.env.values.PYTHONHASHSEED", "environment.python.version",
         "environment.distributions.numpy*", "environment.distributions.torchvision", "environment.distributions.torch")
_WITHIN = ("recipe.mutable.deterministic", "runtime.determinism.*",
           "environment.env.values.CUBLAS_WORKSPACE_CONFIG", "recipe.mutable.lr_schedule.*",
           "recipe.mutable.optimizer.*", "seeds.torch", "plan.compressor*", "recipe.mutable.sync.*")
_EVALUATION = ("data.*", "recipe.fixed.evaluate", "recipe.mutable.eval_batch_size", "recipe.fixed.dataset.eval*",
               "environment.distributions.torchmetrics*", "environment.distributions.pycocotools*",
               "environment.distributions.scipy*")
_CODE = ("experiment.source.*", "experiment.repro500.*", "experiment.workload.*", "code.commit", "code.diff*",
         "code.dirty")
# whatever the shape, different seeds explain a pair first: they change the initialisation, the
# data order and every random draw
_SEEDS = ("seeds.*",)
# the recorded quantity that parts says more than the step: a different lr at a step is the
# schedule's inputs (the peak rate, the schedule, the steps it spans: batch size, epochs, samples)
_QUANTITY = {"lr": ("recipe.mutable.optimizer.lr", "recipe.mutable.lr_schedule*", "recipe.mutable.batch_size",
                    "recipe.fixed.epochs", "recipe.fixed.dataset*", "data.*")}
SHAPES: dict[str, tuple[str, tuple[str, ...]]] = {
    # shape -> (what it points at, the recorded differences that fit, most likely first)
    "first step": ("the kernels (or the initialisation or the first batch)", _KERNELS + _INIT_AND_DATA + _CODE),
    "epoch boundary": ("the data order or its augmentation's seeding", _DATA + _CODE),
    # a changed sample parts the runs at the first step whose batch holds it: inside an epoch too
    "within training": ("a non-deterministic operator or an unseeded random source",
                        _WITHIN + ("data.*", "recipe.fixed.dataset*") + _KERNELS + _CODE),
    "evaluation": ("the evaluation", _EVALUATION + _KERNELS + _CODE),
    "last update": ("the epoch's last update (backward or optimizer)", _WITHIN + _KERNELS + _CODE),
    "length": ("one run stopping early (a non-finite loss, or the target reached sooner)", _WITHIN + _KERNELS + _CODE),
    "final state": ("what the runs wrote at their end (declared outputs or final parameters), every recorded step "
                    "and evaluation agreeing", _EVALUATION + _WITHIN + _KERNELS + _CODE),
}
NO_CAUSE = "no recorded difference explains it"
MAX_CAUSES = 50  # kept per pair in verdict.json; the explanation counts every one (repro500 diff lists them)


# ----- one repeat's records -------------------------------------------------------------------------
@dataclass
class Records:
    """What one repeat recorded, in the order it happened."""

    steps: list[dict[str, Any]] = field(default_factory=list)  # {step, epoch, values: {quantity: value}}
    evaluations: dict[int, dict[str, Any]] = field(default_factory=dict)  # epoch -> evaluation metrics
    params: list[dict[str, Any]] = field(default_factory=list)  # params.jsonl
    source: str = layout.METRICS

    @property
    def recorded(self) -> bool:
        return bool(self.steps or self.evaluations or self.params)


def compared(record: dict[str, Any]) -> dict[str, Any]:
    """The quantities of a step record that follow from the computation (not the machine's)."""
    return {key: value for key, value in record.items()
            if key not in _IDENTITY and key not in _MACHINE and not key.startswith("wire_")
            and not machine_dependent(key) and (value is None or isinstance(value, (int, float, bool)))}


def _index(value: Any) -> bool:
    """A step or epoch number as the trainer writes it (a record from elsewhere may hold anything)."""
    return isinstance(value, int) and not isinstance(value, bool)


def read_records(root: Path, k: int, recipe: dict[str, Any] | None = None) -> Records:
    """Repeat *k*'s records: the trainer's metrics.jsonl and params.jsonl, or a wrapped command's
    regex metrics line by line."""
    repeat = layout.RunDir(root).repeat(k)
    out = Records()
    lines, _ = layout.metric_records(repeat / layout.METRICS)
    for record in lines:
        epoch = record.get("epoch") if _index(record.get("epoch")) else None
        if record.get("kind") == "step" and _index(record.get("step")):
            out.steps.append({"step": record["step"], "epoch": epoch, "values": compared(record)})
        elif record.get("kind") == "epoch" and epoch is not None:
            metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
            out.evaluations[record["epoch"]] = {m: v for m, v in metrics.items() if not machine_dependent(m)}
    out.params = read_params(repeat / layout.PARAMS)
    if not out.steps and recipe and isinstance(recipe.get("metrics"), dict):
        out.steps, out.source = _command_series(repeat, recipe["metrics"])
    return out


def _command_series(repeat: Path, declared: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """A wrapped command's per-line matches of its regex metrics: the n-th match of each is step n."""
    series: dict[str, list[float]] = {}
    for name, decl in declared.items():
        if not isinstance(decl, dict) or not isinstance(decl.get("regex"), str):
            continue
        # RE2 (linear time): the pattern and the output are the run's, and a publisher's pattern
        # that backtracks would hang verify; one that RE2 refuses is a sentence (exit 4)
        pattern = untrusted.pattern(decl["regex"], f"{repeat.parent.parent / layout.RECIPE} metrics.{name}.regex")
        group: int | str = "value" if "value" in pattern.groupindex else 1
        if group == 1 and pattern.groups != 1:
            continue
        stream = layout.STDERR if decl.get("stream") == "stderr" else layout.STDOUT
        try:
            text = untrusted.read_text(repeat / stream, "a command's output", untrusted.MAX_LOG_BYTES)
        except (FileNotFoundError, OSError, ValueError):
            continue
        scale = decl.get("scale", 1.0)
        scale = scale if isinstance(scale, (int, float)) and not isinstance(scale, bool) else 1.0
        values = []
        for line in text.splitlines():
            for match in pattern.finditer(line[:untrusted.MAX_LINE_CHARS]):
                try:
                    values.append(float(match.group(group)) * scale)
                except (TypeError, ValueError):
                    continue
        if values:
            series[str(name)] = values
    longest = max((len(v) for v in series.values()), default=0)
    steps = [{"step": i + 1, "epoch": None,
              "values": {name: v[i] for name, v in series.items() if i < len(v)}} for i in range(longest)]
    return steps, "regex metrics of stdout/stderr, one match a step"


# ----- one pair ---------------------------------------------------------------------------------
def rel_diff(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return 0.0 if scale == 0 else abs(a - b) / scale


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class PairDivergence:
    """Where one pair of repeats parts, and what the records say of why."""

    label: str  # "repeats 0 and 1" | "repeat 0 and reference repeat 0"
    repeat: int
    other_repeat: int
    other: str  # "run" | "reference"
    seed: Any
    source: str
    steps_compared: int
    shape: str  # "none" | "first step" | "epoch boundary" | "within training" | "evaluation" | "last update" | "length" | "unrecorded"
    first_step: int | None = None
    first_epoch: int | None = None
    quantity: str | None = None
    value: Any = None
    other_value: Any = None
    abs_diff: float | None = None
    rel_diff: float | None = None
    first_step_beyond_tolerance: int | None = None
    rtol: float = REL_TOL
    evaluation_epoch: int | None = None
    params_epoch: Any = None
    params_tensor: str | None = None
    points_at: str | None = None
    causes: list[dict[str, Any]] = field(default_factory=list)
    explanation: str = ""
    detail: str = ""

    @property
    def diverged(self) -> bool:
        return self.shape not in ("none", "unrecorded")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _step_difference(va: dict[str, Any], vb: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """(quantity, a, b) of the first quantity whose values are not identical, loss first."""
    for name in sorted(set(va) | set(vb), key=lambda n: (n != "loss", n)):
        a, b = va.get(name), vb.get(name)
        if a != b:  # numbers as JSON gives them: 1 and 1.0 are the same value
            return name, a, b
    return None


def _beyond(va: dict[str, Any], vb: dict[str, Any], rtol: float) -> bool:
    for name in set(va) | set(vb):
        a, b = _number(va.get(name)), _number(vb.get(name))
        if a is None or b is None:
            if va.get(name) != vb.get(name):
                return True  # a value on one side only (a non-finite loss is recorded as null)
            continue
        if rel_diff(a, b) > rtol:
            return True
    return False


def _first_step(a: Records, b: Records, rtol: float) -> tuple[int, int, dict[str, Any] | None]:
    """(steps found identical, the last of them, the first step's difference or None)."""
    by_step_b = {s["step"]: s for s in b.steps}
    identical = last = 0
    for s in a.steps:
        other = by_step_b.get(s["step"])
        if other is None:
            break
        found = _step_difference(s["values"], other["values"])
        if found is None:
            identical, last = identical + 1, s["step"]
            continue
        name, va, vb = found
        fields: dict[str, Any] = {"first_step": s["step"], "first_epoch": s["epoch"], "quantity": name,
                                  "value": va, "other_value": vb}
        fa, fb = _number(va), _number(vb)
        if fa is not None and fb is not None:
            fields.update(abs_diff=abs(fa - fb), rel_diff=rel_diff(fa, fb))
        fields["first_step_beyond_tolerance"] = next(
            (t["step"] for t in a.steps if t["step"] >= s["step"] and t["step"] in by_step_b
             and _beyond(t["values"], by_step_b[t["step"]]["values"], rtol)), None)
        return identical, last, fields
    return identical, last, None


def _epoch_ends(a: Records, b: Records, last_compared: int, before: float,
                last_of_epoch: dict[int, int]) -> tuple[float, str, dict[str, Any]] | None:
    """An evaluation or an epoch's parameters that differ after identical steps and before *before*
    (an epoch's evaluation follows its last step, its parameter digest the evaluation)."""
    first = None
    for epoch in sorted(set(a.evaluations) & set(b.evaluations)):
        at = last_of_epoch.get(epoch, 0) + 0.5
        if at > before or last_of_epoch.get(epoch, 0) > last_compared:
            break
        if a.evaluations[epoch] != b.evaluations[epoch]:
            first = (at, "evaluation", {"evaluation_epoch": epoch})
            break
    epoch, tensor = locate_divergence(a.params, b.params)
    if epoch is not None:
        numbered = isinstance(epoch, int)
        at = (last_of_epoch.get(epoch, 0) if numbered else last_compared) + 0.6
        if at < (first[0] if first else before) and (not numbered or last_of_epoch.get(epoch, 0) <= last_compared):
            first = (at, "params", {"params_epoch": epoch, "params_tensor": tensor})
    return first


def compare(a: Records, b: Records, rtol: float = REL_TOL) -> dict[str, Any]:
    """The first divergence between two repeats' records, in the order things happened."""
    out: dict[str, Any] = {"steps_compared": 0, "shape": "none", "source": a.source}
    if not (a.recorded and b.recorded):
        out["shape"] = "unrecorded"
        return out
    first_of_epoch: dict[int, int] = {}
    last_of_epoch: dict[int, int] = {}
    for s in a.steps:
        if s["epoch"] is not None:
            first_of_epoch.setdefault(s["epoch"], s["step"])
            last_of_epoch[s["epoch"]] = s["step"]
    out["steps_compared"], last_compared, step = _first_step(a, b, rtol)
    first = (float(step["first_step"]), "step", step) if step else None
    first = _epoch_ends(a, b, last_compared, first[0] if first else math.inf, last_of_epoch) or first
    if first is None:
        if len(a.steps) != len(b.steps) and out["steps_compared"]:
            out.update(shape="length", first_step=out["steps_compared"] + 1)
        return out
    _, what, fields = first
    out.update(fields)
    if what != "step":
        out["shape"] = "evaluation" if what == "evaluation" else "last update"
    elif fields["first_step"] == a.steps[0]["step"]:
        out["shape"] = "first step"
    elif fields["first_epoch"] is not None and first_of_epoch.get(fields["first_epoch"]) == fields["first_step"]:
        out["shape"] = "epoch boundary"
    else:
        out["shape"] = "within training"
    return out


def final_state(mine: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """As the exact replay reads them: the declared outputs where both repeats declare some, else
    the final parameter digests where both record one.  ``{}`` when they agree (or say nothing)."""
    outputs = [d.get("outputs") if isinstance(d.get("outputs"), dict) else {} for d in (mine, theirs)]
    if outputs[0] and outputs[1] and outputs[0] != outputs[1]:
        names = sorted(n for n in set(outputs[0]) | set(outputs[1]) if outputs[0].get(n) != outputs[1].get(n))
        return {"shape": "final state", "quantity": "declared output(s) " + ", ".join(names),
                "value": outputs[0].get(names[0]), "other_value": outputs[1].get(names[0])}
    digests = mine.get("final_param_digest"), theirs.get("final_param_digest")
    if not (outputs[0] and outputs[1]) and all(digests) and digests[0] != digests[1]:
        return {"shape": "final state", "quantity": "final parameter digest", "value": digests[0],
                "other_value": digests[1]}
    return {}


def deltas(a: Records, b: Records, quantity: str = "loss") -> list[tuple[int, float]]:
    """(step, |a - b|) of one quantity at every step both recorded as a number (for the plot)."""
    by_step_b = {s["step"]: s["values"].get(quantity) for s in b.steps}
    out = []
    for s in a.steps:
        va, vb = _number(s["values"].get(quantity)), _number(by_step_b.get(s["step"]))
        if va is not None and vb is not None:
            out.append((s["step"], abs(va - vb)))
    return out


# ----- the recorded differences -----------------------------------------------------------------
def recorded_differences(run: RunData, other: RunData | None, reference_manifest: dict[str, Any] | None,
                         k: int, j: int) -> list[dict[str, Any]]:
    """What the records say differs between repeat *k* of *run* and repeat *j* of *other* (none
    when *other* is None: two repeats of one run differ in nothing recorded), as the one comparison
    of two runs (:func:`repro500.verify.compare.compare_runs`) finds it for that pair: the
    manifests, the recipes, the plan, the pair's own seeds, the lock, the declared outputs."""
    if other is None:
        return []
    try:
        found = comparison.compare_runs(run, other, repeat=k, other_repeat=j, manifest_b=reference_manifest)
    except Exception:  # noqa: BLE001 - context only: a broken comparison must not hide the verdict
        return []
    return found.rows()


def deterministic(run: RunData) -> bool:
    """Whether the run asked torch for deterministic algorithms (repro500 run --deterministic)."""
    return bool(((run.recipe or {}).get("mutable") or {}).get("deterministic") or (run.run or {}).get("deterministic"))


def _setting_note(*runs: RunData | None) -> str:
    """A setting both sides share is no difference, but says what torch was free to do."""
    shown = [r for r in runs if r is not None]
    trained = all(((r.recipe or {}).get("fixed") or {}).get("workload") != "command" for r in shown)
    if shown and trained and not all(deterministic(r) for r in shown):  # a command's own code picks its algorithms
        return "; torch was free to choose non-deterministic algorithms (the run was not --deterministic)"
    return ""


def rank_causes(shape: str, differences: list[dict[str, Any]], quantity: str | None = None) -> list[dict[str, Any]]:
    """Every result-relevant recorded difference, ordered by how well it fits the shape of the
    divergence: shapes rank, they never filter."""
    patterns = SHAPES[shape][1] if shape in SHAPES else ()
    return _fitting(differences, _QUANTITY.get(quantity or "", ()) + patterns)


def _fitting(differences: list[dict[str, Any]], patterns: tuple[str, ...]) -> list[dict[str, Any]]:
    """The result-relevant differences: the pair's seeds first, then by the first pattern matched
    (one that matches none after every one that does), then by impact."""

    def fit(d: dict[str, Any]) -> int:
        for rank, pattern in enumerate(_SEEDS + patterns):
            if fnmatch.fnmatchcase(str(d.get("key")), pattern):
                return rank
        return len(_SEEDS) + len(patterns)

    relevant = [d for d in differences if is_result_relevant(int(d.get("impact") or 0))]
    ranked = sorted(relevant, key=lambda d: (fit(d), -int(d.get("impact") or 0), str(d.get("key"))))
    return [dict(d, fits=fit(d) < len(_SEEDS) + len(patterns)) for d in ranked]


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def likely(cause: dict[str, Any]) -> str:
    return f"{cause['key']} ({_shown(cause['run'])} vs {_shown(cause['reference'])}: {cause['why']})"


def explain(shape: str, causes: list[dict[str, Any]], note: str = "") -> str:
    """In words: what the shape points at, and the first recorded difference; "no recorded
    difference explains it" only when the comparison found no result-relevant one."""
    return explain_points(SHAPES[shape][0], causes, note) if shape in SHAPES else ""


def explain_points(points: str, causes: list[dict[str, Any]], note: str = "") -> str:
    if not causes:
        return f"it points at {points}; {NO_CAUSE}{note}"
    more = f" (and {len(causes) - 1} more recorded difference(s))" if len(causes) > 1 else ""
    kind = "" if causes[0].get("fits", True) else ", though not of the kind the shape suggests"
    return f"it points at {points}; the likely cause{kind}: {likely(causes[0])}{more}"


def _describe(p: PairDivergence) -> str:
    if p.shape == "unrecorded":
        return f"{p.label}: no per-step records to compare"
    if p.shape == "none":
        return f"{p.label} agree bitwise at all {p.steps_compared} recorded steps, evaluations and parameters"
    if p.shape == "evaluation":
        where = f"in the evaluation of epoch {p.evaluation_epoch}, after {p.steps_compared} identical steps"
    elif p.shape == "last update":
        where = (f"in the parameters at the end of epoch {p.params_epoch} (first at {p.params_tensor}), after "
                 f"{p.steps_compared} identical steps and evaluations")
    elif p.shape == "length":
        where = f"after {p.steps_compared} identical steps: one run recorded no step {p.first_step}"
    elif p.shape == "final state":
        where = (f"in what they wrote at the end ({p.quantity}), after {p.steps_compared} identical steps, "
                 "evaluations and parameters")
    else:
        diff = (f" (|Δ| {p.abs_diff:.3g}, relative {p.rel_diff:.3g})" if p.abs_diff is not None else "")
        where = (f"at step {p.first_step}" + (f" (epoch {p.first_epoch})" if p.first_epoch is not None else "")
                 + f": {p.quantity} {p.value!r} vs {p.other_value!r}{diff}")
        beyond = p.first_step_beyond_tolerance
        where += (f"; beyond the relative tolerance {p.rtol:g} from step {beyond}" if beyond is not None
                  else f"; within the relative tolerance {p.rtol:g} at every compared step")
    return f"{p.label} part {where}"


def compare_pair(run: RunData, k: int, other: RunData | None, j: int, records_a: Records, records_b: Records,
                 reference_manifest: dict[str, Any] | None = None, rtol: float = REL_TOL) -> PairDivergence:
    seed = (run.repeats[k].get("seeds") or {}).get("torch")
    label = f"repeats {k} and {j}" if other is None else f"repeat {k} and reference repeat {j}"
    found = compare(records_a, records_b, rtol)
    if found["shape"] in ("none", "unrecorded"):
        found.update(final_state(run.repeats.get(k) or {}, (other or run).repeats.get(j) or {}))
    pair = PairDivergence(label=label, repeat=k, other_repeat=j, other="run" if other is None else "reference",
                          seed=seed, rtol=rtol, **found)
    if pair.diverged:
        pair.points_at = SHAPES[pair.shape][0]
        causes = rank_causes(pair.shape, recorded_differences(run, other, reference_manifest, k, j),
                             pair.quantity if pair.shape != "final state" else None)
        pair.explanation = explain(pair.shape, causes, _setting_note(run, other))  # counts them all
        pair.causes = causes[:MAX_CAUSES]
    pair.detail = _describe(pair) + (f"; {pair.explanation}" if pair.explanation else "")
    return pair


# ----- the verdict's section ----------------------------------------------------------------------
@dataclass
class DivergenceResult:
    status: str  # FOUND | NONE | SKIPPED
    reason: str
    rtol: float = REL_TOL
    pairs: list[PairDivergence] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # a reference was given and no repeat of the rerun received a reference repeat's seeds: the two
    # runs part from their first step by design, whatever the pairs within the rerun say
    seeds_differ: bool = False

    @property
    def first(self) -> PairDivergence | None:
        """The pair that parts first (by step), the one the headline names."""
        parted = [p for p in self.pairs if p.diverged]
        return min(parted, key=lambda p: (p.first_step or 10**12, p.label)) if parted else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["pairs"] = [p.to_dict() for p in self.pairs]
        first = self.first
        out["first_step"] = first.first_step if first else None
        return out


def pairs_within(run: RunData) -> list[tuple[int, int]]:
    """The same-seed pairs the determinism check compares: the first repeat of a group with each other."""
    groups, _, _ = seed_groups(run)
    return [(ks[0], k) for ks in groups.values() if len(ks) > 1 for k in ks[1:]]


@contextlib.contextmanager
def readable_root(reference: Any) -> Iterator[Path | None]:
    """Where a reference run's repeat files can be read: its directory, or a packed run or a
    publication unpacked again (the verdict reads a packed reference from a directory that is gone
    by the time this runs)."""
    run = getattr(reference, "run", None)
    if run is None:
        yield None
        return
    if Path(run.path).is_dir():
        yield Path(run.path)
        return

    with contextlib.ExitStack() as stack:
        root: Path | None = None
        with contextlib.suppress(Exception):  # the verdict already judged the reference; records are context
            root = stack.enter_context(opened_run(reference.path, "repro500-divergence-")).root
        yield root


def check(run: RunData, reference: Any = None, rtol: float = REL_TOL) -> DivergenceResult:
    """Where the pairs the verdict compares part (see the module docstring)."""
    result = DivergenceResult(status=SKIPPED, reason="", rtol=rtol)
    within = pairs_within(run)
    cache: dict[tuple[str, int], Records] = {}

    def records(root: Path, k: int, recipe: dict[str, Any] | None) -> Records:
        key = (str(root), k)
        if key not in cache:
            cache[key] = read_records(root, k, recipe)
        return cache[key]

    for k, j in within:
        result.pairs.append(compare_pair(run, k, None, j, records(run.path, k, run.recipe),
                                         records(run.path, j, run.recipe), rtol=rtol))
    ref_run = getattr(reference, "run", None)
    against = pair_repeats(run, ref_run)[0] if ref_run is not None else []
    if against:  # a packed reference is unpacked again only when some repeat shares a seed with it
        with readable_root(reference) as root:
            if root is None:
                result.notes.append("the reference's per-step records could not be read again: not compared")
            else:
                for k, j in against:
                    result.pairs.append(compare_pair(run, k, ref_run, j, records(run.path, k, run.recipe),
                                                     records(root, j, ref_run.recipe or run.recipe),
                                                     reference_manifest=reference.manifest, rtol=rtol))
    result.seeds_differ = ref_run is not None and not against and _both_seeded(run, ref_run)
    _judge(result)
    return result


# what "Where the runs part" says of a rerun whose seeds no reference repeat received
SEEDS_DIFFER = "the seeds differ, so the runs part from the first step by design"


def _both_seeded(run: RunData, reference: RunData) -> bool:
    """Whether both runs have a completed repeat that records its seeds (else there is no seed to differ)."""
    return all(any(seed_key(r.repeats[k]) is not None for k in r.completed) for r in (run, reference))


def _judge(result: DivergenceResult) -> None:
    """The status and reason of the pairs compared; where the seeds differ from the reference's, that
    is said first, and what the pairs within the rerun say follows as theirs."""
    if not result.pairs:
        result.reason = SEEDS_DIFFER if result.seeds_differ else (
            "no two repeats share a seed, and no reference repeat shares one: nothing to compare step "
            "by step (repro500 run --same-seed)")
        return
    unrecorded = [p for p in result.pairs if p.shape == "unrecorded"]
    first = result.first
    if len(unrecorded) == len(result.pairs):
        result.reason = "the repeats keep no per-step records: nothing to compare step by step"
    elif first is None:
        compared = len(result.pairs) - len(unrecorded)
        result.status = "NONE"
        result.reason = (f"{compared} pair(s) of same-seed repeats agree bitwise at every recorded step, evaluation, "
                         "parameter digest and declared output")
    else:
        result.status = FOUND
        result.reason = first.detail
    if unrecorded and len(unrecorded) < len(result.pairs):
        result.notes.append(f"{len(unrecorded)} pair(s) without per-step records were not compared")
    if result.seeds_differ:  # every pair compared lies within the rerun
        result.reason = f"{SEEDS_DIFFER}; within the rerun, {result.reason}"


def mlflow_records(section: DivergenceResult | None) -> tuple[dict[str, float], dict[str, str]]:
    """The parent run's metric (the first step where a pair parts) and tag (where, in words)."""
    if section is not None and section.seeds_differ and section.first is None:
        return {}, {TAG: "seeds differ from the reference"}
    if section is None or section.status == SKIPPED:
        return {}, {TAG: "not compared"} if section is not None else {}
    first = section.first
    if first is None:
        return {}, {TAG: "none"}
    if first.shape == "final state":
        return {}, {TAG: f"final state: {first.quantity} ({first.label})"}
    if first.shape in ("evaluation", "last update"):
        where = (f"evaluation of epoch {first.evaluation_epoch}" if first.shape == "evaluation"
                 else f"parameters at the end of epoch {first.params_epoch}")
        return {}, {TAG: f"{where} ({first.label})"}
    metrics = {METRIC: float(first.first_step)} if first.first_step is not None else {}
    return metrics, {TAG: f"step {first.first_step} ({first.label}; {first.shape})"}


# ----- repro500 locate: the cause of the first operator the replays part at (repro500.locate) --------
_OUTSIDE = {
    "(batch)": ("the data: the batch of this step differs before any operator ran", "epoch boundary"),
    "(initial state)": ("the initialisation: the model's initial parameters differ", "first step"),
    "(torch RNG state)": ("torch's random state at the start of the step: something outside the steps "
                          "(data loading, the evaluation) drew from it differently", "epoch boundary"),
}


def explain_operator(finding: dict[str, Any], run: RunData, k: int, other: RunData | None, j: int) -> dict[str, Any]:
    """What the first operator where the replays of repeat *k* of *run* and repeat *j* of *other*
    (None: of *run* too) part points at, and the recorded difference that fits: {kind, points_at,
    causes, explanation}."""
    differences = recorded_differences(run, other, other.provenance_manifest if other is not None else None, k, j)
    op = str(finding.get("op") or "")
    consistent = finding.get("self_consistent") or {}
    if not finding.get("found"):
        return {"kind": "none", "points_at": None, "causes": [], "explanation": ""}
    if finding.get("reason") == "not reproducible" or not all(v for v in consistent.values() if v is not None):
        kind = "non-deterministic"
        points = ("an unseeded random source: a random operator drawing from a generator the run's seeds do not "
                  "set" if finding.get("random_op") else
                  "a non-deterministic operator: two replays in one environment give it the same inputs and get "
                  "different outputs")
        patterns: tuple[str, ...] = _WITHIN
    elif op in _OUTSIDE:
        points, shape = _OUTSIDE[op]
        kind = "outside the operators"
        patterns = SHAPES[shape][1]
    elif finding.get("reason") == "different operator":
        kind = "different code path"
        points = (f"a different code path: one run calls {op}, the other {finding.get('other_op')} here (a "
                  "different torch build, library or code)")
        patterns = _KERNELS + _CODE
    elif finding.get("inputs_agree") is False:
        kind = "outside the operators"
        points = ("a tensor made outside the recorded operators (from Python or numpy values, not by a torch "
                  "operator) that differs between the runs")
        patterns = _WITHIN + _CODE
    else:
        kind = "kernels"
        points = "the kernels: the same inputs give a different output in the two environments"
        patterns = _KERNELS + _CODE
    causes = _fitting(differences, patterns)
    note = _setting_note(run, other)
    if kind == "non-deterministic" and causes:
        # one run that differs from itself: what differs between the runs is named, not blamed
        explanation = (f"it points at {points}; it differs from itself, so no difference between the runs is its "
                       f"cause{note} (recorded: {likely(causes[0])})")
    else:
        explanation = explain_points(points, causes, note)
    return {"kind": kind, "points_at": points, "causes": causes, "explanation": explanation}
