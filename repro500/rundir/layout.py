"""The run directory's layout: the one place that knows where each file of a run lives and how
it is written (atomically) and read (one sentence on a missing or corrupt file, exit 4).

Layout (docs/contracts.md, "Run directory")::

    runs/<run-id>/
      run.json                  repro500/run/v1        identity, status, command, MLflow ids
      recipe.yaml               the resolved recipe (an ad-hoc --command run writes its own)
      manifest.json             repro500/manifest/v1   provenance (capture)
      environment.lock.json     repro500/environment-lock/v1  the experiment's environment, pinned
      requirements.lock.txt     the same pins for an installer (capture/lock.py)
      data-specs.json, code.diff, ...                  written by capture
      repeats/<k>/summary.json  repro500/repeat-summary/v1 (written last: a repeat without one
                                did not finish)
      repeats/<k>/...           metrics.jsonl, params.jsonl, mllog.txt, system.jsonl (trained
                                workloads); stdout.txt, stderr.txt, metrics.json, interpreters.json (commands);
                                system.json (system workloads: ops, roofline, inference, io)
      summary.json              repro500/summary/v1    aggregate across repeats
      SHA256SUMS                digest list of every file above (repro500.rundir.sums)

The runner, the trainer and the command workload write through :class:`RunDir`; digests and
archives are :mod:`repro500.rundir.sums`'s.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.errors import InvalidInput
from repro500.rundir import atomic, ownership
from repro500.rundir import sums as bundle

# Every name is :mod:`repro500.rundir.names`'s (which ``sums`` reads too), handed on from here:
# callers read layout.<NAME>.
from repro500.rundir.names import (  # noqa: F401 - re-exported
    ATTESTATION,
    ATTESTATION_SIG,
    CHECKPOINT,
    CODE_DIFF,
    COMMAND_METRICS,
    DERIVED,
    DVC_FILE,
    ERROR_LOG,
    INPUTS,
    INTERPRETERS,
    LAUNCHER_LOG,
    LOCK,
    LOCK_REQUIREMENTS,
    MANIFEST,
    METRICS,
    MLLOG,
    PARAMS,
    PUBLICATION_INDEX,
    PUBLICATION_PARAMS,
    RANKS,
    RECIPE,
    REPEAT_SUMMARY,
    REPEAT_SUMMARY_SCHEMA,
    REPEATS,
    REPORT,
    RUN_JSON,
    RUN_SCHEMA,
    SCALING,
    SOURCE_INDEX,
    STDERR,
    STDOUT,
    SUMMARY,
    SUMMARY_SCHEMA,
    SUMS_NAME,
    SYSTEM_EPOCHS,
    SYSTEM_RECORD,
    VERDICT,
)
from repro500.statuses import REPEAT_FINISHED

REPEAT_ARTIFACTS = (REPEAT_SUMMARY, METRICS, MLLOG, STDOUT, STDERR, ERROR_LOG, LAUNCHER_LOG, SYSTEM_RECORD, SYSTEM_EPOCHS)


def node_launcher_log(node_rank: int) -> str:
    """Another node's launcher log of a failed multi-node repeat, sent to node 0 and kept here."""
    return f"launcher-node-{node_rank}.log"


FINISHED_STATUSES = REPEAT_FINISHED


