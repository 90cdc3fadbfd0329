"""What a run is verified against: another run directory, a packed bundle, or published numbers.

A reference run (directory or bundle) is itself integrity-checked: comparing with a
tampered reference is as meaningless as verifying a tampered run.  A bundle is unpacked
into a temporary directory, read into memory and deleted.

A reference is a result *of* something: a benchmark, which Deep500 calls a recipe's fixed part
(workload, model, data set, target metric, epochs).  :func:`benchmark_difference` is the one
rule that decides whether a run and a reference (or two runs of a history) measure the same
benchmark; ``verify`` refuses to compare across benchmarks unless asked to, and ``history``
never puts two benchmarks in one series (docs/verify.md, "Same benchmark").

A reference run's repeats are also the partners of a rerun's: :func:`pair_by_seed` pairs a rerun
repeat's value with that of the reference repeat of the same seeds, by the one rule
(:func:`repro500.capture.seeds.pair_repeats`).  The paired equivalence test
(stats.tost_paired) and the exact replay (:func:`repro500.verify.determinism.replay_by_seed`) use the same pairs.  A published
file that lies in a publication (``repro500 publish`` wrote both) is paired through the packed run
beside it, whose per-repeat values it lists (``Reference.packed``).
"""

from __future__ import annotations

import posixpath
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.capture.seeds import pair_repeats
from repro500.digest import canonical_digest
from repro500.errors import InvalidInput
from repro500.rundir import archive as archives
from repro500.rundir.excluded import is_publication_dir, opened_run, publication_of
from repro500.verify import integrity
from repro500.verify.published import Published, load_published
from repro500.verify.rundir import RunData

PUBLISHED_SUFFIXES = (".yaml", ".yml", ".json")
# fixed keys that say how a command is run and watched, not what it measures
OPERATIONAL_FIXED = ("timeout_s", "observe_inputs", "inputs_budget_mb", "inputs_budget_s")
# the keys that say most about what was measured come first in a difference
TELLING_FIXED = ("workload", "model", "command", "measure", "dataset", "target", "epochs")
# what a manifest's experiment facet records of the workload (runner/capture.py)
WORKLOAD_KEYS = ("kind", "model", "dataset")


@dataclass
class Reference:
    kind: str  # "run" | "bundle" | "publication" | "published" | "history"
    path: str
    label: str
    values: dict[str, list[float]]  # metric -> per-repeat values (or the one published value)
    run: RunData | None = None
    published: Published | None = None
    manifest: dict[str, Any] | None = None
    epochs_to_quality: list[float] | None = None
    time_to_quality_s: list[float] | None = None
    integrity: integrity.IntegrityResult | None = None
    notes: list[str] = field(default_factory=list)
    history: dict[str, Any] | None = None  # a history reference's runs and scope (verify/history.py)
    benchmark: Benchmark | None = None  # what the reference is a result of, as far as it says
    # a published file's packed run, when the file lies in a publication: it records the seeds
    packed: RunData | None = None

    @property
    def seeded(self) -> RunData | None:
        """The run whose repeats record the reference's seeds: the run itself, or a publication's."""
        return self.run if self.run is not None else self.packed

    def pairing(self, run: RunData, metric: str) -> Pairing:
        """How *run*'s values of *metric* pair with this reference's (see :func:`pair_by_seed`)."""
        if self.kind == "history":
            return Pairing(False, "unpaired: a history's runs are not paired with the rerun's repeats")
        if self.published is not None:
            pub = self.published.metrics.get(metric)
            if pub is not None and pub.single:
                return Pairing(False, "one published value, taken as exact")
            if self.packed is None:
                return Pairing(False, "unpaired (Welch): the published values record no seeds to pair the rerun's "
                                      "repeats with")
            if pub is None or list(pub.values) != self.packed.values(metric):
                return Pairing(False, "unpaired (Welch): the published values are not the packed run's, whose "
                                      "seeds would pair them")
        seeded = self.seeded
        if seeded is None:
            return Pairing(False, "unpaired (Welch): the reference records no seeds")
        return pair_by_seed(run, seeded, metric)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "path": self.path, "label": self.label}
        if self.published is not None:
            out.update(benchmark=self.published.benchmark, source=self.published.source,
                       recipe=self.published.recipe)
        if self.run is not None:
            out.update(run_id=self.run.run_id, repeats=len(self.run.completed))
        if self.integrity is not None:
            out["sums_digest"] = self.integrity.sums_digest
        if self.history is not None:
            out["history"] = self.history
        return out


