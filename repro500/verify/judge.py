"""``repro500 verify RUN`` from Python: the verdict a run gets, and where it is recorded.

* :func:`verdict_for`: the verdict whoever asks (the command, and ``repro500 run`` of its own run):
  :func:`repro500.verify.verdict.verify_run`'s, with what verify adds for trust folded in (the
  repeat chain, and with ``trust`` / ``check_tracking`` the signature and the MLflow records:
  :mod:`repro500.attest.check`);
* :func:`judge`: the whole command: RUN and the reference may name runs in the MLflow store, and
  the verdict is written where the command writes it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from pathlib import Path

from repro500.attest import check as trust_check
from repro500.rundir import layout
from repro500.rundir.excluded import is_publication_dir
from repro500.statuses import DEFAULT_ALPHA
from repro500.tracking import store as mlflow_store
from repro500.untrusted import plain
from repro500.verify import from_mlflow
from repro500.verify.verdict import Verdict, verify_run, write_verdict


def verdict_for(run_dir: str | Path, *, against: str | Path | None = None, alpha: float = DEFAULT_ALPHA,
                margins: dict[str, float] | None = None, expect_sums_digest: str | None = None,
                across_benchmarks: bool = False, trust: str | Path | None = None, check_tracking: bool = False,
                store: str | None = None) -> Verdict:
    """The verdict of a run directory, packed run or publication, as ``repro500 verify`` decides it.

    The arguments are :func:`~repro500.verify.verdict.verify_run`'s, and: ``trust``, git's
    allowed_signers file the run's signer must be in; ``check_tracking``, compare each repeat with
    its MLflow run (in ``store`` when given, the store the run was read from; else the one its
    run.json names).  A broken chain, signature or disagreement with MLflow makes it INVALID.
    Nothing is written.
    """
    verdict = verify_run(run_dir, against=against, alpha=alpha, margins=margins,
                         expect_sums_digest=expect_sums_digest, across_benchmarks=across_benchmarks)
    trust_check.apply(trust_check.check_run(run_dir, trust=trust, tracking=check_tracking, store=store), verdict)
    # with trust, the signature check and the integrity step's attestation check can name the
    # same change after signing: one sentence, once
    verdict.reasons = list(dict.fromkeys(verdict.reasons))
    if verdict.integrity is not None:
        verdict.integrity.problems = list(dict.fromkeys(verdict.integrity.problems))
    return verdict


def judge(run: str | Path, *, against: str | Path | None = None, alpha: float = DEFAULT_ALPHA,
          margins: dict[str, float] | None = None, expect_sums_digest: str | None = None,
          across_benchmarks: bool = False, trust: str | Path | None = None, check_tracking: bool = False,
          write: bool = True, metrics_path: str | Path | None = None,
          warn: Callable[[str], None] | None = None) -> Verdict:
    """``repro500 verify RUN``: the verdict of :func:`verdict_for`, recorded as the command records it.

    ``run`` and ``against`` may also name a run in the MLflow store (``mlflow:RUN_ID``,
    ``runs:/RUN_ID``): its sealed run is downloaded for the call, the verdict names it as given
    (with the download's name), and ``check_tracking`` compares with that store.  ``verdict.json``
    is written into a run directory unless ``write`` is False (never into a packed run, nor into a
    publication, which stays as published); ``metrics_path`` gets the verdict's numbers as flat
    JSON for DVC (docs/dvc.md).  A ``verdict.json`` that cannot be written does not stop it: the
    sentence goes to ``warn`` (default: a Python warning).
    """
    path, reference = Path(run), Path(against) if against is not None else None
    with contextlib.ExitStack() as stack:
        run_dir, ref = _from_mlflow(stack, path), _from_mlflow(stack, reference)
        # --check-tracking compares with the store the run came from, not the one its run.json names
        # (a path on the machine that made it)
        store = mlflow_store.tracking_uri() if run_dir != path else None
        verdict = verdict_for(run_dir, against=ref, alpha=alpha, margins=margins,
                              expect_sums_digest=expect_sums_digest, across_benchmarks=across_benchmarks,
                              trust=trust, check_tracking=check_tracking, store=store)
        if run_dir != path:  # what the user named (mlflow:RUN_ID), not the temporary download
            verdict.run_dir = f"{path} ({run_dir.name})"
        if ref != reference and isinstance(verdict.against, dict):
            verdict.against["path"] = f"{reference} ({verdict.against.get('path')})"
        if write and run_dir.is_dir() and not is_publication_dir(run_dir):
            try:
                write_verdict(verdict, run_dir)
            except OSError as err:
                text = f"could not write {plain(run_dir / layout.VERDICT)} ({err.strerror})"
                if warn is None:
                    warnings.warn(text, stacklevel=2)
                else:
                    warn(text)
        if metrics_path is not None:
            from repro500.rundir.dvcmetrics import write_metrics

            write_metrics(verdict.to_dict(), Path(metrics_path))
    return verdict


def _from_mlflow(stack: contextlib.ExitStack, ref: Path | None) -> Path | None:
    """A run named in MLflow (mlflow:RUN_ID, runs:/RUN_ID) downloaded as its sealed archive, for as
    long as *stack* lasts; anything else as it is."""
    if not from_mlflow.is_reference(ref):
        return ref
    import tempfile

    tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="repro500-mlflow-"))
    return from_mlflow.download(str(ref), Path(tmp))
