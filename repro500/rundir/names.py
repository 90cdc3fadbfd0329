"""The names of a run directory's files and of a publication's, and the run's document schemas:
one owner, so that no other module spells them.

This module imports nothing of repro500's: :mod:`repro500.rundir.sums` (the digest list) and
:mod:`repro500.rundir.layout` (which reads and writes the files, and imports ``sums``) both take
their names from here, and ``layout`` hands them on to everyone else (``layout.VERDICT``).
Where each file lives and what it holds: ``layout``'s docstring and docs/contracts.md.
"""

from __future__ import annotations

from pathlib import PurePosixPath

# ----- the run's documents ---------------------------------------------------------------------
RUN_SCHEMA = "repro500/run/v1"
SUMMARY_SCHEMA = "repro500/summary/v1"
REPEAT_SUMMARY_SCHEMA = "repro500/repeat-summary/v1"
# documents that one module writes and another (often another layer) checks: each id spelt once, here
MANIFEST_SCHEMA = "repro500/manifest/v1"
LOCK_SCHEMA = "repro500/environment-lock/v1"
RECIPE_SCHEMA = "repro500/recipe/v1"
PUBLISHED_SCHEMA = "repro500/published/v1"
SCALING_SCHEMA = "repro500/scaling/v1"

RUN_JSON = "run.json"
RECIPE = "recipe.yaml"
MANIFEST = "manifest.json"
INPUTS = "inputs.json"  # what a wrapped command read (capture/inputs.py), written when the repeats end
# The environment as a package installer can rebuild it (capture/lock.py), written with the manifest
LOCK = "environment.lock.json"
LOCK_REQUIREMENTS = "requirements.lock.txt"  # the same pins for pip install -r / uv pip install -r
SUMMARY = "summary.json"
CODE_DIFF = "code.diff"
REPEATS = "repeats"
SUMS_NAME = "SHA256SUMS"
SOURCE_DIR = "source"  # the experiment's files as the run found them (capture/source.py)
SOURCE_INDEX = "source.json"  # what source/ holds: each file's path and digest

# ----- per repeat: what the trainer writes, and what the repeat's MLflow run gets as artifacts -----
REPEAT_SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
PARAMS = "params.jsonl"
MLLOG = "mllog.txt"
RANKS = "ranks.json"
ERROR_LOG = "error.log"
STDOUT = "stdout.txt"
STDERR = "stderr.txt"
INTERPRETERS = "interpreters.json"  # a command's: the Pythons its processes ran (capture/interpreters.py)
LAUNCHER_LOG = "launcher.log"  # a failed distributed repeat's launcher output (node 0's, or the only node's)
SYSTEM_RECORD = "system.json"  # a system workload's full record of the repeat (repro500.system, docs/system.md)
SYSTEM_EPOCHS = "system.jsonl"  # a trained repeat's energy, utilization and data wait, one line per epoch
COMMAND_METRICS = "metrics.json"  # a command's own metrics file ($REPRO500_METRICS, docs/command.md)
# a command's own saved state ($REPRO500_CHECKPOINT_DIR): the one part of a repeat's directory kept
# when the repeat runs again (requeued, resumed), for the command to continue from
CHECKPOINT = "checkpoint"

# ----- derived views: rewritten by verify, report, sign and model, so the digest list leaves them out
VERDICT = "verdict.json"
REPORT = "report.html"
ATTESTATION = "attestation.intoto.jsonl"  # the signed statement (the attestation signs SHA256SUMS)
ATTESTATION_SIG = "attestation.sig"  # the same signature as `ssh-keygen -Y verify` checks it
DERIVED = "derived"  # a folder of derived views
SCALING = PurePosixPath(DERIVED) / "scaling.json"  # repro500 model's scaling document

# ----- a publication (repro500 publish): its own files beside the run's archive ---------------------
PUBLICATION_INDEX = "publication.json"
PUBLICATION_PARAMS = "params.yaml"  # also what `repro500 init` writes for DVC
DVC_FILE = "dvc.yaml"  # also what `repro500 init` writes

# ----- a reproduction's rebuilt environment (reproduce --env venv): OUT/env/<ENV_MARKER> says
# repro500 built it, so a replay may run the interpreter the rerun recorded there
ENV_MARKER = ".repro500-built"
