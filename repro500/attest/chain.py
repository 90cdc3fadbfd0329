"""The repeat chain: ``chain.jsonl``, so that no planned repeat can vanish from a run unseen.

The run writes one JSON line (repro500-c14n/v1 canonical JSON) when it starts and one each time
a repeat's ``summary.json`` is written, whatever its status (completed, diverged, failed,
killed)::

    {"kind": "start", "schema": "repro500/chain/v1", "planned": 5, "prev": <manifest digest>, "utc": ..., "link": L0}
    {"kind": "repeat", "repeat": 0, "status": "completed", "summary_sha256": ..., "prev": L0, "utc": ..., "link": L1}

``link`` is the SHA-256 of the line's canonical JSON without ``link``; ``prev`` is the previous
line's link, and the start line's ``prev`` is the manifest's digest.  The last link is the
chain's *head*; the signed attestation records it (docs/trust.md).  A resumed run appends to
the same chain; a repeat rerun after an unfinished attempt (killed, failed) gets a new line,
and the latest line for a repeat is the one its summary must match.

``chain.jsonl`` is covered by ``SHA256SUMS``.  Without a signature anyone can rewrite the whole
chain consistently; what it catches on its own is a repeat dropped, replaced or added while the
rest of the run stayed as written, and what a signature adds is that nobody but the key's holder
can re-seal it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from repro500 import untrusted
from repro500.digest import canonical_digest, canonical_json, file_digest
from repro500.errors import InvalidInput
from repro500.rundir import atomic, layout
from repro500.rundir import sums as bundle
from repro500.statuses import RUN_UNFINISHED

CHAIN_NAME = "chain.jsonl"
SCHEMA = "repro500/chain/v1"
# A run in these states may still have planned repeats that never started.
_OPEN_STATES = RUN_UNFINISHED


def _utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sealed(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "link": canonical_digest(record)}


def _read(path: Path) -> list[dict[str, Any]]:
    records = []
    for lineno, line in enumerate(untrusted.read_text(path, "the repeat chain").splitlines(), 1):
        if not line.strip():
            continue
        record = untrusted.json_record(line)
        if record is None:
            raise InvalidInput(f"{path} line {lineno} is not a JSON object")
        records.append(record)
    return records


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    atomic.write_bytes(path, b"".join(canonical_json(r) + b"\n" for r in records))


def start(run_dir: str | Path, manifest_digest: str, planned: int) -> dict[str, Any]:
    """Begin the chain (after manifest.json is written); a resumed run's existing chain is kept."""
    path = Path(run_dir) / CHAIN_NAME
    if path.is_file():
        records = _read(path)
        first = records[0] if records else {}
        if first.get("kind") == "start" and first.get("prev") == manifest_digest and first.get("planned") == planned:
            return first
        raise InvalidInput(f"{path} was started for another manifest or repeat count: "
                           "this run directory is not the one being resumed")
    record = _sealed({"kind": "start", "schema": SCHEMA, "planned": int(planned), "prev": manifest_digest,
                      "utc": _utc()})
    _write(path, [record])
    return record


def append(run_dir: str | Path, repeat: int, summary_path: str | Path) -> dict[str, Any]:
    """Chain repeat *repeat*'s summary (after its summary.json is written); returns the new line."""
    path = Path(run_dir) / CHAIN_NAME
    if not path.is_file():
        raise InvalidInput(f"{path} does not exist: the chain must be started before a repeat is chained")
    records = _read(path)
    summary_path = Path(summary_path)
    try:
        status = untrusted.read_json(summary_path, "a repeat summary").get("status", "unknown")
    except (OSError, InvalidInput, AttributeError):
        raise InvalidInput(f"{summary_path} is not a readable repeat summary; it cannot be chained") from None
    record = _sealed({"kind": "repeat", "repeat": int(repeat), "status": str(status),
                      "summary_sha256": file_digest(summary_path), "prev": records[-1]["link"], "utc": _utc()})
    _write(path, [*records, record])
    return record


def head(run_dir: str | Path) -> str | None:
    """The last link of the chain, or None when the run has no chain."""
    path = Path(run_dir) / CHAIN_NAME
    if not path.is_file():
        return None
    records = _read(path)
    return records[-1].get("link") if records else None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        doc = untrusted.read_json(path, path.name)
    except (OSError, InvalidInput):
        return None
    return doc if isinstance(doc, dict) else None


