"""Integrity: is this run directory what the run wrote?

Checks, in order (docs/verify.md, "Integrity"):

1. every file against ``SHA256SUMS`` (edited, missing or extra files make the verdict INVALID);
2. optionally the digest of ``SHA256SUMS`` itself against one published elsewhere;
3. ``manifest.json``: schema and its canonical digest (``repro500-c14n/v1``);
4. ``run.json`` schema, and the attestation of a signed run against the files, by the key it
   names (repro500.attest.attestation.attestation_problems; who may sign is ``verify --trust``'s);
5. every planned repeat accounted for (run.json, summary.json, recipe.yaml and the manifest
   agree on how many; each has its own ``repeats/<k>/summary.json``, seeds as planned, the world
   size and engine run.json records), and the aggregate ``summary.json`` recomputed from the
   per-repeat summaries;
6. cross-file consistency (summary values vs ``metrics.jsonl`` epoch records, final
   parameter digests vs ``params.jsonl``): reported as warnings, not INVALID, because they
   depend on how a workload defines its summary metric;
7. data files re-hashed where they are present, compared with the manifest's data facet.

Commands that vouch for a run (publish, pack, sign, export, reproduce of a packed run) refuse
what ``verify`` would call INVALID through :func:`require_intact`: these steps but 6 and 7, and the
repeat chain, with the sentence ``verify`` prints.

What this does and does not detect: ``SHA256SUMS`` catches accidental corruption and
naive edits.  Someone who edits a number, recomputes the aggregate *and* rewrites
``SHA256SUMS`` produces a self-consistent directory; nothing inside a directory can
prevent that.  The defence is an anchor kept elsewhere: the ``sums_digest`` printed by
``repro500 verify``/``pack`` (publish it, or compare with ``--expect-sums``), the MLflow
run's metrics, or the archive's SHA-256.  Step 6 catches a forger who forgets the
``metrics.jsonl`` records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500 import recorded_paths, untrusted
from repro500.digest import canonical_digest, file_digest
from repro500.errors import InvalidInput
from repro500.progress import human_bytes
from repro500.rundir import layout
from repro500.rundir import sums as bundle
from repro500.rundir.names import MANIFEST_SCHEMA
from repro500.statuses import REPEAT_STATUSES, RUN_UNFINISHED
from repro500.verify.rundir import RunData, load_run


@dataclass
class IntegrityResult:
    """Problems make the verdict INVALID; warnings are shown but do not change it."""

    label: str = "run"
    sums: dict[str, Any] = field(default_factory=dict)
    sums_digest: str | None = None
    files_checked: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_carried: list[dict[str, Any]] = field(default_factory=list)  # {path, bytes, sha256}: sealed, not here

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "ok": self.ok, "sums": self.sums, "sums_digest": self.sums_digest,
            "files_checked": self.files_checked, "problems": self.problems,
            "warnings": self.warnings, "notes": self.notes, "not_carried": self.not_carried,
        }


def check_files(run_dir: str | Path, *, label: str = "run", expect_sums_digest: str | None = None,
                not_carried: Sequence[Mapping[str, Any]] = ()) -> IntegrityResult:
    """Steps 1-4: digests, manifest and run.json (no summary parsing needed).

    ``not_carried`` is the list a publication records of the files it left out of its archive
    (``{path, bytes, sha256}``, checked by repro500.rundir.excluded.read_list): those absent
    here are reported as not carried instead of missing.  A run directory on its own has no
    such list, so a file it lacks is missing."""
    root = Path(run_dir)
    if not root.is_dir():
        raise InvalidInput(f"{root} is not a run directory (it does not exist or is not a directory)")
    result = IntegrityResult(label=label)
    # raises InvalidInput when SHA256SUMS is missing/malformed
    report = bundle.check_sums(root, not_carried={str(e["path"]): str(e["sha256"]) for e in not_carried})
    result.sums = report.as_dict()
    absent = set(report.not_carried)
    result.not_carried = [dict(e) for e in not_carried if e["path"] in absent]
    if result.not_carried:
        result.notes.append(not_carried_note(result.not_carried))
    result.files_checked = len(bundle.read_sums(root)) - len(absent)
    result.sums_digest = file_digest(root / bundle.SUMS_NAME)
    if not report.ok:
        result.problems.append(f"files do not match SHA256SUMS ({report.describe()})")
    if expect_sums_digest and expect_sums_digest.strip().lower() != result.sums_digest:
        result.problems.append(
            f"SHA256SUMS has digest {result.sums_digest}, not the expected {expect_sums_digest.strip()}"
        )
    _check_manifest(root / layout.MANIFEST, result)
    _check_run_json(root / layout.RUN_JSON, result)
    if layout.carries_attestation(root):  # else the signature machinery is not even imported
        from repro500.attest.attestation import attestation_problems

        result.problems += attestation_problems(root)
    return result


def not_carried_note(entries: Sequence[Mapping[str, Any]]) -> str:
    """``2 files (412.0 MB) not carried, digests recorded: repeats/0/checkpoint.pt, ...``"""
    paths = [str(e["path"]) for e in entries]
    shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    size = human_bytes(sum(int(e["bytes"]) for e in entries))
    return f"{len(paths)} file{'s' if len(paths) != 1 else ''} ({size}) not carried, digests recorded: {shown}"


def check_run(run_dir: str | Path, *, label: str = "run", expect_sums_digest: str | None = None,
              deep: bool = True, not_carried: Sequence[Mapping[str, Any]] = ()) -> tuple[IntegrityResult, RunData | None]:
    """Every integrity step, in order; the run's data is returned when the files could be read.

    This is the one place that decides whether a run directory is what the run wrote: a check
    of a signature or of a chain of repeat digests belongs here, next to the others.  ``deep``
    adds the consistency warnings and the re-hashing of data files (steps 6 and 7)."""
    result = check_files(run_dir, label=label, expect_sums_digest=expect_sums_digest, not_carried=not_carried)
    if not result.ok:
        return result, None
    run = load_run(run_dir)
    check_repeats(run, result)
    check_aggregate(run, result)
    if deep:
        check_consistency(run, result)
        check_data(run, result)
    return result, run


def intact_problems(run_dir: str | Path, *, not_carried: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """What ``repro500 verify`` calls INVALID about a run directory's own files, in the order it
    lists them: the repeat chain first (repro500.attest.check, as verify folds it in), then steps
    1-5.  Empty for an intact run.

    The data files (step 7) are left out: they are not the run's own files, and re-hashing a data
    set on every pack or publish would cost more than the run's files; verify still checks them."""
    from repro500.attest import check as trust_check

    result, _ = check_run(run_dir, deep=False, not_carried=not_carried)
    return trust_check.check_run(run_dir).problems + result.problems


