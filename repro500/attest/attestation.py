"""Reading and checking a run's attestation (what :mod:`repro500.attest.signing` writes): the
envelope's signature, the files it names against the run's own, and the SSH signature beside it.
``verify`` asks it of every signed run; ``verify --trust`` also asks who signed.

* ``attestation.intoto.jsonl``: an in-toto attestation bundle (JSON Lines, one DSSE envelope a
  line); its payload is an in-toto Statement v1 whose subjects are every file ``SHA256SUMS``
  lists plus ``SHA256SUMS`` itself, and whose predicate (:data:`PREDICATE_TYPE`) is the run's
  provenance;
* ``attestation.sig``: an SSH signature (namespace ``repro500``) over the exact Statement bytes,
  so that ``ssh-keygen -Y verify`` checks the run without repro500 (docs/trust.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from repro500 import untrusted
from repro500.attest import chain, keys, sshsig
from repro500.digest import file_digest
from repro500.errors import InvalidInput
from repro500.rundir import layout
from repro500.rundir import sums as bundle

ENVELOPE_NAME = layout.ATTESTATION
SSHSIG_NAME = layout.ATTESTATION_SIG
ATTESTATION_NAMES = frozenset({ENVELOPE_NAME, SSHSIG_NAME})
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "https://repro500.dev/run-provenance/v1"

def signed_signer(run_dir: str | Path) -> dict[str, Any] | None:
    """The signer block of a run's attestation as written, NOT verified (None when unsigned)."""
    for envelope in _envelopes(Path(run_dir) / ENVELOPE_NAME):
        try:
            signer = _payload(envelope)["predicate"]["signer"]
            return signer if isinstance(signer, dict) else {}
        except (ValueError, KeyError, TypeError):
            return {}
    return None


@dataclass
class SignatureResult:
    valid: bool = False
    principal: str | None = None
    fingerprint: str | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    statement: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, "principal": self.principal, "fingerprint": self.fingerprint,
                "problems": self.problems, "notes": self.notes}


def _envelopes(path: Path) -> list[Any]:
    """The in-toto DSSE envelopes of a bundle; lines that are not one are ignored (bundle spec)."""
    if not path.is_file():
        return []
    return _parse_envelopes(untrusted.read_bytes(path, "the run's attestation").decode("utf-8", errors="replace"))


def _payload(envelope: Any) -> Any:
    """An envelope's payload as JSON; ValueError when it is not (nesting bounded as for any file)."""
    try:
        return untrusted.load_json(envelope.payload, "the attestation's payload")
    except InvalidInput as err:
        raise ValueError(str(err)) from None


