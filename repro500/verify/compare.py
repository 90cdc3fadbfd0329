"""One comparison of two runs: every recorded difference, ranked by impact, the same for every command.

``verify`` (its Provenance section and "where the runs part"), ``diff``, ``history``, ``locate``'s
cause and the report all ask :func:`compare_runs` (or :func:`compare_manifests` where only
manifests exist) and print what it returns, in its order, with its words.

What is compared, each as one section of the manifest diff (:mod:`repro500.verify.diff`, whose
:data:`~repro500.verify.diff.RULES` give every row its impact and reason):

* every manifest facet, with the inputs a wrapped command was seen to read (``inputs.json``) as
  the data facet's ``observed`` entries;
* the recipe as resolved (``recipe``: fixed, mutable, acceptance, plug-in options); a key an
  override set (``--set``, ``--params``) says so in its reason;
* the plan (``plan``: device, engine, precision, compressor, world size, nodes);
* the seeds: the runs' seed plans over the repeats both have, or a pair's own seeds;
* the environment lock's pins (``lock``), beside the versions the environment facet compares;
* the declared outputs (``outputs``) of the repeats paired by seed.

A section one side did not record (a published file has no lock, a bare manifest no recipe) is
left out, not called different.  The documented non-differences (``diff.NOT_DIFFERENCES``,
docs/verify.md "What is not a difference") are no rows at all.  A row is *result-relevant* iff
its impact reaches :data:`~repro500.verify.diff.RELEVANT_IMPACT`.
"""

from __future__ import annotations

import contextlib
import copy
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.capture.inputs import comparable
from repro500.capture.manifest import load_manifest
from repro500.capture.seeds import SEED_NAMES, pair_repeats
from repro500.errors import ReproError
from repro500.ext import specs
from repro500.rundir import layout
from repro500.verify import diff as manifest_diff
from repro500.verify import from_mlflow
from repro500.verify.diff import Difference, counted, is_result_relevant, relevance
from repro500.verify.rundir import load_run

# recipe keys that are no recorded difference: the number of repeats and the master seed (the
# seeds section compares the seeds themselves), the recipe's prose, and how values were set
# (said in the reason of the key they set)
_RECIPE_LEFT_OUT = ("repeats", "seed", "description", "overrides", "schema")
# the plan's keys, taken out of the recipe's mutable part (one row each, not two)
_PLAN_KEYS = ("device", "engine", "precision", "compressor", "nproc")


@dataclass
class Recorded:
    """What one side of a comparison recorded; None: not recorded (that section is not compared)."""

    manifest: Mapping[str, Any] | None
    recipe: Mapping[str, Any] | None = None
    run: Mapping[str, Any] | None = None  # run.json
    lock: Mapping[str, Any] | None = None  # environment.lock.json
    seeds: Mapping[str, Any] | None = None  # one repeat's own seeds (a pair), else the run's seed plan
    outputs: Mapping[str, Any] | None = None  # declared output -> digest


@dataclass
class Comparison:
    """Every difference between two runs, most result-relevant first."""

    differences: list[Difference] = field(default_factory=list)

    @property
    def relevant(self) -> list[Difference]:
        return [d for d in self.differences if is_result_relevant(d)]

    @property
    def first(self) -> Difference | None:
        return self.differences[0] if self.differences else None

    def counted(self) -> str:
        return counted(self.differences)

    def rows(self) -> list[dict[str, Any]]:
        """The differences as the verdict, divergence and history keep them."""
        return [row(d) for d in self.differences]


def key_of(d: Difference) -> str:
    return f"{d.facet}.{d.key}" if d.key else d.facet


def row(d: Difference) -> dict[str, Any]:
    return {"key": key_of(d), "facet": d.facet, "field": d.key, "run": d.a, "reference": d.b, "impact": d.impact,
            "why": d.reason, "relevance": relevance(d)}


def line(d: Difference, width: int = 60) -> str:
    """One difference in words, as every command prints it."""
    return (f"{key_of(d)}: {manifest_diff.short(d.a, width)} vs {manifest_diff.short(d.b, width)} "
            f"(impact {d.impact}, {relevance(d)}: {d.reason})")


# ----- the sections beside the manifest ---------------------------------------------------------------
def _recipe_section(recipe: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: copy.deepcopy(v) for k, v in recipe.items() if k not in _RECIPE_LEFT_OUT}
    mutable = out.get("mutable")
    if isinstance(mutable, Mapping):
        out["mutable"] = {k: v for k, v in mutable.items() if k not in _PLAN_KEYS}
    return out


def _plan_section(recipe: Mapping[str, Any] | None, run: Mapping[str, Any] | None) -> dict[str, Any]:
    mutable = (recipe or {}).get("mutable")
    mutable = mutable if isinstance(mutable, Mapping) else {}
    plan = {k: mutable.get(k) for k in _PLAN_KEYS if k in mutable}
    if "compressor" in plan:
        with contextlib.suppress(Exception):  # a bare name and its resolved spec are one compressor
            plan["compressor"] = specs.canonical(plan["compressor"])
    for key in ("world_size", "nnodes"):
        if isinstance(run, Mapping) and key in run:
            plan[key] = run[key]
    return plan