def carries_attestation(run_dir: str | Path) -> bool:
    """Whether the run (or what claims to be one) holds a signature's files, even a link to nothing:
    an unsigned run needs none of the signature machinery (cryptography: 0.1 s to import)."""
    root = Path(run_dir)
    return any((root / name).exists() or (root / name).is_symlink() for name in (ATTESTATION, ATTESTATION_SIG))


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object the run must have (``what`` names it); InvalidInput naming the file when it
    is missing or malformed.  verify, the runner and every other reader share this rule."""
    try:
        # a run directory may be someone else's: regular files only, capped, depth-checked
        data = untrusted.read_bytes(path, what)
    except FileNotFoundError:
        raise InvalidInput(f"{path} is missing: {what} is required in a run directory") from None
    value = untrusted.load_json(data, str(path))
    if not isinstance(value, dict):
        raise InvalidInput(f"{path} must hold a JSON object ({what})")
    return value


class RunDir:
    """One run directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    def file(self, name: str) -> Path:
        return self.path / name

    # ----- creation ---------------------------------------------------------------------------
    def create(self, recipe_yaml: str, meta: dict[str, Any]) -> None:
        """Create the directory with ``recipe.yaml`` and ``run.json`` first, so that a run stopped at
        any later point can be resumed (and its --run-id is not left unusable)."""
        try:
            self.path.mkdir(parents=True)
            atomic.write_text(self.file(RECIPE), recipe_yaml)
            self.write_meta(meta)
        except FileExistsError:
            raise InvalidInput(f"run directory {self.path} already exists; choose another --run-id") from None
        except OSError as err:
            raise InvalidInput(f"cannot write the run directory {self.path} ({err.strerror or err}); "
                               "choose a writable --out directory") from None

    def exists(self) -> bool:
        return self.path.exists()

    def is_run(self) -> bool:
        return self.file(RUN_JSON).is_file()

    # ----- run.json -----------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        if not self.is_run():
            raise InvalidInput(f"{self.path} is not a repro500 run directory (no run.json)")
        doc = read_json(self.file(RUN_JSON), "run.json")
        if doc.get("schema") != RUN_SCHEMA:
            raise InvalidInput(f"{self.file(RUN_JSON)} is not a {RUN_SCHEMA} document")
        return doc

    def write_meta(self, meta: dict[str, Any]) -> None:
        atomic.write_json(self.file(RUN_JSON), meta)

    # ----- repeats ------------------------------------------------------------------------------
    def repeat(self, k: int) -> Path:
        return bundle.repeat_dir(self.path, k)

    def fresh_repeat(self, k: int) -> Path:
        """Repeat k's directory, emptied: an unfinished attempt starts afresh with the same seeds,
        keeping only the state its command saved in ``checkpoint/`` to continue from."""
        out = self.repeat(k)
        if out.exists():
            for entry in out.iterdir():
                if entry.name == CHECKPOINT and entry.is_dir() and not entry.is_symlink():
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        out.mkdir(parents=True, exist_ok=True)
        return out

    def repeat_summary(self, k: int) -> dict[str, Any] | None:
        """Repeat k's summary, or None when it has none (or an unreadable one: not finished)."""
        path = self.repeat(k) / REPEAT_SUMMARY
        if not path.is_file():
            return None
        try:
            doc = untrusted.load_json(untrusted.read_bytes(path, "a repeat's summary"), str(path))
        except (OSError, InvalidInput):
            return None
        return doc if isinstance(doc, dict) else None

    def write_repeat_summary(self, k: int, summary: dict[str, Any]) -> Path:
        path = self.repeat(k) / REPEAT_SUMMARY
        atomic.write_json(path, summary)
        return path

    def summaries(self, planned: int, *, finished_only: bool) -> dict[int, dict[str, Any]]:
        """Repeat summaries of 0..planned-1: the finished ones (completed or diverged: kept by
        ``--resume``), or every one that exists (failed and killed too, for the aggregate)."""
        out = {}
        for k in range(untrusted.count(planned, f"{self.file(RUN_JSON)}'s planned repeats")):
            doc = self.repeat_summary(k)
            if doc is not None and (not finished_only or doc.get("status") in FINISHED_STATUSES):
                out[k] = doc
        return out

    def repeat_artifacts(self, k: int) -> list[Path]:
        return [p for p in (self.repeat(k) / n for n in REPEAT_ARTIFACTS) if p.is_file()]

    # ----- the run's own documents --------------------------------------------------------------
    def write_summary(self, doc: dict[str, Any]) -> None:
        atomic.write_json(self.file(SUMMARY), doc)

    def summary(self) -> dict[str, Any]:
        return read_json(self.file(SUMMARY), "the aggregate summary")

    def manifest_path(self) -> Path:
        return self.file(MANIFEST)

    def write_inputs(self, doc: dict[str, Any]) -> None:
        atomic.write_json(self.file(INPUTS), doc)

    def inputs(self) -> dict[str, Any]:
        """The observed inputs ({} for a run that has none: a trained one, or older)."""
        return read_inputs(self.file(INPUTS))

    def seal(self) -> Path:
        """(Re)write the digest list over every covered file (repro500.rundir.sums), and remember
        that this machine's repro500 made the run as it now is: only such a run is one's own, whose
        code runs without consent (repro500.rundir.ownership.origin_of)."""
        sums = bundle.write_sums(self.path)
        ownership.record_own_run(self.path)
        return sums