def require_intact(run_dir: str | Path, action: str, *, shown: str | Path | None = None,
                   not_carried: Sequence[Mapping[str, Any]] = ()) -> None:
    """InvalidInput unless ``verify`` would find the run directory intact (:func:`intact_problems`).

    The one gate of every command that vouches for a run (publish, pack, sign, export, reproduce
    of a packed run), called before it writes anything: its sentence is the first problem exactly
    as ``verify`` prints it, then ``action`` (what is not done).  ``shown`` names the run as the
    user gave it (an archive unpacked into a temporary directory)."""
    problems = intact_problems(run_dir, not_carried=not_carried)
    if not problems:
        return
    more = len(problems) - 1
    also = f"; and {more} more, which repro500 verify lists" if more else ""
    raise InvalidInput(f"{shown or run_dir} would not verify ({problems[0]}{also}): {action}")


def _load_for_check(path: Path, result: IntegrityResult) -> dict[str, Any] | None:
    try:
        value = untrusted.load_json(untrusted.read_bytes(path, path.name), str(path))
    except (OSError, InvalidInput) as err:
        result.problems.append(f"{path.name} is not readable JSON ({untrusted.plain(err, untrusted.SENTENCE_CHARS) if isinstance(err, InvalidInput) else err.__class__.__name__})")
        return None
    if not isinstance(value, dict):
        result.problems.append(f"{path.name} is not a JSON object")
        return None
    return value