@dataclass(frozen=True)
class Benchmark:
    """What a result is a result of, as far as a run or a reference records it.

    ``fixed`` is the recipe's resolved fixed part (None where the reference does not carry it: a
    published file that only names its recipe); ``overridden`` the fixed keys a run set itself
    (``--set fixed.KEY`` or a params file in the open division), with their values; ``workload``
    what the manifest's experiment facet recorded of the workload."""

    recipe: str | None = None
    fixed: dict[str, Any] | None = None
    overridden: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] | None = None
    # what the data paths the run recorded hold: path -> digest (the manifest's data facet); a fixed
    # key naming a path whose bytes the other side has under another name is the same data set
    data: dict[str, str] = field(default_factory=dict)

    def definition(self) -> dict[str, Any] | None:
        """The fixed part as compared: flattened, operational keys left out."""
        if self.fixed is None:
            return None
        return _flatten({k: v for k, v in self.fixed.items() if k not in OPERATIONAL_FIXED}, "fixed")

    def key(self) -> str:
        """A digest of the definition (of the recipe name where the fixed part is unknown)."""
        definition = self.definition()
        return canonical_digest({"benchmark": definition if definition is not None else {"recipe": self.recipe}})


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    """``{"dataset": {"name": "x"}}`` -> ``{"fixed.dataset.name": "x"}``; lists are values, and an
    empty mapping is no key (as absent, or None, is no value)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out.update(_flatten(item, f"{prefix}.{key}"))
    return out


def benchmark_of_run(run: RunData) -> Benchmark:
    """The benchmark a run measured: its resolved recipe.yaml, with what it overrode."""
    recipe = run.recipe if isinstance(run.recipe, dict) else {}
    meta = run.run or {}
    name = recipe.get("name") or meta.get("recipe_name") or run.summary.get("recipe_name")
    overrides = recipe.get("overrides") if isinstance(recipe.get("overrides"), dict) else meta.get("overrides")
    overridden = {str(k): v for k, v in (overrides or {}).items() if str(k).startswith("fixed.")}
    fixed = recipe.get("fixed") if isinstance(recipe.get("fixed"), dict) else None
    return Benchmark(recipe=str(name) if name else None, fixed=fixed, overridden=overridden,
                     workload=_workload(run.manifest), data=data_digests(run.provenance_manifest))


def data_digests(manifest: dict[str, Any] | None) -> dict[str, str]:
    """path -> digest of every data record a manifest holds (declared data sets, and the inputs a
    command was seen to read), paths normalised as the recipe would name them."""
    facets = (manifest or {}).get("facets") if isinstance(manifest, dict) else None
    data = facets.get("data") if isinstance(facets, dict) else None
    out: dict[str, str] = {}
    for name in ("entries", "inputs", "observed"):
        for entry in (data.get(name) if isinstance(data, dict) else None) or []:
            digest = entry.get("md5") or entry.get("sha256") if isinstance(entry, dict) else None
            if isinstance(digest, str) and isinstance(entry.get("path"), str):
                out[posixpath.normpath(entry["path"])] = digest
    return out


def _same_bytes(mine: Any, theirs: Any, run: Benchmark, reference: Benchmark) -> bool:
    """Whether a fixed key's two values are data paths whose recorded bytes are the same (moved data:
    the same benchmark).  A path with other bytes, or one either side did not digest, is what the
    values say."""
    if not (isinstance(mine, str) and isinstance(theirs, str)):
        return False
    digest = run.data.get(posixpath.normpath(mine))
    return digest is not None and digest == reference.data.get(posixpath.normpath(theirs))


def _workload(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    facets = (manifest or {}).get("facets") if isinstance(manifest, dict) else None
    experiment = facets.get("experiment") if isinstance(facets, dict) else None
    workload = experiment.get("workload") if isinstance(experiment, dict) else None
    if not isinstance(workload, dict):
        return None
    return {k: workload[k] for k in WORKLOAD_KEYS if workload.get(k) is not None} or None


def _shown(value: Any, width: int = 40) -> str:
    text = " ".join(str(value if value is not None else "absent").split())
    return untrusted.plain(text if len(text) <= width else text[: width - 1] + "…")


def benchmark_difference(run: Benchmark, reference: Benchmark) -> str | None:
    """How ``run`` and ``reference`` are different benchmarks, run's side first ("X vs Y"), or None
    when nothing they record says so.

    Where both carry the fixed part, it decides (operational keys aside), whatever the recipes are
    called: a bf16 variant of a recipe is the same benchmark under another name.  Where the
    reference only names its recipe, a run of a recipe of another name, or one that overrode fixed
    keys of it (the open division), is another benchmark.  The workload the manifests record
    (model, data set) is compared where both have it."""
    names = ""
    if run.recipe and reference.recipe and run.recipe != reference.recipe:
        names = f"recipe {_shown(run.recipe)!r} vs {_shown(reference.recipe)!r}"
    mine, theirs = run.definition(), reference.definition()
    if mine is not None and theirs is not None:
        differing = [k for k in set(mine) | set(theirs)
                     if mine.get(k) != theirs.get(k) and not _same_bytes(mine.get(k), theirs.get(k), run, reference)]
        if not differing:
            return None
        first = min(differing, key=_telling)
        what = f"{first} {_shown(mine.get(first))} vs {_shown(theirs.get(first))}"
        for side, value in ((run, mine.get(first)), (reference, theirs.get(first))):
            if _set_by(first, side):  # the cause a reader looks for: a --set in the open division
                what += f" ({_shown(value)} set in the open division)"
                break
        more = f" and {len(differing) - 1} more fixed key(s)" if len(differing) > 1 else ""
        return f"{names}: {what}{more}" if names else what + more
    if reference.recipe and reference.fixed is None:
        if names:
            return names
        if run.overridden:
            key, value = min(run.overridden.items(), key=lambda kv: _telling(kv[0]))
            return (f"recipe {_shown(run.recipe)!r} with {key}={_shown(value)} set in the open division vs "
                    f"{_shown(reference.recipe)!r} as its recipe defines it")
    if run.workload and reference.workload:
        for k in WORKLOAD_KEYS:
            if k in run.workload and k in reference.workload and run.workload[k] != reference.workload[k]:
                what = f"{k} {_shown(run.workload[k])} vs {_shown(reference.workload[k])}"
                return f"{names}: {what}" if names else what
    return None


def _set_by(key: str, side: Benchmark) -> bool:
    """Whether ``key`` (flattened) is, or lies under, a fixed key ``side`` overrode."""
    return any(key == k or key.startswith(k + ".") for k in side.overridden)


def _telling(key: str) -> tuple[int, str]:
    part = key.split(".")[1] if "." in key else key
    return (TELLING_FIXED.index(part) if part in TELLING_FIXED else len(TELLING_FIXED), key)


def refuse_across(difference: str, reference: str) -> InvalidInput:
    """The sentence ``verify`` ends with when a run and its reference are different benchmarks."""
    return InvalidInput(
        f"the run and the reference {untrusted.plain(reference)} are different benchmarks ({difference}), so no "
        "verdict says whether the run reproduces it: verify against a result of the same benchmark, or pass "
        "--across-benchmarks to compare anyway (the verdict's first line then says so)")


MIN_PAIRS = 2  # one pair gives no spread of the differences, hence no interval


@dataclass
class Pairing:
    """A rerun's repeats paired with the reference's by seed, for one metric.

    ``paired`` says which design the equivalence test uses and ``reason`` why, in words for the
    verdict; ``pairs`` holds ``{repeat, reference_repeat, seed}`` with the two values."""

    paired: bool
    reason: str
    pairs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def run_values(self) -> list[float]:
        return [p["value"] for p in self.pairs]

    @property
    def reference_values(self) -> list[float]:
        return [p["reference_value"] for p in self.pairs]


def pair_by_seed(run: RunData, reference: RunData, metric: str) -> Pairing:
    """The rerun's values of *metric* paired with the reference's by seed: a paired design when at
    least MIN_PAIRS pairs exist (rerun repeats without a partner are left out, and named), else the
    unpaired one, with why."""
    mine, theirs = dict(run.indexed_values(metric)), dict(reference.indexed_values(metric))
    found, _ = pair_repeats(run, reference, list(mine), list(theirs))
    pairs = [{"repeat": k, "reference_repeat": j, "seed": (run.repeats[k].get("seeds") or {}).get("torch"),
              "value": float(mine[k]), "reference_value": float(theirs[j])} for k, j in found]
    if len(pairs) < MIN_PAIRS:
        if not pairs:
            return Pairing(False, "unpaired (Welch): no rerun repeat shares its seeds with a reference repeat")
        return Pairing(False, f"unpaired (Welch): only {len(pairs)} rerun repeat shares its seeds with a reference "
                              f"repeat; a paired test needs at least {MIN_PAIRS}")
    reason = (f"paired by seed: {len(pairs)} rerun repeat(s) share their seeds with reference repeats, so the "
              "per-seed differences are tested (the spread between seeds cancels)")
    left = sorted(set(mine) - {k for k, _ in found})
    if left:
        reason += f"; rerun repeat(s) {', '.join(map(str, left))} have no reference repeat of their seed: left out"
    return Pairing(True, reason, pairs)


def load_reference(against: str | Path) -> Reference:
    """Resolve ``--against``; InvalidInput when it is missing, unreadable or tampered with."""
    path = Path(against)
    if not path.exists():
        raise InvalidInput(f"reference {path} does not exist: give a run directory, a packed .tar.gz or a published-results file")
    with opened_run(path, "repro500-ref-") as opened:  # what a publication left out of its archive is not carried
        if opened.kind == "run" and path.is_dir():
            return _from_run_dir(path, kind="run", shown=str(path))
        if opened.kind != "run":
            unpacked, packed = opened.root, opened.packed
            try:
                not_carried = packed.not_carried(unpacked) if packed is not None else []
            except InvalidInput as err:
                raise InvalidInput(f"reference {path}: {err}") from None
            return _from_run_dir(unpacked, kind=opened.kind, shown=str(path),
                                 not_carried=not_carried)
    if path.suffix.lower() in PUBLISHED_SUFFIXES:
        if is_publication_dir(path.parent):
            # a publication's own file: read only once the publication vouches for it, and as itself
            # (a link there is a refusal, never followed)
            publication_of(path.parent)
            if not untrusted.regular_file(path):
                raise InvalidInput(f"reference {path} is not a regular file of its publication (a link?): refused")
        ref = _from_published(load_published(path))
        ref.packed, note = _packed_beside(path)
        if note:
            ref.notes.append(note)
        return ref
    raise InvalidInput(
        f"reference {path} is neither a run directory, a .tar.gz bundle nor a .yaml/.json published-results file"
    )


def _from_run_dir(path: Path, *, kind: str, shown: str, not_carried: list[dict[str, Any]] | None = None) -> Reference:
    try:
        check, run = integrity.check_run(path, label="reference", deep=False, not_carried=not_carried or ())
    except InvalidInput as err:  # name the reference the user gave, not a temporary directory
        raise InvalidInput(f"reference {shown}: {err}") from None
    ref = Reference(kind=kind, path=shown, label=shown, values={}, integrity=check)
    if run is None or not check.ok:
        return ref  # the verdict reports the problems as INVALID
    ref.run = run
    ref.label = f"run {run.run_id}"
    ref.values = {name: run.values(name) for name in run.metric_names()}
    ref.manifest = run.provenance_manifest  # compared, never re-sealed: with what its command read
    ref.epochs_to_quality = repeat_field(run, "epochs_to_quality")
    ref.time_to_quality_s = repeat_field(run, "time_to_quality_s")
    ref.benchmark = benchmark_of_run(run)
    return ref


def _packed_beside(path: Path) -> tuple[RunData | None, str | None]:
    """(the packed run of the publication a published file lies in, a note when it cannot be read).
    Only its summaries are kept (seeds, values, digests), so the unpacked files are deleted."""
    try:
        packed = publication_of(path.parent)
    except InvalidInput as err:
        return None, f"the publication beside {path.name} is not paired by seed: {err}"
    if packed is None:
        return None, None
    with tempfile.TemporaryDirectory(prefix="repro500-ref-") as tmp:
        try:
            unpacked = archives.unpack(packed.archive, tmp)
            check, run = integrity.check_run(unpacked, label="reference", deep=False,
                                             not_carried=packed.not_carried(unpacked))
        except InvalidInput as err:
            return None, f"the publication's packed run is not paired by seed: {str(err).replace(tmp, '<archive>')}"
    if run is None or not check.ok:
        return None, "the publication's packed run fails its integrity check: not paired by seed"
    return run, None


def repeat_field(run: RunData, name: str) -> list[float]:
    out = []
    for k in run.completed:
        doc = run.repeats[k]
        value = doc.get(name, (doc.get("metrics") or {}).get(name))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and doc.get("reached_target", True):
            out.append(float(value))
    return out


def _from_published(pub: Published) -> Reference:
    return Reference(
        kind="published", path=str(pub.path), label=f"{pub.benchmark} ({pub.citation})",
        values={name: list(m.values) for name, m in pub.metrics.items()}, published=pub,
        manifest=pub.manifest, epochs_to_quality=pub.epochs_to_quality,
        benchmark=Benchmark(recipe=pub.recipe, fixed=pub.fixed, workload=_workload(pub.manifest),
                            data=data_digests(pub.manifest)),
    )
