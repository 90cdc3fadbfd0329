"""Sign a run directory: an in-toto Statement in a DSSE envelope (checking one is attestation.py's).

``sign_intact`` writes two files into the run directory, neither covered by ``SHA256SUMS`` (they
sign it):

* ``attestation.intoto.jsonl``: an in-toto attestation bundle (JSON Lines, one DSSE envelope a
  line; the in-toto bundle spec's ``.intoto.jsonl`` suffix).  The envelope's payload
  (``application/vnd.in-toto+json``) is an in-toto Statement v1 whose subjects are every file
  ``SHA256SUMS`` lists plus ``SHA256SUMS`` itself, and whose predicate
  (:data:`PREDICATE_TYPE`) is the run's provenance; its signature is Ed25519 over DSSE's PAE,
  made with securesystemslib.
* ``attestation.sig``: an SSH signature (namespace ``repro500``) over the exact Statement bytes,
  so that ``ssh-keygen -Y verify`` checks the run without repro500 (docs/trust.md).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from repro500 import __version__, untrusted
from repro500.attest import chain, keys, sshsig
from repro500.attest.attestation import (
    ENVELOPE_NAME,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    SSHSIG_NAME,
    STATEMENT_TYPE,
    signed_signer,
)
from repro500.digest import canonical_json, file_digest
from repro500.errors import InvalidInput
from repro500.rundir import atomic, layout
from repro500.rundir import sums as bundle
from repro500.statuses import REPEAT_FINISHED

_FINISHED = REPEAT_FINISHED


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = untrusted.read_json(path, path.name)  # a run signed here may have been handed over
    except (OSError, InvalidInput):
        return {}
    return doc if isinstance(doc, dict) else {}


def build_statement(run_dir: str | Path, public_key: Ed25519PublicKey, principal: str | None = None) -> dict[str, Any]:
    """The in-toto Statement for a run directory that matches its SHA256SUMS."""
    root = Path(run_dir)
    sums = bundle.read_sums(root)
    subjects = [{"name": rel, "digest": {"sha256": digest}} for rel, digest in sums.items()]
    subjects.append({"name": bundle.SUMS_NAME, "digest": {"sha256": file_digest(root / bundle.SUMS_NAME)}})
    run = _json(root / layout.RUN_JSON)
    manifest = _json(root / layout.MANIFEST)
    statuses = {}
    for k in sorted(int(p.parent.name) for p in (root / "repeats").glob("*/summary.json") if p.parent.name.isdigit()):
        statuses[str(k)] = _json(bundle.repeat_dir(root, k) / layout.REPEAT_SUMMARY).get("status", "unknown")
    verdict = _json(root / layout.VERDICT)
    chain_path = root / chain.CHAIN_NAME
    predicate = {
        "run_id": run.get("run_id", root.name),
        "run_status": run.get("status"),
        "recipe": {"name": run.get("recipe_name"),
                   "digest": {"sha256": file_digest(root / layout.RECIPE)} if (root / layout.RECIPE).is_file() else None},
        "manifest": {"digest": {"sha256": (manifest.get("digest") or {}).get("value")},
                     "canonicalization": "repro500-c14n/v1"},
        "repeats": {"planned": run.get("repeats"), "finished": sum(s in _FINISHED for s in statuses.values()),
                    "status": statuses},
        "chain": {"head": chain.head(root), "links": len(untrusted.read_text(chain_path, "the repeat chain").splitlines())}
        if chain_path.is_file() else None,
        "verdict": {"status": verdict.get("status"), "exit_code": verdict.get("exit_code"),
                    "created_utc": verdict.get("created_utc")} if verdict else None,
        "tool": {"name": "repro500", "version": __version__},
        "signer": {"fingerprint": keys.fingerprint(public_key), "public_key": keys.openssh_public(public_key),
                   "principal": principal},
        "signed_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return {"_type": STATEMENT_TYPE, "subject": sorted(subjects, key=lambda s: s["name"]),
            "predicateType": PREDICATE_TYPE, "predicate": predicate}


def sign_intact(run_dir: str | Path, key_path: str | Path, principal: str | None = None, *,
                force: bool = False) -> Path:
    """Sign a run directory its caller found intact, with an OpenSSH Ed25519 key; returns the
    envelope's path.

    Whether the run is intact is the caller's to ask, before it calls this:
    :func:`repro500.verify.vouching.sign_run` refuses what ``repro500 verify`` would call INVALID
    (the gate lives with verify, a layer above this one).  A signature by another key is replaced
    only with ``force`` (co-signers would otherwise overwrite each other's work); re-signing with
    the same key replaces it.
    """
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    root = Path(run_dir)
    private = keys.load_private_key(key_path)
    public = private.public_key()
    previous = signed_signer(root)
    if previous is not None and previous.get("fingerprint") != keys.fingerprint(public) and not force:
        who = previous.get("fingerprint") or "a key it cannot name (unreadable attestation)"
        raise InvalidInput(f"{root} is already signed by {who}: pass --force to replace that signature")
    payload = canonical_json(build_statement(root, public, principal))
    envelope = Envelope(payload, PAYLOAD_TYPE, {})
    envelope.sign(CryptoSigner(private))
    # the SSH signature first: a crash between the two leaves a mismatch verify reports, never a
    # new envelope beside an old SSH signature that seems to agree with it
    target = root / ENVELOPE_NAME
    try:
        atomic.write_text(root / SSHSIG_NAME, sshsig.sign(payload, private))
        atomic.write_text(target, json.dumps(envelope.to_dict(), sort_keys=True, separators=(",", ":")) + "\n")
    except OSError as err:
        raise InvalidInput(f"cannot write the attestation into {root} ({err.strerror or type(err).__name__}): "
                           "sign a copy you may write to") from None
    return target