def _check_manifest(path: Path, result: IntegrityResult) -> None:
    if not path.exists():
        result.problems.append("manifest.json is missing: the run's provenance cannot be checked")
        return
    manifest = _load_for_check(path, result)
    if manifest is None:
        return
    if manifest.get("schema") != MANIFEST_SCHEMA:
        result.problems.append(f"manifest.json has schema {manifest.get('schema')!r}, expected {MANIFEST_SCHEMA!r}")
        return
    if not isinstance(manifest.get("facets"), dict):
        result.problems.append("manifest.json has no 'facets' object")
    recorded = manifest.get("digest")
    if not isinstance(recorded, dict) or not isinstance(recorded.get("value"), str):
        result.problems.append("manifest.json has no digest.value: it cannot be checked")
        return
    body = {k: v for k, v in manifest.items() if k != "digest"}
    try:
        actual = canonical_digest(body)
    except ValueError:  # NaN/Infinity in the manifest: not canonical JSON
        result.problems.append("manifest.json contains NaN or Infinity: not canonical JSON")
        return
    if actual != recorded["value"]:
        result.problems.append(
            f"manifest.json digest mismatch: recorded {recorded['value'][:12]}..., recomputed {actual[:12]}... "
            "(the manifest was edited after capture)"
        )


def _check_run_json(path: Path, result: IntegrityResult) -> None:
    if not path.exists():
        result.notes.append("run.json is absent (older or hand-made run directory)")
        return
    doc = _load_for_check(path, result)
    if doc is not None and doc.get("schema") != bundle.RUN_SCHEMA:
        result.problems.append(f"run.json has schema {doc.get('schema')!r}, expected {bundle.RUN_SCHEMA!r}")


# --------------------------------------------------------------------------- step 5


def check_repeats(run: RunData, result: IntegrityResult) -> None:
    """No repeat can vanish: every planned repeat has its own record, in its own slot.

    Dropping an unlucky repeat (its directory removed, the aggregate and SHA256SUMS rewritten)
    is the selective reporting a reproducibility check exists to stop; every document that
    states the planned count must agree, and a repeat may be absent only from a run that
    run.json says stopped early (then the verdict cannot pass: the repeats count as "not run")."""
    counts = run.planned_counts()
    valid = {}
    for where, value in counts.items():
        try:  # a count of 10^9 is a sentence here, before anything lists that many repeats
            valid[where] = untrusted.count(value, where, least=1)
        except InvalidInput as err:
            result.problems.append(str(err))
    if len(set(valid.values())) > 1:
        shown = ", ".join(f"{where} {value}" for where, value in valid.items())
        result.problems.append(f"the planned number of repeats disagrees ({shown}): a repeat may have been dropped")
        return
    if not valid:
        result.notes.append("no document records how many repeats were planned: cannot check that none is missing")
        return
    planned = next(iter(valid.values()))
    _check_repeat_dirs(run, planned, result)
    listed = run.summary.get("repeats") if isinstance(run.summary.get("repeats"), dict) else {}
    plan = ((((run.manifest or {}).get("facets") or {}).get("seeds") or {}).get("plan")) or []
    for key in listed:
        if not (str(key).isdigit() and int(key) < planned):
            result.problems.append(f"summary.json lists repeat {key}, beyond the {planned} planned")
    for k in range(planned):
        doc = run.repeats.get(k)
        if doc is None:
            continue
        if doc.get("status") not in REPEAT_STATUSES:
            result.problems.append(f"repeats/{k}/summary.json has status {doc.get('status')!r}, "
                                   f"not one of {', '.join(REPEAT_STATUSES)}")
        if doc.get("repeat") is not None and doc.get("repeat") != k:
            result.problems.append(f"repeats/{k}/summary.json says it is repeat {doc.get('repeat')!r}: "
                                   "a repeat was moved to another slot")
        if str(k) not in listed:
            result.problems.append(f"summary.json does not list repeat {k}, which repeats/{k}/summary.json records")
        _check_topology(run.run or {}, k, doc, result)
        planned_seed = _planned_torch_seed(plan, k)
        seed = (doc.get("seeds") or {}).get("torch")
        if planned_seed is not None and seed is not None and seed != planned_seed:
            result.problems.append(f"repeat {k} ran with torch seed {seed}, not the {planned_seed} the manifest "
                                   f"planned for repeat {k}: the repeat was replaced or moved")
    _note_continued(run, planned, result)
    missing = run.not_run
    if not missing:
        return
    state = (run.run or {}).get("status")
    if state in RUN_UNFINISHED:
        result.notes.append(f"the run is incomplete: repeat(s) {_ks(missing)} of {planned} have not run "
                            f"(run.json says {state!r}); `repro500 run --resume {run.path}` completes it")
    else:
        said = f"run.json says the run is {state!r}" if state else "nothing says the run stopped early"
        result.problems.append(f"repeat(s) {_ks(missing)} of the {planned} planned are missing (no "
                               f"repeats/<k>/summary.json) and {said}: a repeat cannot be dropped from a run")