def check(run_dir: str | Path) -> list[str]:
    """Problems with the chain, each naming the repeat (an empty list: every repeat accounted for)."""
    root = Path(run_dir)
    path = root / CHAIN_NAME
    if not path.is_file():
        return [f"{CHAIN_NAME} is missing, so nothing shows that every planned repeat is reported "
                "(runs made before repro500 recorded repeat chains have none: rerun to get one)"]
    try:
        records = _read(path)
    except InvalidInput as err:
        return [str(err)]
    if not records or records[0].get("kind") != "start":
        return [f"{CHAIN_NAME} does not begin with its start line: it was cut or rewritten"]
    problems = _manifest_problems(root, records[0])
    link_problems, latest = _links(records)
    problems += link_problems
    planned = records[0].get("planned")
    if not isinstance(planned, int) or planned < 1:
        return [*problems, f"{CHAIN_NAME} does not say how many repeats were planned"]
    try:  # before a set of that many repeat indices is built
        untrusted.count(planned, f"{CHAIN_NAME}'s planned repeats")
    except InvalidInput as err:
        return [*problems, str(err)]
    run = _json(root / layout.RUN_JSON) or {}
    return problems + _plan_problems(root, run, planned) + _repeat_problems(root, run, planned, latest)


def _manifest_problems(root: Path, start_record: dict[str, Any]) -> list[str]:
    """Whether the chain starts from the manifest the run directory holds."""
    manifest = _json(root / layout.MANIFEST) or {}
    manifest_digest = (manifest.get("digest") or {}).get("value") if isinstance(manifest.get("digest"), dict) else None
    if start_record.get("prev") != manifest_digest:
        return [f"{CHAIN_NAME} starts from another manifest than manifest.json's digest"]
    return []


def _links(records: list[dict[str, Any]]) -> tuple[list[str], dict[int, dict[str, Any]]]:
    """The problems with each line's link, and the latest line of each repeat (a rerun's replaces its first)."""
    problems: list[str] = []
    latest: dict[int, dict[str, Any]] = {}
    prev = None
    for lineno, record in enumerate(records, 1):
        label = f"{CHAIN_NAME} line {lineno}" + (f" (repeat {record.get('repeat')})" if record.get("kind") == "repeat" else "")
        body = {k: v for k, v in record.items() if k != "link"}
        if record.get("link") != canonical_digest(body):
            problems.append(f"{label} was edited: its link digest does not match its content")
        if lineno > 1 and record.get("prev") != prev:
            problems.append(f"{label} does not follow the line before it: a link was removed, reordered or inserted")
        prev = record.get("link")
        if lineno == 1:
            continue
        if record.get("kind") != "repeat" or not isinstance(record.get("repeat"), int):
            problems.append(f"{label} is not a repeat link")
            continue
        latest[record["repeat"]] = record
    return problems, latest


def _plan_problems(root: Path, run: dict[str, Any], planned: int) -> list[str]:
    """Whether run.json and summary.json plan as many repeats as the chain's start line."""
    problems = []
    if run.get("repeats") != planned:
        problems.append(f"{CHAIN_NAME} says {planned} repeats were planned, run.json says {run.get('repeats')}")
    aggregate = _json(root / layout.SUMMARY)
    if aggregate is not None and aggregate.get("repeats_planned") not in (None, planned):
        problems.append(f"{CHAIN_NAME} says {planned} repeats were planned, summary.json says {aggregate.get('repeats_planned')}")
    return problems


def _repeat_problems(root: Path, run: dict[str, Any], planned: int, latest: dict[int, dict[str, Any]]) -> list[str]:
    """Each repeat planned, chained or on disk against the others: extra, unchained, missing or replaced."""
    problems: list[str] = []
    unaccounted: list[int] = []
    on_disk = {int(p.parent.name) for p in (root / "repeats").glob("*/summary.json") if p.parent.name.isdigit()}
    # a sequential run stops once decided (verify re-derives where: verify/sequential.py)
    design = run.get("design") if isinstance(run.get("design"), dict) else {}
    stopped = design.get("stopped_at") if design.get("kind") == "sequential" else None
    for k in sorted(set(latest) | on_disk | set(range(planned))):
        summary = bundle.repeat_dir(root, k) / layout.REPEAT_SUMMARY
        link = latest.get(k)
        if k >= planned and (link or k in on_disk):
            problems.append(f"repeat {k} is extra: only {planned} repeats were planned")
        elif link is None and k in on_disk:
            problems.append(f"repeat {k} has a summary.json but no link in {CHAIN_NAME}: it was added or replaced after it ran")
        elif link is None:
            if run.get("status") not in _OPEN_STATES and not (isinstance(stopped, int) and k >= stopped):
                unaccounted.append(k)
        elif not summary.is_file():
            problems.append(f"repeat {k} is missing: {CHAIN_NAME} records it ({link.get('status')}) "
                            f"but repeats/{k}/summary.json is gone")
        elif file_digest(summary) != link.get("summary_sha256"):
            problems.append(f"repeat {k} was replaced: repeats/{k}/summary.json is not the summary chained when it finished")
    if unaccounted:  # one sentence, however many repeats the chain planned
        which = (f"repeat {unaccounted[0]} was" if len(unaccounted) == 1
                 else f"repeats {untrusted.indices(unaccounted)} were")
        problems.append(f"{which} planned but {'is' if len(unaccounted) == 1 else 'are'} not accounted for: "
                        f"no link in {CHAIN_NAME} and no summary")
    return problems