def _parse_envelopes(text: str) -> list[Any]:
    from securesystemslib.dsse import Envelope

    out = []
    for line in text.splitlines():
        try:
            doc = untrusted.json_record(line)
            if doc is not None and doc.get("payloadType") == PAYLOAD_TYPE:
                out.append(Envelope.from_dict(doc))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def verify_signature(run_dir: str | Path, allowed_signers_path: str | Path) -> SignatureResult:
    """Check a run's signature and signer against an allowed_signers file, and its subjects on disk."""
    from securesystemslib.exceptions import UnverifiedSignatureError
    from securesystemslib.signer import SSlibKey

    root = Path(run_dir)
    entries = keys.parse_allowed_signers(allowed_signers_path)
    result = SignatureResult()
    envelope_path = root / ENVELOPE_NAME
    envelopes = _envelopes(envelope_path)
    if not envelopes:
        what = "holds no in-toto DSSE envelope" if envelope_path.exists() else "is missing"
        result.problems.append(f"the run is not signed: {ENVELOPE_NAME} {what} (sign it with `repro500 sign`)")
        return result
    trusted = {}
    for entry in entries:
        pub = entry.public_key
        if pub is not None and keys.trusted_entries([entry], pub):
            trusted.setdefault(SSlibKey.from_crypto(pub).keyid, (pub, []))[1].append(entry)
    accepted = None
    for envelope in envelopes:
        try:
            verified = envelope.verify([SSlibKey.from_crypto(pub) for pub, _ in trusted.values()], 1) if trusted else {}
        except UnverifiedSignatureError:
            verified = {}
        if verified:
            accepted = (envelope, *trusted[next(iter(verified))])
            break
    if accepted is None:
        result.problems.append(_why_untrusted(envelopes[0], entries, allowed_signers_path))
        return result
    envelope, public, matching = accepted
    result.fingerprint = keys.fingerprint(public)
    try:
        statement = _payload(envelope)
        predicate = statement["predicate"]
        subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    except (ValueError, KeyError, TypeError):
        result.problems.append("the signed payload is not a repro500 in-toto Statement")
        return result
    result.statement = statement
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
        result.problems.append(f"the signed statement is not a {PREDICATE_TYPE} in-toto Statement v1")
    claimed = (predicate.get("signer") or {}).get("principal") if isinstance(predicate, dict) else None
    names = sorted({p for e in matching for p in e.principals})
    if claimed is not None and not any(e.allows_principal(claimed) for e in matching):
        result.problems.append(f"key {result.fingerprint} is trusted for {', '.join(names)}, "
                               f"not for the principal {claimed!r} the signature names")
    plain = [n for n in names if not n.startswith("!") and not any(c in n for c in "*?")]
    result.principal = claimed or (plain[0] if plain else names[0])
    result.problems += _subject_problems(root, subjects)
    signed_head = ((predicate.get("chain") or {}) if isinstance(predicate, dict) else {}).get("head")
    if signed_head != chain.head(root):
        result.problems.append(f"{chain.CHAIN_NAME}'s head is not the one signed: the repeat chain changed after signing")
    _check_sshsig(root, envelope.payload, public, result)
    result.valid = not result.problems
    return result


def attestation_problems(run_dir: str | Path) -> list[str]:
    """Whether the attestation a run carries still holds, judged by the key it names itself.

    No trust decision (that needs ``verify --trust``): what this catches is an attestation that
    no longer describes the run, as an edited envelope, files or a chain changed after signing
    (``SHA256SUMS`` re-sealed included), or an ``attestation.sig`` over another statement.  Every
    command that vouches for a run runs it (repro500.verify.integrity), so a signed run that was
    altered is refused without an allowed_signers file.  An unsigned run has no problem here.
    The files ``SHA256SUMS`` lists are not hashed again: the digest check before this one did."""
    from securesystemslib.exceptions import UnverifiedSignatureError
    from securesystemslib.signer import SSlibKey


    root = Path(run_dir)
    envelope_path = root / ENVELOPE_NAME
    if not layout.carries_attestation(root):
        return []
    try:
        envelopes = _parse_envelopes(untrusted.read_text(envelope_path, "the run's attestation"))
    except FileNotFoundError:  # attestation.sig alone, or the envelope a link to nothing
        return [f"{ENVELOPE_NAME} is missing beside {SSHSIG_NAME}: the attestation is incomplete"]
    except InvalidInput as err:
        return [str(err)]
    if not envelopes:
        return [f"{ENVELOPE_NAME} holds no in-toto DSSE envelope: the attestation was cut or overwritten"]
    statement = None
    for envelope in envelopes:
        try:
            doc = _payload(envelope)
            named = keys.AllowedSigner(["-"], keys.ED25519, doc["predicate"]["signer"]["public_key"].split()[1])
            public = named.public_key
            key = SSlibKey.from_crypto(public)
            key.verify_signature(envelope.signatures[key.keyid], envelope.pae())
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, UnverifiedSignatureError):
            return [f"the signature in {ENVELOPE_NAME} does not verify with the key it names: "
                    "the envelope was edited or forged"]
        if statement is None:
            statement, payload, signer_key = doc, envelope.payload, public
    try:
        predicate = statement["predicate"]
        subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    except (KeyError, TypeError):
        return ["the signed payload is not a repro500 in-toto Statement"]
    problems = []
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
        problems.append(f"the signed statement is not a {PREDICATE_TYPE} in-toto Statement v1")
    problems += _subject_problems(root, subjects, rehash=False)
    block = predicate.get("chain") if isinstance(predicate, dict) else None
    signed_head = block.get("head") if isinstance(block, dict) else None
    try:
        head = chain.head(root)
    except InvalidInput as err:  # an unreadable chain.jsonl: the chain check names it
        head = str(err)
    if signed_head != head:
        problems.append(f"{chain.CHAIN_NAME}'s head is not the one signed: the repeat chain changed after signing")
    sshsig_check = SignatureResult()
    _check_sshsig(root, payload, signer_key, sshsig_check)
    return problems + sshsig_check.problems


