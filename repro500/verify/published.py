"""Published results: numbers from a paper or leaderboard that a rerun can be verified against.

Format ``repro500/published/v1`` (YAML or JSON; docs/verify.md, "Published results")::

    schema: repro500/published/v1
    benchmark: HPC AI500 image classification        # what was measured
    recipe: imagenet_resnet50                        # optional: the repro500 recipe that reruns it
    source:
      citation: "Jiang et al., HPC AI500 V2.0 ..."   # required
      url: https://...                               # optional: url, doi, table, note
    metrics:
      accuracy:                                      # a metric name the run's summaries use
        value: 0.763                                 # or values: [0.761, 0.764, ...] (per-repeat)
        margin: 0.005                                # allowed difference (same unit as value)
        direction: higher                            # higher | lower is better
        test: equivalence                            # or non_inferiority; default equivalence
        unit: fraction                               # optional
    epochs_to_quality: [38, 40, 41]                  # optional: for the convergence check
    manifest: reference_manifest.json                # optional: inline object or a path

Unknown keys are refused so that a typo is not silently ignored.  Where a ``recipe.yaml`` of the
named recipe lies beside the file (``repro500 publish`` writes one), its fixed part is the
benchmark's definition that a run is compared with (verify/reference.py, ``benchmark_difference``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput
from repro500.rundir import layout
from repro500.rundir.names import PUBLISHED_SCHEMA
from repro500.verify.rundir import number

SCHEMA = PUBLISHED_SCHEMA
TESTS = ("equivalence", "non_inferiority")
_TOP_KEYS = {"schema", "benchmark", "recipe", "source", "metrics", "epochs_to_quality", "manifest", "notes"}
_SOURCE_KEYS = {"citation", "url", "doi", "table", "note"}
_METRIC_KEYS = {"value", "values", "margin", "direction", "test", "unit", "note"}


@dataclass
class PublishedMetric:
    name: str
    values: list[float]  # one element when the source gives a single value
    margin: float
    direction: str
    test: str = "equivalence"
    unit: str | None = None
    note: str | None = None
    single: bool = True  # True when the source gave ``value`` (compared one-sample)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "values": self.values, "single": self.single, "margin": self.margin,
                "direction": self.direction, "test": self.test, "unit": self.unit, "note": self.note}


@dataclass
class Published:
    path: Path
    benchmark: str
    source: dict[str, str]
    metrics: dict[str, PublishedMetric]
    recipe: str | None = None
    epochs_to_quality: list[float] | None = None
    manifest: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    fixed: dict[str, Any] | None = None  # the named recipe's fixed part, where its recipe.yaml lies beside

    @property
    def citation(self) -> str:
        return self.source.get("citation", "")


def _fail(path: Path, where: str, what: str) -> InvalidInput:
    return InvalidInput(f"{path}: {where} {what}")


def _num(value: Any, path: Path, where: str) -> float:
    try:
        return number(value, where)
    except InvalidInput as err:
        raise InvalidInput(f"{path}: {err}") from None


def _read(path: Path) -> Any:
    """The document at ``path`` (YAML, or JSON by suffix), read as untrusted input (repro500.untrusted)."""
    try:
        text = untrusted.read_text(path, "a published-results file")
    except FileNotFoundError:
        raise InvalidInput(f"{path} does not exist: give a published-results YAML or JSON file") from None
    if path.suffix.lower() == ".json":
        return untrusted.load_json(text, str(path))
    return untrusted.load_yaml(text, str(path))


def load_published(path: str | Path) -> Published:
    """Read and validate a published-results file; InvalidInput names the first problem."""
    path = Path(path)
    doc = _read(path)
    if not isinstance(doc, dict):
        raise InvalidInput(f"{path} must hold a mapping with schema: {SCHEMA}")
    if doc.get("schema") != SCHEMA:
        raise _fail(path, "schema", f"is {doc.get('schema')!r}: published results need schema: {SCHEMA}")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise _fail(path, "key", f"{unknown[0]!r} is unknown (allowed: {', '.join(sorted(_TOP_KEYS))})")
    benchmark = doc.get("benchmark")
    if not isinstance(benchmark, str) or not benchmark.strip():
        raise _fail(path, "benchmark", "is missing: name what was measured")
    source = doc.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("citation"), str) or not source["citation"].strip():
        raise _fail(path, "source.citation", "is missing: say where the numbers come from")
    bad = sorted(set(source) - _SOURCE_KEYS)
    if bad:
        raise _fail(path, f"source.{bad[0]}", f"is unknown (allowed: {', '.join(sorted(_SOURCE_KEYS))})")
    metrics_raw = doc.get("metrics")
    if not isinstance(metrics_raw, dict) or not metrics_raw:
        raise _fail(path, "metrics", "must map at least one metric name to {value, margin, direction}")
    metrics = {str(name): _metric(str(name), spec, path) for name, spec in metrics_raw.items()}
    epochs = doc.get("epochs_to_quality")
    if epochs is not None:
        if isinstance(epochs, dict) and set(epochs) <= {"values", "note"}:
            epochs = epochs.get("values")
        if not isinstance(epochs, list) or not epochs:
            raise _fail(path, "epochs_to_quality", "must be a non-empty list of numbers")
        epochs = [_num(v, path, f"epochs_to_quality[{i}]") for i, v in enumerate(epochs)]
    recipe = doc.get("recipe")
    if recipe is not None and not isinstance(recipe, str):
        raise _fail(path, "recipe", "must be a recipe name")
    notes = doc.get("notes")
    return Published(
        path=path, benchmark=benchmark.strip(), source={k: str(v) for k, v in source.items()},
        metrics=metrics, recipe=recipe, epochs_to_quality=epochs,
        manifest=_manifest(doc.get("manifest"), path),
        notes=[str(n) for n in notes] if isinstance(notes, list) else ([str(notes)] if notes else []),
        fixed=_recipe_beside(path, recipe),
    )


RECIPE_BESIDE = layout.RECIPE


def _recipe_beside(path: Path, name: str | None) -> dict[str, Any] | None:
    """The fixed part of recipe ``name`` when its recipe.yaml lies beside the published file (a
    publication's does), else None.  Another recipe's file there says nothing about this one; a
    file there that cannot be read as a recipe is refused, as a bad manifest path is."""
    beside = path.parent / RECIPE_BESIDE
    if not name or not beside.exists():
        return None
    doc = untrusted.load_yaml(untrusted.read_text(beside, "the recipe beside the published results"), str(beside))
    if not isinstance(doc, dict) or doc.get("name") != name:
        return None
    fixed = doc.get("fixed")
    if not isinstance(fixed, dict):
        raise _fail(path, "recipe", f"names {untrusted.plain(name)!r}, whose {beside} has no fixed part")
    return fixed


def _metric(name: str, spec: Any, path: Path) -> PublishedMetric:
    where = f"metrics.{name}"
    if not isinstance(spec, dict):
        raise _fail(path, where, "must be a mapping with value (or values), margin and direction")
    bad = sorted(set(spec) - _METRIC_KEYS)
    if bad:
        raise _fail(path, f"{where}.{bad[0]}", f"is unknown (allowed: {', '.join(sorted(_METRIC_KEYS))})")
    if ("value" in spec) == ("values" in spec):
        raise _fail(path, where, "needs exactly one of value (a number) or values (per-repeat numbers)")
    if "value" in spec:
        values, single = [_num(spec["value"], path, f"{where}.value")], True
    else:
        raw = spec["values"]
        if not isinstance(raw, list) or not raw:
            raise _fail(path, f"{where}.values", "must be a non-empty list of numbers")
        values, single = [_num(v, path, f"{where}.values[{i}]") for i, v in enumerate(raw)], False
    direction = spec.get("direction")
    if direction not in ("higher", "lower"):
        raise _fail(path, f"{where}.direction", f"is {direction!r}: use higher or lower")
    test = spec.get("test", "equivalence")
    if test not in TESTS:
        raise _fail(path, f"{where}.test", f"is {test!r}: use {' or '.join(TESTS)}")
    if "margin" not in spec:
        raise _fail(path, f"{where}.margin", "is missing: give the difference that still counts as reproduced")
    margin = _num(spec["margin"], path, f"{where}.margin")
    if margin < 0 or (margin == 0 and test == "equivalence"):
        raise _fail(path, f"{where}.margin", f"is {margin!r}: an equivalence margin must be > 0")
    unit, note = spec.get("unit"), spec.get("note")
    return PublishedMetric(name=name, values=values, margin=margin, direction=direction, test=test,
                           unit=str(unit) if unit is not None else None,
                           note=str(note) if note is not None else None, single=single)


def _manifest(raw: Any, path: Path) -> dict[str, Any] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        # a file beside the published results, never one elsewhere on the reader's machine: a
        # published file handed over must not pull the reader's own files into the verdict
        base = path.parent.resolve()
        target = (base / raw).resolve()
        if not target.is_relative_to(base):
            raise _fail(path, "manifest", f"points to {untrusted.plain(raw)}, outside {base}: name a file beside the "
                        "published results (or inline the manifest)")
        if target.is_dir():
            target = target / layout.MANIFEST
        try:
            raw = untrusted.load_json(untrusted.read_bytes(target, "the reference manifest"), str(target))
        except FileNotFoundError:
            raise _fail(path, "manifest", f"points to {target}, which does not exist") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("facets"), dict):
        raise _fail(path, "manifest", "must be a manifest object with a 'facets' mapping (or a path to one)")
    return raw
