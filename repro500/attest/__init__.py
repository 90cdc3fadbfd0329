"""Trust in a run directory: signed in-toto attestations and the repeat chain (docs/trust.md).

* :mod:`repro500.attest.keys`: OpenSSH Ed25519 signing keys and git's ``allowed_signers``;
* :mod:`repro500.attest.chain`: ``chain.jsonl``, every planned repeat chained as it finishes;
* :mod:`repro500.attest.signing`: :func:`sign_intact` (an in-toto Statement in a DSSE envelope, and SSHSIG)
  of a run its caller found intact (:func:`repro500.verify.vouching.sign_run` asks first);
* :mod:`repro500.attest.attestation`: reading one back, :func:`verify_signature`, and what ``verify``
  checks of every signed run;
* :mod:`repro500.attest.tracking_check`: a run's repeats against what MLflow recorded;
* :mod:`repro500.attest.check`: the checks ``repro500 verify --trust / --check-tracking`` adds.

Heavy imports (securesystemslib, mlflow) happen inside the functions that need them.
"""

from __future__ import annotations

from repro500.attest.attestation import (
    ATTESTATION_NAMES,
    ENVELOPE_NAME,
    PREDICATE_TYPE,
    SSHSIG_NAME,
    SignatureResult,
    verify_signature,
)
from repro500.attest.chain import CHAIN_NAME
from repro500.attest.signing import sign_intact

__all__ = ["ATTESTATION_NAMES", "CHAIN_NAME", "ENVELOPE_NAME", "PREDICATE_TYPE", "SSHSIG_NAME",
           "SignatureResult", "sign_intact", "verify_signature"]
