"""Provenance differences between the run and its reference, most result-relevant first.

The one comparison of two runs every command asks (``repro500.verify.compare``).  The diff is context
for a verdict, never its cause, so a failure here is recorded as a note rather than
stopping the verdict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from repro500.verify import compare
from repro500.verify.diff import short

TOP = 5
ROWS = 40  # the rows the report shows (repro500 diff shows all)
_MAX_TEXT = 160


@dataclass
class ProvenanceResult:
    available: bool
    total: int = 0
    result_relevant: int | None = None
    top: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _short(value: Any) -> Any:
    """A row's value as the verdict keeps it: numbers as they are, anything else in the one
    formatter's words (a data record by digest, size and path; never a Python repr)."""
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return short(value, _MAX_TEXT)


def provenance_diff(manifest: dict[str, Any] | None, reference: dict[str, Any] | None, top: int = TOP, *,
                    run: Any = None, against: Any = None) -> ProvenanceResult:
    """The one comparison of two runs (repro500.verify.compare): of *run* with the reference
    *against* where the verdict has them (recipes, plan, seeds, lock, outputs as well), else of the
    manifests alone.  ``top`` rows are kept for the terminal, ``rows`` (up to :data:`ROWS`) for the
    report."""
    if manifest is None or reference is None:
        missing = "the run" if manifest is None else "the reference"
        return ProvenanceResult(available=False, note=f"{missing} has no manifest: no provenance diff")
    try:
        found = (compare.compare_reference(run, against) if run is not None and against is not None
                 else compare.compare_manifests(manifest, reference))
    except Exception as err:  # noqa: BLE001 - context only: a broken diff must not hide the verdict
        return ProvenanceResult(available=False, note=f"provenance diff failed: {err.__class__.__name__}: {err}")
    rows = [{"facet": d.facet, "key": d.key, "run": _short(d.a), "reference": _short(d.b), "impact": d.impact,
             "reason": d.reason, "relevance": compare.relevance(d)} for d in found.differences[:ROWS]]
    return ProvenanceResult(available=True, total=len(found.differences), result_relevant=len(found.relevant),
                            top=rows[:top], rows=rows)
