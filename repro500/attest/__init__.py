"""Trust in a run directory: signed in-toto attestations and the repeat chain (docs/trust.md).

* :mod:`repro500.attest.keys`: OpenSSH Ed25519 signing keys and git's ``allowed_signers``;
* :mod:`repro500.attest.chain`: ``chain.jsonl``, every planned repeat chained as it finishes;
* :mod:`repro500.attest.signing`: :func:`sign_intact` (an in-toto Statement in a DSSE envelope, and SSHSIG)
  of a run its caller found intact (:func:`repro500.verify.vouching.sign_run` asks first);
* :mod:`repro500.attest.attestation`: reading one back, :func:`verify_signature`, and what ``verify``
  checks of every signed run;
* :mod:`repro500.attest.tracking_check`: a run's repeats against what MLflow recorded;
* :mod:`repro500.attest.check`: the checks ``repro500 verify --trust / --check-tracking`` adds.

Heavy imports (securesystemslib, mlflow) happen inside the functions that need them, and the package
itself imports none of its modules: every run writes its chain, and importing ``chain`` should not
bring ``cryptography`` into a run that signs nothing (40-80 ms before its first repeat).
"""
