"""Provenance differences between the run and its reference, most result-relevant first.

Reuses ``repro500 diff`` (``repro500.verify.diff.diff_manifests``).  The diff is context
for a verdict, never its cause, so a failure here is recorded as a note rather than
stopping the verdict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

TOP = 5
_MAX_TEXT = 160


@dataclass
class ProvenanceResult:
    available: bool
    total: int = 0
    result_relevant: int | None = None
    top: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _short(value: Any) -> Any:
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def provenance_diff(manifest: dict[str, Any] | None, reference: dict[str, Any] | None, top: int = TOP) -> ProvenanceResult:
    if manifest is None or reference is None:
        missing = "the run" if manifest is None else "the reference"
        return ProvenanceResult(available=False, note=f"{missing} has no manifest: no provenance diff")
    try:
        from repro500.verify import diff as diff_module
    except ImportError as err:
        return ProvenanceResult(available=False, note=f"provenance diff unavailable ({err})")
    try:
        diffs = list(diff_module.diff_manifests(manifest, reference))
    except Exception as err:  # noqa: BLE001 - context only: a broken diff must not hide the verdict
        return ProvenanceResult(available=False, note=f"provenance diff failed: {err.__class__.__name__}: {err}")
    diffs.sort(key=lambda d: -getattr(d, "impact", 0))
    relevant = None
    is_relevant = getattr(diff_module, "is_result_relevant", None)
    if callable(is_relevant):
        relevant = sum(1 for d in diffs if is_relevant(d))
    rows = []
    for d in diffs[:top]:
        rows.append({
            "facet": getattr(d, "facet", None), "key": getattr(d, "key", None),
            "run": _short(getattr(d, "a", None)), "reference": _short(getattr(d, "b", None)),
            "impact": getattr(d, "impact", None), "reason": getattr(d, "reason", None),
        })
    return ProvenanceResult(available=True, total=len(diffs), result_relevant=relevant, top=rows)