def _lock_section(lock: Mapping[str, Any]) -> dict[str, Any]:
    """The pins' sources: the versions are the environment facet's rows, and repro500's own entry is
    the tool that runs a reproduction (NOT_DIFFERENCES)."""
    dists = [{k: v for k, v in d.items() if k not in ("version", "requirement", "why")}
             for d in lock.get("distributions") or [] if isinstance(d, Mapping) and d.get("name") != manifest_diff._OWN]
    out: dict[str, Any] = {"distributions": dists}
    if isinstance(lock.get("platform"), Mapping):
        out["platform"] = {k: v for k, v in lock["platform"].items() if k in ("machine", "system", "libc")}
    return out


def _view(side: Recorded, other: Recorded) -> dict[str, Any]:
    """Side's manifest with the sections both sides recorded added as facets."""
    manifest = dict(side.manifest or {})
    facets = dict(manifest.get("facets") or {})
    if side.recipe is not None and other.recipe is not None:
        facets["recipe"] = _recipe_section(side.recipe)
        facets["plan"] = _plan_section(side.recipe, side.run)
    if side.lock is not None and other.lock is not None:
        facets["lock"] = _lock_section(side.lock)
    if side.seeds is not None and other.seeds is not None:
        facets["seeds"] = {name: side.seeds.get(name) for name in SEED_NAMES}
    if side.outputs and other.outputs:
        facets["outputs"] = dict(side.outputs)
    manifest["facets"] = facets
    return manifest


def _set_by(key: str, *recipes: Mapping[str, Any] | None) -> str | None:
    """The override (``--set KEY=...`` or a params file) that set a recipe key on either side."""
    if key.startswith("plan."):  # the plan's keys are the recipe's mutable ones
        key = f"recipe.mutable.{key[len('plan.'):]}"
    if not key.startswith("recipe."):
        return None
    inner = key[len("recipe."):]
    for recipe in recipes:
        overrides = (recipe or {}).get("overrides")
        for name in overrides if isinstance(overrides, Mapping) else ():
            short = inner.split(".", 1)[1] if inner.startswith(("fixed.", "mutable.")) else inner
            if short == name or short.startswith(f"{name}.") or inner == name:
                return str(name)
    return None


def compare(a: Recorded, b: Recorded) -> Comparison:
    """Every difference between what *a* and *b* recorded, in the one order (``diff.order``)."""
    diffs = manifest_diff.diff_manifests(_view(a, b), _view(b, a))
    changed = _versions_differ(a.manifest, b.manifest)
    out = []
    for d in diffs:
        if d.facet == "lock" and any(d.key == f"distributions.{n}" or d.key.startswith(f"distributions.{n}.")
                                     for n in changed):
            continue  # the same package's version row says it
        if d.facet in ("recipe", "plan"):
            by = _set_by(key_of(d), b.recipe, a.recipe)
            if by is not None:
                where = " in the open division" if d.key.startswith("fixed.") else ""
                d = Difference(d.facet, d.key, d.a, d.b, d.impact, f"{d.reason} (set with --set {by}=...{where})")
        out.append(d)
    out = _recipe_paths_moved(out)
    out.sort(key=manifest_diff.order)
    return Comparison(out)


def _recipe_paths_moved(diffs: list[Difference]) -> list[Difference]:
    """A recipe key that names a data path (``fixed.dataset.path``) whose bytes the data facet found
    moved (:func:`repro500.verify.diff.is_moved`) is that move, not another data set: its row is
    folded into the moved row, which then says which key named the new place (one row, not two)."""
    moved = {(_norm(d.a["path"]), _norm(d.b["path"])): i for i, d in enumerate(diffs) if manifest_diff.is_moved(d)}
    if not moved:
        return diffs
    out = list(diffs)
    folded = set()
    for i, d in enumerate(diffs):
        if d.facet != "recipe" or not (isinstance(d.a, str) and isinstance(d.b, str)):
            continue
        where = moved.get((_norm(d.a), _norm(d.b)))
        if where is None:
            continue
        m = out[where]
        by = d.reason[d.reason.index(" (set with"):] if " (set with" in d.reason else ""
        out[where] = Difference(m.facet, m.key, m.a, m.b, m.impact, f"{m.reason}; the recipe's {d.key} names it{by}")
        folded.add(i)
    return [d for i, d in enumerate(out) if i not in folded]


def _norm(path: str) -> str:
    return posixpath.normpath(path.replace("\\", "/"))


