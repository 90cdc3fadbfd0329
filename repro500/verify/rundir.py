"""Read a run directory (docs/contracts.md, "Run directory") into plain data.

Everything the verdict needs is loaded into memory here, so a packed bundle can be
unpacked into a temporary directory, read, and deleted.  Malformed files raise
:class:`repro500.errors.InvalidInput` naming the file and what is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.capture.inputs import comparable
from repro500.errors import InvalidInput
from repro500.rundir import layout
from repro500.statuses import REPEAT_COMPLETED

DIRECTIONS = ("higher", "lower")


def counted(value: Any, where: str) -> bool:
    """Whether a count of repeats a record states may be used: at least 1 and within the bound of
    :func:`repro500.untrusted.count` (integrity reports one that is not, once)."""
    try:
        untrusted.count(value, where, least=1)
    except InvalidInput:
        return False
    return True


@dataclass(frozen=True)
class Criterion:
    """One acceptance criterion: ``metric`` must reach ``target`` within ``tolerance``."""

    metric: str
    target: float
    direction: str  # "higher" (achieved >= target - tolerance) or "lower" (<= target + tolerance)
    tolerance: float = 0.0

    @property
    def threshold(self) -> float:
        return self.target - self.tolerance if self.direction == "higher" else self.target + self.tolerance


@dataclass
class RunData:
    """A run directory's documents, as read from disk."""

    path: Path
    summary: dict[str, Any]
    repeats: dict[int, dict[str, Any]]  # repeat index -> repeat summary
    run: dict[str, Any] | None = None  # run.json
    manifest: dict[str, Any] | None = None
    recipe: dict[str, Any] | None = None
    acceptance: list[Criterion] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)  # inputs.json: what a wrapped command read

    @property
    def provenance_manifest(self) -> dict[str, Any] | None:
        """The manifest as provenance diffs compare it: with the inputs the command was seen to
        read as the data facet's ``observed`` entries (repro500.capture.inputs)."""
        return comparable(self.manifest, self.inputs)

    @property
    def run_id(self) -> str:
        return str((self.run or {}).get("run_id") or self.summary.get("run_id") or self.path.name)

    def status(self, k: int) -> str:
        return str(self.repeats[k].get("status", "unknown"))

    @property
    def completed(self) -> list[int]:
        return [k for k in sorted(self.repeats) if self.status(k) == REPEAT_COMPLETED]

    def planned_counts(self) -> dict[str, Any]:
        """The number of planned repeats as each document records it (absent ones left out)."""
        seeds = (((self.manifest or {}).get("facets") or {}).get("seeds") or {})
        sources = (("run.json repeats", self.run), ("summary.json repeats_planned", self.summary),
                   ("recipe.yaml repeats", self.recipe), ("manifest.json seeds.repeats", seeds))
        key = {"summary.json repeats_planned": "repeats_planned"}
        out = {}
        for where, doc in sources:
            name = key.get(where, "repeats")
            if isinstance(doc, dict) and doc.get(name) is not None:
                out[where] = doc[name]
        return out

    @property
    def planned(self) -> int | None:
        """The planned number of repeats (integrity checks that every record agrees)."""
        for where, value in self.planned_counts().items():
            if counted(value, where):
                return value
        return None

    @property
    def not_run(self) -> list[int]:
        """Planned repeats with no summary at all (an incomplete run; integrity decides if allowed).
        A sequential run that stopped once its verdict was decided planned only the repeats it ran
        (verify/sequential.py re-derives the stopping point)."""
        design = (self.run or {}).get("design")
        stopped = design.get("stopped_at") if isinstance(design, dict) and design.get("kind") == "sequential" else None
        limit = stopped if counted(stopped, "run.json design.stopped_at") else self.planned
        return [k for k in range(limit or 0) if k not in self.repeats]

    @property
    def unsuccessful(self) -> dict[int, str]:
        """Repeats that ended in a state other than completed, with that state; planned repeats
        that never ran count as "not run"."""
        out = {k: self.status(k) for k in sorted(self.repeats) if self.status(k) != REPEAT_COMPLETED}
        for key, state in (self.summary.get("repeats") or {}).items():
            if str(key).isdigit() and int(key) not in self.repeats:
                out[int(key)] = str(state)
        for k in self.not_run:
            out.setdefault(k, "not run")
        return dict(sorted(out.items()))

    def values(self, metric: str) -> list[float]:
        """The metric's value in every completed repeat that reported it, by repeat index."""
        return [v for _, v in self.indexed_values(metric)]

    def indexed_values(self, metric: str) -> list[tuple[int, float]]:
        out = []
        for k in self.completed:
            value = (self.repeats[k].get("metrics") or {}).get(metric)
            if value is not None:
                out.append((k, value))
        return out

    def metric_names(self) -> list[str]:
        """Every metric any completed repeat reported, acceptance metrics first."""
        names: list[str] = [c.metric for c in self.acceptance]
        for k in self.completed:
            for name, value in (self.repeats[k].get("metrics") or {}).items():
                if name not in names and value is not None:
                    names.append(name)
        return names

    def repeat_file(self, k: int, name: str) -> Path:
        return layout.RunDir(self.path).repeat(k) / name