def _note_continued(run: RunData, planned: int, result: IntegrityResult) -> None:
    """Said, not judged: a repeat that continued from the state its command saved (a command's
    own resume is part of its method)."""
    continued = [k for k in range(planned) if isinstance((run.repeats.get(k) or {}).get("checkpoint"), dict)]
    if continued:
        result.notes.append(f"repeat(s) {_ks(continued)} continued from the state their command saved in an earlier, "
                            "interrupted attempt (repeats/<k>/checkpoint/): their results depend on how it resumes")


def _check_topology(meta: dict[str, Any], k: int, doc: dict[str, Any], result: IntegrityResult) -> None:
    """Every repeat ran on the run's own world size and engine: a repeat's result depends on both
    (global batch, reduction order, compression), so a run whose repeats differ mixes two
    experiments.  repro500 refuses a resume that would change them (runner/multinode.py), so a
    difference means the records were altered or made by a version that let a resume change them."""
    for key, label in (("world_size", "world size"), ("engine", "engine")):
        recorded, ran = meta.get(key), doc.get(key)
        if recorded is not None and ran is not None and recorded != ran:
            result.problems.append(f"repeat {k} ran with {label} {ran!r}, but run.json records {label} {recorded!r} "
                                   f"for the run: its result is not comparable with the other repeats' (rerun it "
                                   f"with the run's own topology)")


def _check_repeat_dirs(run: RunData, planned: int, result: IntegrityResult) -> None:
    repeats_dir = run.path / "repeats"
    if not repeats_dir.is_dir() or repeats_dir.is_symlink():
        return
    for child in sorted(repeats_dir.iterdir(), key=lambda p: (len(p.name), p.name)):
        rel = f"repeats/{child.name}"
        if child.is_symlink():
            result.problems.append(f"{rel} is a link: every repeat must be a directory of its own")
        elif (child / layout.REPEAT_SUMMARY).is_symlink():
            result.problems.append(f"{rel}/summary.json is a link: every repeat must hold its own summary")
        elif child.name.isdigit() and int(child.name) >= planned:
            result.problems.append(f"{rel} is beyond the {planned} planned repeats")


def _planned_torch_seed(plan: Any, k: int) -> Any:
    try:
        entry = plan[k]
        return entry["ranks"][0]["torch"] if entry.get("repeat", k) == k else None
    except (IndexError, KeyError, TypeError, AttributeError):
        return None


def _ks(ks: list[int]) -> str:
    return untrusted.indices(ks)


def check_aggregate(run: RunData, result: IntegrityResult) -> None:
    """The aggregate summary must equal what the per-repeat summaries say."""
    statuses = run.summary.get("repeats") or {}
    for k, doc in sorted(run.repeats.items()):
        recorded = statuses.get(str(k))
        if recorded is not None and recorded != doc.get("status"):
            result.problems.append(
                f"summary.json says repeat {k} is {recorded!r} but repeats/{k}/summary.json says "
                f"{doc.get('status')!r}"
            )
    for key, recorded in statuses.items():
        if str(key).isdigit() and int(key) not in run.repeats:
            result.problems.append(f"summary.json lists repeat {key} as {recorded!r} but repeats/{key}/summary.json is absent")
    for metric, entry in (run.summary.get("metrics") or {}).items():
        if not isinstance(entry, dict):
            result.problems.append(f"summary.json: metrics.{metric} is not an object")
            continue
        expected = run.indexed_values(metric)
        got_repeats = [int(k) for k in entry.get("repeats", [])] if isinstance(entry.get("repeats"), list) else None
        got_values = entry.get("values")
        if got_repeats != [k for k, _ in expected] or got_values != [v for _, v in expected]:
            result.problems.append(
                f"summary.json: metrics.{metric} says {_short(got_values)} for repeats {got_repeats}, but the "
                f"repeat summaries give {_short([v for _, v in expected])} for {[k for k, _ in expected]}"
            )
    digests = run.summary.get("final_param_digests")
    if isinstance(digests, dict):
        for key, digest in digests.items():
            k = int(key) if str(key).isdigit() else None
            if k in run.repeats and run.repeats[k].get("final_param_digest") != digest:
                result.problems.append(
                    f"summary.json: final_param_digests[{key}] differs from repeats/{key}/summary.json"
                )