def _versions_differ(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> set[str]:
    """The packages whose installed version differs (or that one side lacks)."""
    def versions(m: Mapping[str, Any] | None) -> dict[str, Any]:
        env = ((m or {}).get("facets") or {}).get("environment")
        dists = env.get("distributions") if isinstance(env, Mapping) else None
        return {d.get("name"): d.get("version") for d in dists or [] if isinstance(d, Mapping)}

    va, vb = versions(a), versions(b)
    return {str(n) for n in set(va) | set(vb) if va.get(n, manifest_diff._MISSING) != vb.get(n, manifest_diff._MISSING)}


def compare_manifests(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> Comparison:
    """Two manifests alone (``repro500 diff`` of manifest files)."""
    return compare(Recorded(manifest=a or {}), Recorded(manifest=b or {}))


# ----- runs -------------------------------------------------------------------------------------------
def _lock(run: Any) -> Mapping[str, Any] | None:
    path = getattr(run, "path", None)
    if path is None:
        return None
    try:
        lock = layout.read_optional_json(path / layout.LOCK)
    except Exception:  # noqa: BLE001 - an unreadable lock is not compared; integrity judges the files
        return None
    return lock or None


def _outputs(run: Any, k: int | None) -> dict[str, Any] | None:
    if k is None or k not in run.repeats:
        return None
    outputs = run.repeats[k].get("outputs")
    return dict(outputs) if isinstance(outputs, Mapping) and outputs else None


def recorded(run: Any, repeat: int | None = None, *, manifest: Mapping[str, Any] | None = None,
             pair: bool = False) -> Recorded:
    """What a run (:class:`repro500.verify.rundir.RunData`) recorded; with *pair*, repeat
    *repeat*'s own seeds instead of the run's seed plan."""
    seeds = None
    if pair and repeat is not None and repeat in run.repeats:
        seeds = run.repeats[repeat].get("seeds") or {}
    return Recorded(manifest=manifest if manifest is not None else run.provenance_manifest, recipe=run.recipe,
                    run=run.run, lock=_lock(run), seeds=seeds, outputs=_outputs(run, repeat))


def compare_runs(a: Any, b: Any, *, repeat: int | None = None, other_repeat: int | None = None,
                 manifest_b: Mapping[str, Any] | None = None) -> Comparison:
    """Run *a* against run *b* (both RunData); with *repeat* and *other_repeat*, the pair of those
    repeats (their own seeds and outputs).  Without them the repeats paired by seed give the
    declared outputs.  *manifest_b* stands for b's manifest where the caller holds the one to
    compare (a reference's, with what its command read)."""
    pair = repeat is not None and other_repeat is not None
    if not pair:
        pairs, _ = pair_repeats(a, b)
        differing = [(k, j) for k, j in pairs if _outputs(a, k) != _outputs(b, j)]
        repeat, other_repeat = (differing or pairs or [(None, None)])[0]
    side_a = recorded(a, repeat, pair=pair)
    side_b = recorded(b, other_repeat, manifest=manifest_b, pair=pair)
    return compare(side_a, side_b)


def compare_reference(run: Any, reference: Any) -> Comparison:
    """A run against what ``--against`` gave (:class:`repro500.verify.reference.Reference`): its run
    where it has one, else its manifest and, for a published file, its recipe."""
    ref_run = getattr(reference, "run", None) or getattr(reference, "packed", None)
    manifest = getattr(reference, "manifest", None)
    if ref_run is not None:
        return compare_runs(run, ref_run, manifest_b=manifest)
    benchmark = getattr(reference, "benchmark", None)
    recipe = getattr(benchmark, "recipe", None) if benchmark is not None else None
    mine = recorded(run)
    if not isinstance(recipe, Mapping) or "mutable" not in recipe:
        mine.recipe = None  # the reference says no resolved recipe: that section is not compared
    return compare(mine, Recorded(manifest=manifest or {}, recipe=recipe if mine.recipe is not None else None))


def _manifest_view(path: Path) -> dict[str, Any]:
    """A run directory's manifest with what its command was seen to read (inputs.json), or a bare
    manifest file's; InvalidInput (exit 4) for one that is missing, corrupt or edited after capture."""
    observed = layout.read_inputs(path / layout.INPUTS) if path.is_dir() else {}
    return comparable(load_manifest(path), observed) or {}


def _run_or_none(path: Path) -> Any:
    """The run a directory holds, or None: a bare manifest, or a directory with a manifest alone."""
    if not path.is_dir():
        return None
    try:
        return load_run(path)
    except ReproError:
        return None


def compare_sources(a: str, b: str) -> Comparison:
    """``repro500 diff A B``: two runs compared as every command compares them, or two manifests
    where either is not a run.  A and B are run directories, manifest files, or runs in the MLflow
    store (``mlflow:ID``, ``runs:/ID``), whose sealed runs are downloaded for the comparison.  The
    manifests are read first: a missing, corrupt or edited one is InvalidInput before anything else."""
    with contextlib.ExitStack() as stack:
        paths = [stack.enter_context(from_mlflow.opened(ref)) if from_mlflow.is_reference(ref) else Path(ref)
                 for ref in (a, b)]
        manifests = _manifest_view(paths[0]), _manifest_view(paths[1])
        runs = _run_or_none(paths[0]), _run_or_none(paths[1])
        if runs[0] is not None and runs[1] is not None:
            return compare_runs(runs[0], runs[1], manifest_b=manifests[1])
        return compare_manifests(*manifests)