read_json = layout.read_json  # one rule for a document the run must have (repro500/rundir/layout.py)


def check_schema(doc: dict[str, Any], expected: str, path: Path) -> None:
    if doc.get("schema") != expected:
        raise InvalidInput(f"{path} has schema {doc.get('schema')!r}, expected {expected!r}")


# Beyond this magnitude the squares the statistics sum would overflow float64 (1e308): no metric
# measures such a number, so it is refused rather than carried into a verdict as inf or NaN.
MAX_MAGNITUDE = 1e150


def number(value: Any, where: str) -> float:
    """A finite float of a sane magnitude, or InvalidInput naming where the bad value is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{where} is {value!r}, not a number")
    if isinstance(value, int) and abs(value) > MAX_MAGNITUDE:
        raise InvalidInput(f"{where} is an integer of {len(str(abs(value)))} digits: beyond any metric's magnitude")
    if not math.isfinite(value):
        raise InvalidInput(f"{where} is {value!r}, not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise InvalidInput(f"{where} is {value!r}: beyond {MAX_MAGNITUDE:g}, no metric's magnitude (the statistics would overflow)")
    return float(value)


def parse_acceptance(raw: Any, where: str) -> list[Criterion]:
    """Acceptance criteria from ``{metric: {target, direction, tolerance}}`` (or a list of them)."""
    if raw is None:
        return []
    if isinstance(raw, list):
        items = []
        for i, entry in enumerate(raw):
            if not isinstance(entry, dict) or "metric" not in entry:
                raise InvalidInput(f"{where}[{i}] must be a mapping with a 'metric' key")
            items.append((str(entry["metric"]), entry))
    elif isinstance(raw, dict):
        items = list(raw.items())
    else:
        raise InvalidInput(f"{where} must map metric names to {{target, direction, tolerance}}")
    out = []
    for metric, spec in items:
        if not isinstance(spec, dict):
            raise InvalidInput(f"{where}.{metric} must be a mapping with target and direction")
        direction = spec.get("direction")
        if direction not in DIRECTIONS:
            raise InvalidInput(f"{where}.{metric}.direction is {direction!r}: use 'higher' or 'lower'")
        tolerance = number(spec.get("tolerance", 0.0), f"{where}.{metric}.tolerance")
        if tolerance < 0:
            raise InvalidInput(f"{where}.{metric}.tolerance is negative: use a value >= 0")
        target = number(spec.get("target"), f"{where}.{metric}.target")
        out.append(Criterion(metric=str(metric), target=target, direction=direction, tolerance=tolerance))
    return out


def _read_recipe(path: Path) -> dict[str, Any] | None:
    if not path.exists() and not path.is_symlink():
        return None
    try:
        # a FIFO, a link to a device, a bomb or a recipe of gigabytes is refused, not read
        value = untrusted.read_yaml(path, "the run's recipe")
    except FileNotFoundError:  # a link to nothing: no recipe
        return None
    return value if isinstance(value, dict) else None


def load_run(path: str | Path) -> RunData:
    """Load a run directory's summaries, run.json, manifest and recipe (no integrity checks)."""
    root = Path(path)
    if not root.exists():
        raise InvalidInput(f"{root} does not exist: give a run directory such as runs/<run-id>")
    if not root.is_dir():
        raise InvalidInput(f"{root} is not a directory: give a run directory (or unpack the archive)")
    summary = read_json(root / layout.SUMMARY, "the aggregate summary")
    check_schema(summary, layout.SUMMARY_SCHEMA, root / layout.SUMMARY)
    repeats: dict[int, dict[str, Any]] = {}
    repeats_dir = root / "repeats"
    if repeats_dir.is_symlink():
        raise InvalidInput(f"{repeats_dir} is a link: a run's repeats must be a directory of its own")
    if repeats_dir.is_dir():
        for child in sorted(repeats_dir.iterdir()):
            # a linked repeat is never read: one repeat's files must not count twice, nor files
            # from outside the run (integrity.check_repeats names it)
            if child.is_symlink() or (child / layout.REPEAT_SUMMARY).is_symlink():
                continue
            if child.is_dir() and child.name.isdigit() and (child / layout.REPEAT_SUMMARY).exists():
                doc = read_json(child / layout.REPEAT_SUMMARY, "a repeat summary")
                check_schema(doc, layout.REPEAT_SUMMARY_SCHEMA, child / layout.REPEAT_SUMMARY)
                _check_metrics(doc, child / layout.REPEAT_SUMMARY)
                repeats[int(child.name)] = doc
    if not repeats:
        raise InvalidInput(f"{root} has no repeats/<k>/summary.json: no repeat finished")
    run = read_json(root / layout.RUN_JSON, layout.RUN_JSON) if (root / layout.RUN_JSON).exists() else None
    if run is not None:
        check_schema(run, layout.RUN_SCHEMA, root / layout.RUN_JSON)
        _check_shapes(run, root / layout.RUN_JSON)
    manifest = read_json(root / layout.MANIFEST, "the manifest") if (root / layout.MANIFEST).exists() else None
    recipe = _read_recipe(root / layout.RECIPE)
    inputs = layout.read_inputs(root / layout.INPUTS)
    if summary.get("acceptance") is not None:
        acceptance = parse_acceptance(summary["acceptance"], f"{root / layout.SUMMARY}: acceptance")
    else:
        acceptance = parse_acceptance((recipe or {}).get("acceptance"), f"{root / layout.RECIPE}: acceptance")
    return RunData(path=root, summary=summary, repeats=repeats, run=run, manifest=manifest,
                   recipe=recipe, acceptance=acceptance, inputs=inputs)


# run.json's records that readers walk as objects (a sequential or factorial design, the
# reference a run decided against, ...) and as lists: another shape is refused here, once, rather
# than met as an AttributeError by whichever reader comes to it first
_OBJECTS = ("design", "reference", "compressor", "overrides", "mlflow")
_LISTS = ("resumes", "argv")


def _check_shapes(run: dict[str, Any], path: Path) -> None:
    for key, kind, what in [*((k, dict, "an object") for k in _OBJECTS), *((k, list, "a list") for k in _LISTS)]:
        value = run.get(key)
        if value is not None and not isinstance(value, kind):
            raise InvalidInput(f"{path}: {key} is {untrusted.plain(repr(value))[:60]}, not {what}: the file is corrupt")


def _check_metrics(doc: dict[str, Any], path: Path) -> None:
    metrics = doc.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise InvalidInput(f"{path}: metrics must be a JSON object")
    for name, value in metrics.items():
        if value is not None:
            number(value, f"{path}: metrics.{name}")
