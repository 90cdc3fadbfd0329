"""What ``repro500 verify`` adds for trust: the repeat chain, the signature, the tracking records.

Rules (docs/trust.md, "What verify decides"):

* the chain is checked whenever ``chain.jsonl`` exists, with or without ``--trust``;
* with ``--trust ALLOWED_SIGNERS`` the run must be signed by a key that file trusts, its signed
  subjects must be the files on disk, and it must have a chain: a run made before repro500
  recorded chains has none and is INVALID under ``--trust`` (the message says so);
* with ``--check-tracking`` every repeat is compared with its MLflow run.

Any problem makes the verdict INVALID (exit 4) *instead of* the statistical outcome, as an
integrity problem does: numbers from a run that cannot be trusted are not judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.attest import chain
from repro500.rundir.excluded import opened_run
from repro500.statuses import INVALID


@dataclass
class TrustResult:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    signature: dict[str, Any] | None = None
    tracking: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def check_run(run: str | Path, *, trust: str | Path | None = None, tracking: bool = False,
              store: str | None = None) -> TrustResult:
    """Chain, signature (with *trust*) and tracking (with *tracking*) checks of a run directory or
    archive, or of the packed run of a publication directory.  *store* is the MLflow store the
    run was read from, compared with instead of the one its run.json names
    (:func:`repro500.attest.tracking_check.check_tracking`)."""
    with opened_run(run, "repro500-trust-") as opened:
        return _check_dir(opened.root, trust, tracking, store)


def _check_dir(root: Path, trust: str | Path | None, tracking: bool, store: str | None) -> TrustResult:
    result = TrustResult()
    if (root / chain.CHAIN_NAME).is_file() or trust is not None:
        problems = chain.check(root)
        result.problems += problems
        if not problems:
            result.notes.append(f"repeat chain intact: every planned repeat is accounted for ({chain.CHAIN_NAME})")
    if trust is not None:
        from repro500.attest.attestation import verify_signature

        sig = verify_signature(root, trust)
        result.signature = sig.to_dict()
        result.problems += sig.problems
        result.notes += sig.notes
        if sig.valid:
            result.notes.insert(0, f"signed by {sig.principal} ({sig.fingerprint}), trusted by {trust}")
    if tracking:
        from repro500.attest.tracking_check import check_tracking

        tracked = check_tracking(root, store=store)
        result.tracking = tracked.to_dict()
        result.problems += tracked.problems
        if not tracked.problems:
            result.notes.append(f"MLflow agrees: {tracked.compared} repeat(s) match their runs in {tracked.uri}")
    return result


def apply(result: TrustResult, verdict: Any) -> None:
    """Fold the result into a verdict: notes into its integrity section, problems make it INVALID."""
    check = verdict.integrity
    if check is not None:
        check.notes[:0] = result.notes
        check.problems += result.problems
    if result.ok:
        return
    already = verdict.status == INVALID
    verdict.status = INVALID
    # first: they name the repeat or the signer, where file problems only show the consequence
    verdict.reasons = result.problems + (list(verdict.reasons) if already else [])
    advice = "the run cannot be trusted as it is: obtain the signed original from its author, or rerun and sign it"
    if advice not in verdict.advice:
        verdict.advice.append(advice)