def _why_untrusted(envelope: Any, entries: list[keys.AllowedSigner], trust_path: str | Path) -> str:
    """One sentence: a forged/edited envelope, or a good signature by a key nobody trusts."""
    from securesystemslib.exceptions import UnverifiedSignatureError
    from securesystemslib.signer import SSlibKey

    try:
        signer = _payload(envelope)["predicate"]["signer"]
        claimed = keys.AllowedSigner(["-"], keys.ED25519, signer["public_key"].split()[1]).public_key
        key = SSlibKey.from_crypto(claimed)
        signature = envelope.signatures.get(key.keyid)
        if signature is None:
            raise KeyError
        key.verify_signature(signature, envelope.pae())
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, UnverifiedSignatureError):
        return (f"the signature in {ENVELOPE_NAME} does not verify: the envelope was edited or forged "
                f"(or signed by a key {trust_path} does not hold)")
    fp = keys.fingerprint(claimed)
    named = [e for e in entries if e.public_key is not None and keys.public_blob(e.public_key) == keys.public_blob(claimed)]
    if named:
        return (f"the run is signed by {fp}, which {trust_path} lists but not for namespace "
                f"{keys.NAMESPACE!r} or not at this time (see its namespaces/valid-* options)")
    who = f" (it names itself {signer.get('principal')!r})" if signer.get("principal") else ""
    return f"the run is signed by key {fp}{who}, which {trust_path} does not trust"


def _subject_problems(root: Path, subjects: dict[str, str], *, rehash: bool = True) -> list[str]:
    """The signed subjects against SHA256SUMS and the files; ``rehash=False`` takes the files that
    SHA256SUMS lists as checked already (integrity's first step hashes every one of them)."""
    problems = []
    try:
        sums = bundle.read_sums(root)
    except InvalidInput as err:
        return [str(err)]
    expected = {**sums, bundle.SUMS_NAME: None}
    unsigned = sorted(set(expected) - set(subjects))
    unlisted = sorted(set(subjects) - set(expected))
    if unsigned or unlisted:
        parts = ([f"listed in SHA256SUMS but not signed: {_few(unsigned)}"] if unsigned else []) + \
                ([f"signed but not in SHA256SUMS: {_few(unlisted)}"] if unlisted else [])
        problems.append("the signed subjects are not the files SHA256SUMS lists (" + "; ".join(parts) + ")")
    changed, missing = [], []
    for name, digest in sorted(subjects.items()):
        path = root / name
        if name != bundle.SUMS_NAME and sums.get(name) not in (None, digest):
            changed.append(name)
        elif not rehash and name in sums:
            continue
        elif not path.is_file():
            missing.append(name)
        elif file_digest(path) != digest:
            changed.append(name)
    if changed:
        problems.append(f"changed after signing (digest differs from the signed statement): {_few(changed)}")
    if missing:
        problems.append(f"signed but missing: {_few(missing)}")
    return problems


def _few(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _check_sshsig(root: Path, payload: bytes, public: Ed25519PublicKey, result: SignatureResult) -> None:
    path = root / SSHSIG_NAME
    if not path.is_file():
        result.notes.append(f"no {SSHSIG_NAME}: ssh-keygen -Y verify cannot check this run (the DSSE signature holds)")
        return

    try:
        # every verify of a signed run reads it now, --trust or not: a regular file under the cap
        text = untrusted.read_bytes(path, "the attestation's SSH signature").decode("utf-8", errors="replace")
    except InvalidInput as err:
        result.problems.append(str(err))
        return
    try:
        signer = sshsig.verify(text, payload)
    except ValueError as err:
        result.problems.append(f"{SSHSIG_NAME} does not sign the attested statement ({err})")
        return
    if keys.public_blob(signer) != keys.public_blob(public):
        result.problems.append(f"{SSHSIG_NAME} is signed by another key ({keys.fingerprint(signer)}) than the envelope")