# ----- the reading rules every reader shares -------------------------------------------------------
# A document the run must have is read with :func:`read_json` (missing: InvalidInput); one that
# may be absent (an older run, a single-process run) with :func:`read_optional_json` ({} when
# absent); either way a file that exists but does not parse is InvalidInput: the run is corrupt.
def read_optional_json(path: Path) -> dict[str, Any]:
    try:
        value = untrusted.load_json(untrusted.read_bytes(path, "a run directory's JSON file"), str(path))
    except FileNotFoundError:
        return {}
    return value if isinstance(value, dict) else {}


def read_inputs(path: Path) -> dict[str, Any]:
    """inputs.json ({} when absent), its lists checked to be lists of objects: every reader walks
    ``observed`` and ``skipped`` entry by entry, and a string there is walked character by character."""
    doc = read_optional_json(path)
    for key in ("observed", "skipped"):
        value = doc.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(e, dict) for e in value)):
            raise InvalidInput(f"{path}: {key} is {untrusted.plain(repr(value))[:60]}, not a list of objects: "
                               "the file is corrupt")
    return doc


def read_optional_yaml(path: Path) -> dict[str, Any]:
    try:
        value = untrusted.load_yaml(untrusted.read_text(path, "a run directory's YAML file"), str(path))
    except FileNotFoundError:
        return {}
    return value if isinstance(value, dict) else {}


def metric_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of a repeat's ``metrics.jsonl`` and how many lines could not be read: a line
    cut short by a crash is skipped, the others still count (no records when the file is absent)."""
    records: list[dict[str, Any]] = []
    skipped = 0
    try:
        lines = untrusted.log_lines(path, "a repeat's metrics log")
    except FileNotFoundError:
        return records, 0
    for line in lines:
        if not line.strip():
            continue
        record = untrusted.json_record(line)
        if record is None:
            skipped += 1
        else:
            records.append(record)
    return records, skipped


def first_system_record(run_dir: Path) -> dict[str, Any] | None:
    """The ``system.json`` of the first repeat that has one (a system workload's record)."""
    for k in repeat_indices(run_dir):
        try:
            return untrusted.read_json(RunDir(run_dir).repeat(k) / SYSTEM_RECORD, "a repeat's system record")
        except (OSError, InvalidInput):
            continue
    return None


def own_code(run_dir: str | Path) -> tuple[str, list[str]] | None:
    """(kind, what) of the experiment's own code a rerun of the run would execute, or None (built-ins
    only): the files of the run's ``source/``, else the recipe keys that name code to import (every
    such door, as :func:`repro500.untrusted.import_refs` lists them).  What resuming, reproducing
    and replaying a run that is not one's own ask consent for (:func:`repro500.untrusted.consent`)."""
    recipe = untrusted.load_yaml(untrusted.read_text(Path(run_dir) / RECIPE, "the run's recipe"),
                                 str(Path(run_dir) / RECIPE)) or {}
    fixed = recipe.get("fixed") or {}
    files = [str(e["path"]) for e in (read_optional_json(Path(run_dir) / SOURCE_INDEX).get("files") or [])
             if isinstance(e, dict) and "path" in e]
    if fixed.get("workload") == "command":
        return "command", files
    refs = untrusted.import_refs(recipe)
    if files or refs:
        return "plug-in", files or [f"{key}: {value}" for key, value in refs]
    return None


def own_code_said(code: tuple[str, list[str]], first: int = 5) -> str:
    """``kind: a, b, c, d, e and N more``, as the consent's sentence names a run's own code (names
    are the run's, made plain for one terminal line)."""
    kind, what = code
    if not what:
        return untrusted.plain(kind)
    more = f" and {len(what) - first} more" if len(what) > first else ""
    return untrusted.plain(f"{kind}: {', '.join(what[:first])}{more}")


def repeat_indices(run_dir: Path) -> list[int]:
    """The repeats that have a directory, in order (``repeats/<k>`` with k a number)."""
    root = Path(run_dir) / REPEATS
    if not root.is_dir():
        return []
    return sorted(int(c.name) for c in root.iterdir() if c.name.isdigit() and c.is_dir() and not c.is_symlink())