def _short(values: Any) -> str:
    text = json.dumps(values)
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------- step 6


def check_consistency(run: RunData, result: IntegrityResult) -> None:
    """Warnings where a repeat summary disagrees with its own metrics.jsonl / params.jsonl."""
    for k in run.completed:
        doc = run.repeats[k]
        epoch_values = _epoch_metric_values(run.repeat_file(k, layout.METRICS))
        for metric, value in (doc.get("metrics") or {}).items():
            seen = epoch_values.get(metric)
            if seen and value is not None and value not in seen:
                result.warnings.append(
                    f"repeats/{k}/summary.json: {metric}={value} matches no epoch record in metrics.jsonl"
                )
        params = _params_digests(run.repeat_file(k, layout.PARAMS))
        final = doc.get("final_param_digest")
        if params and "final" in params and final and params["final"] != final:
            result.warnings.append(
                f"repeats/{k}/summary.json: final_param_digest differs from params.jsonl's final line"
            )


def _epoch_metric_values(path: Path) -> dict[str, set[float]]:
    out: dict[str, set[float]] = {}
    if not path.is_file():
        return out
    for line in untrusted.log_lines(path, "a repeat's metrics log"):
        if '"epoch"' not in line or '"metrics"' not in line:
            continue  # step records are the bulk of the file; skip them unparsed
        record = untrusted.json_record(line)
        # a record from elsewhere may hold anything: only an object with an object of metrics counts
        if record is None or record.get("kind") != "epoch" or not isinstance(record.get("metrics"), dict):
            continue
        for name, value in record["metrics"].items():
            if isinstance(value, (int, float)):
                out.setdefault(name, set()).add(value)
    return out


def _params_digests(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    for line in untrusted.log_lines(path, "a repeat's params log"):
        record = untrusted.json_record(line)
        if record is not None and "epoch" in record and isinstance(record.get("digest"), str):
            out[str(record["epoch"])] = record["digest"]
    return out


# --------------------------------------------------------------------------- step 7


def check_data(run: RunData, result: IntegrityResult) -> None:
    """Re-hash the data files the manifest recorded, where they exist on this machine."""
    entries = (((run.manifest or {}).get("facets") or {}).get("data") or {}).get("entries") or []
    if not entries:
        return
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in entries):
        result.problems.append("manifest.json facets.data.entries is not a list of entries each with a path: "
                               "the record is corrupt")
        return
    present, refused = [], 0
    for entry in entries:
        try:  # a record may name /proc/self/pagemap, ".", a FIFO: refused before anything reads it
            path = recorded_paths.resolve(entry.get("path") if isinstance(entry, dict) else None,
                                          field="data path", file=f"{run.path}/manifest.json", anywhere=True)
        except InvalidInput as err:
            result.problems.append(f"data: {err}")
            refused += 1
            continue
        if path.exists():
            present.append((entry, path))
    skipped = len(entries) - len(present) - refused
    if skipped:
        result.notes.append(f"{skipped} recorded data path(s) are not on this machine: not re-hashed")
    if not present:
        return
    try:
        from repro500.capture.data import compare
    except ImportError:
        result.notes.append("data not re-hashed: repro500.capture.data.compare is not available")
        return
    changed = 0
    for entry, path in present:
        for sentence in compare([entry]):
            changed += 1
            if path.is_absolute():  # the very file the run read has changed since
                result.problems.append(f"data: {sentence}")
            else:
                # A relative path names a file beside wherever verify is run: another file at that
                # path here says nothing of the run, whose own files are checked above.
                result.warnings.append(f"data: {entry['path']} here is another file than the run read ({sentence}); "
                                       "the run's own files are intact: verify from the directory the run was made "
                                       "in to check its data")
    if not changed:
        result.notes.append(f"{len(present)} data path(s) re-hashed: they match the manifest")
