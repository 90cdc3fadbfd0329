"""Read what the report shows from a run directory: records, summaries, manifest, scaling model.

Summaries, manifest and recipe come through ``repro500.verify.rundir.load_run`` (the same
reader the verdict uses).  ``metrics.jsonl`` is read here, tolerantly: the report is a view,
so an unreadable line is skipped and counted rather than stopping the report (the verdict's
integrity section is what judges the files).  Every number taken from a file goes through
:func:`finite` so that strings, booleans and NaN never reach a plot.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput
from repro500.rundir import layout
from repro500.rundir import sums as bundle
from repro500.rundir.names import SCALING_SCHEMA
from repro500.verify.rundir import RunData, load_run

SCALING_PATH = Path(layout.SCALING)


def finite(value: Any) -> float | None:
    """A finite float, or None for anything else (missing, text, bool, NaN, infinity)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


@dataclass
class RepeatRecords:
    """One repeat's ``metrics.jsonl``: step records and epoch records, in file order."""

    repeat: int
    steps: list[dict[str, Any]] = field(default_factory=list)
    epochs: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: int = 0


@dataclass
class ScalingModel:
    predictions: list[dict[str, float]]  # {"p", "step_time_s", "efficiency"?}
    measured: list[dict[str, float]]  # {"p", "step_time_s"}
    doc: dict[str, Any]


@dataclass
class RunView:
    """Everything the report draws from one run directory."""

    root: Path
    data: RunData | None  # None when the directory could not be loaded (an INVALID run)
    records: dict[int, RepeatRecords] = field(default_factory=dict)
    scaling: ScalingModel | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def run_json(self) -> dict[str, Any]:
        return (self.data.run if self.data else None) or {}

    @property
    def summary(self) -> dict[str, Any]:
        return self.data.summary if self.data else {}


def read_records(path: Path, repeat: int) -> RepeatRecords:
    out = RepeatRecords(repeat=repeat)
    records, out.skipped_lines = layout.metric_records(path)
    out.steps = [r for r in records if r.get("kind") == "step"]
    out.epochs = [r for r in records if r.get("kind") == "epoch"]
    return out


def read_scaling(root: Path) -> tuple[ScalingModel | None, str | None]:
    """The scaling model's ``derived/scaling.json``, or (None, why it is not shown)."""
    path = root / SCALING_PATH
    if not path.is_file():
        return None, f"no {SCALING_PATH.as_posix()} in the run directory (repro500 model writes it)"
    data = untrusted.read_bytes(path, f"the scaling model ({SCALING_PATH.as_posix()})")  # capped, regular only
    try:
        doc = untrusted.load_json(data, str(path))
    except InvalidInput:
        return None, f"{SCALING_PATH.as_posix()} is not readable JSON: scaling section omitted"
    if not isinstance(doc, dict) or doc.get("schema") != SCALING_SCHEMA:
        return None, f"{SCALING_PATH.as_posix()} is not a {SCALING_SCHEMA} document: scaling section omitted"
    predictions = _points(doc.get("predictions"), ("p", "step_time_s"), ("efficiency",))
    measured_raw = doc.get("measured")
    measured = _points(measured_raw if isinstance(measured_raw, list) else [measured_raw],
                       ("p", "step_time_s"), ("efficiency",))
    if not predictions:
        return None, f"{SCALING_PATH.as_posix()} holds no usable predictions (p, step_time_s): scaling section omitted"
    predictions.sort(key=lambda d: d["p"])
    measured.sort(key=lambda d: d["p"])
    return ScalingModel(predictions=predictions, measured=measured, doc=doc), None


def _points(raw: Any, required: tuple[str, ...], optional: tuple[str, ...]) -> list[dict[str, float]]:
    out = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        point = {k: finite(item.get(k)) for k in required + optional}
        if all(point[k] is not None for k in required) and point["p"] > 0:
            out.append({k: v for k, v in point.items() if v is not None})
    return out


def load_view(root: Path, *, readable: bool = True) -> RunView:
    """Load a run directory for the report.

    ``readable=False`` (an INVALID run) loads nothing but ``run.json`` when it parses: the
    report then shows why the run is invalid instead of plotting numbers nobody can trust.
    """
    view = RunView(root=root, data=None)
    if not readable:
        view.data = _identity_only(root)
        return view
    view.data = load_run(root)
    for k in sorted(view.data.repeats):
        records = read_records(layout.RunDir(root).repeat(k) / layout.METRICS, k)
        if records.skipped_lines:
            view.notes.append(f"repeats/{k}/metrics.jsonl: {records.skipped_lines} unreadable line(s) skipped")
        view.records[k] = records
    view.scaling, why = read_scaling(root)
    if why:
        view.notes.append(why)
    return view


def _identity_only(root: Path) -> RunData | None:
    """run.json and summary.json only as far as they parse, for the header of an INVALID run."""
    docs: dict[str, dict[str, Any]] = {}
    for name in (layout.RUN_JSON, layout.SUMMARY):
        try:
            # the run failed its integrity check: a FIFO or a link to /dev/zero is skipped, not read
            value = untrusted.read_json(root / name, name)
        except (OSError, InvalidInput):
            continue
        if isinstance(value, dict):
            docs[name] = value
    if not docs:
        return None
    return RunData(path=root, summary=docs.get(layout.SUMMARY, {}), repeats={}, run=docs.get(layout.RUN_JSON),
                   manifest=None, recipe=None, acceptance=[])


def check_run_dir(root: Path) -> None:
    """InvalidInput with one sentence when ``root`` is not a run directory at all."""
    if not root.exists():
        raise InvalidInput(f"{root} does not exist: give a run directory (runs/<run-id>) or a packed .tar.gz")
    if not root.is_dir():
        raise InvalidInput(f"{root} is neither a run directory nor a .tar.gz/.tgz/.tar archive made by repro500 pack")
    if not (root / bundle.SUMS_NAME).is_file() and not (root / layout.SUMMARY).is_file():
        raise InvalidInput(f"{root} is not a run directory: it has no SHA256SUMS and no summary.json")
