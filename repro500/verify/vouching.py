"""Two acts that vouch for a run and have no driver of their own: signing it, and exporting it as
an MLPerf submission.

Each asks the gate every vouching command shares first (:func:`repro500.verify.integrity.require_intact`:
would ``repro500 verify`` find the run intact?), then has its records package write:
:func:`repro500.attest.signing.sign_intact`, :func:`repro500.mlperf.export.export_intact`.  They
live here, beside the gate, because a records package that asked it would import a driver
(docs/contracts.md, "Layers"); the command, ``repro500 run --sign`` and a Python caller all come
through these two, so none of them vouches for what verify would call INVALID.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from repro500.attest import signing
from repro500.errors import InvalidInput
from repro500.mlperf import export
from repro500.mlperf.export import ExportedTree
from repro500.rundir import archive as archives
from repro500.verify.integrity import require_intact


def sign_run(run_dir: str | Path, key_path: str | Path, principal: str | None = None, *, force: bool = False) -> Path:
    """Sign a run directory with an OpenSSH Ed25519 key; returns the envelope's path.

    The directory must pass what ``repro500 verify`` checks of a run's own files (digests, repeat
    chain, an attestation it already carries).  A signature by another key is replaced only with
    ``force`` (co-signers would otherwise overwrite each other's work); re-signing with the same
    key replaces it.  What is written is :mod:`repro500.attest.signing`'s.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise InvalidInput(f"{root} is not a run directory: nothing to sign")
    # what verify would call INVALID is not vouched for, even with --force: a signature over a
    # replaced repeat, or over files re-sealed after someone else's signature, launders them
    require_intact(root, "refusing to sign it")
    return signing.sign_intact(root, key_path, principal, force=force)


def export_mlperf(
    run: str | Path,
    out: str | Path,
    *,
    submitter: str | None = None,
    system: str | None = None,
    ruleset: str | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> ExportedTree:
    """Write the MLPerf submission tree of ``run`` (a run directory or a packed run) into ``out``.

    ``out`` must not exist or be empty.  ``submitter`` defaults to the logs' ``submission_org``,
    ``system`` to a name made of the hardware, ``ruleset`` to the one the benchmark is judged
    by (training 4.0.0 for ResNet, HPC 3.0.0 for CosmoFlow).  ``progress`` gets one line per step.
    Only an untouched run is exported: one ``repro500 verify`` would call INVALID is refused
    before anything is written.  The tree is :mod:`repro500.mlperf.export`'s.
    """
    root, out = Path(run), Path(out)
    if archives.is_archive(root):
        export.prepare_out(out)  # refused before the archive is unpacked
        with tempfile.TemporaryDirectory(prefix="repro500-export-") as tmp:
            progress(f"unpacking {root}")
            return export_mlperf(archives.unpack(root, tmp), out, submitter=submitter, system=system,
                                 ruleset=ruleset, progress=progress)
    rd = export.open_run(root, out)
    progress(f"checking {root} as repro500 verify does (digests, repeat chain, attestation)")
    require_intact(root, "only an untouched run can be exported")
    return export.export_intact(rd, out, submitter=submitter, system=system, ruleset=ruleset, progress=progress)
