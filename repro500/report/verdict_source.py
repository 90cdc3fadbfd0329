"""Which verdict the report shows, and why it can be trusted.

``verdict.json`` is not covered by ``SHA256SUMS`` (docs/contracts.md), and a run directory
may come from someone else, so the report never shows a stored verdict blindly:

* ``--against REF``: the verdict is computed now against REF (``verify_run``).
* no ``verdict.json``, or one that does not parse: the run's own verdict is computed now.
* a stored verdict on the run's own criteria: recomputed now (it is a function of the
  directory alone); when the stored status differs, the report says so.
* a stored verdict against a reference: shown as stored (its reference may not exist on this
  machine), but the run's integrity is re-checked now; a run that no longer matches its
  ``SHA256SUMS`` is shown as INVALID.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput
from repro500.statuses import DEFAULT_ALPHA, INVALID
from repro500.verify.verdict import SCHEMA, VERDICT_NAME, verify_run


@dataclass
class VerdictView:
    doc: dict[str, Any]  # a verdict.json document (repro500/verdict/v1)
    source: str  # one sentence: where the verdict comes from
    warnings: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.doc.get("status") or "UNKNOWN")

    @property
    def invalid(self) -> bool:
        return self.status == INVALID


def read_stored(root: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(verdict document, None) or (None, why it cannot be used); (None, None) when absent."""
    path = root / VERDICT_NAME
    if not path.exists() and not path.is_symlink():
        return None, None
    # verdict.json is not sealed: whoever handed over the run may have made it a FIFO, a link to a
    # device or a file of gigabytes; that is refused (InvalidInput), not read
    try:
        data = untrusted.read_bytes(path, f"the stored {VERDICT_NAME}")
    except FileNotFoundError:  # a link to nothing
        return None, None
    try:
        doc = untrusted.load_json(data, str(path))
    except InvalidInput:
        return None, f"{VERDICT_NAME} is not readable JSON; the verdict was recomputed"
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None, f"{VERDICT_NAME} is not a {SCHEMA} document; the verdict was recomputed"
    return doc, None


def obtain_verdict(
    root: Path,
    *,
    against: str | Path | None = None,
    alpha: float | None = None,
    margins: dict[str, float] | None = None,
    across_benchmarks: bool = False,
) -> VerdictView:
    """The verdict to show for the run directory ``root`` (see the module docstring)."""
    if against is not None:
        verdict = verify_run(root, against=against, alpha=alpha or DEFAULT_ALPHA, margins=margins,
                             across_benchmarks=across_benchmarks)
        return VerdictView(verdict.to_dict(), f"computed now against {against}")
    stored, why = read_stored(root)
    warnings = [why] if why else []
    if stored is None:
        verdict = verify_run(root, alpha=alpha or DEFAULT_ALPHA)
        source = "computed now on the run's own acceptance criteria (no verdict.json)"
        if why:
            source = "computed now on the run's own acceptance criteria"
        return VerdictView(verdict.to_dict(), source, warnings)
    stored_alpha = stored.get("alpha")
    use_alpha = alpha or (stored_alpha if isinstance(stored_alpha, float) and 0 < stored_alpha < 0.5 else DEFAULT_ALPHA)
    fresh = verify_run(root, alpha=use_alpha)
    created = stored.get("created_utc") or "an unknown time"
    if not stored.get("against"):
        if stored.get("status") != fresh.status:
            warnings.append(
                f"{VERDICT_NAME} says {stored.get('status')!r} but recomputing from the run directory gives "
                f"{fresh.status!r}: it is stale or was edited; the recomputed verdict is shown")
        return VerdictView(fresh.to_dict(), f"recomputed now from the run directory ({VERDICT_NAME} of {created} agrees)"
                           if not warnings else "recomputed now from the run directory", warnings)
    # A reference comparison cannot be redone without the reference: show it, re-check integrity.
    label = _against_label(stored.get("against"))
    if fresh.status == INVALID:
        warnings.append(f"the run no longer matches its SHA256SUMS, so the stored comparison with {label} "
                        "cannot be trusted; the current integrity problems are shown")
        return VerdictView(fresh.to_dict(), "recomputed now: the run directory fails its integrity check", warnings)
    # Sections that depend on the run alone are recomputed, so only the comparison is as stored.
    doc = dict(stored)
    now = fresh.to_dict()
    for key in ("integrity", "statistics", "bands", "valid_flops"):
        doc[key] = now[key]
    return VerdictView(
        doc,
        f"{VERDICT_NAME} of {created} against {label}, integrity re-checked now; "
        "pass --against REF to recompute the comparison",
        warnings,
    )


def _against_label(against: Any) -> str:
    if isinstance(against, dict):
        return str(against.get("label") or against.get("path") or "a reference")
    return "a reference"
