"""The run directory (results bundle): its layout and its digest list.

Layout (docs/contracts.md, "Run directory")::

    runs/<run-id>/
      run.json                  repro500/run/v1       identity, status, command, seeds, MLflow ids
      manifest.json             repro500/manifest/v1  provenance (capture)
      data-specs.json           repro500/data-specs/v1 how to recreate each data file (publish/datafiles.py)
      code.diff                 uncommitted tracked changes (when the tree was dirty)
      recipe.yaml               the resolved recipe
      repeats/<k>/metrics.jsonl one JSON object per line (step and epoch records)
      repeats/<k>/summary.json  repro500/repeat-summary/v1
      repeats/<k>/params.jsonl  parameter digests per epoch (per tensor)
      repeats/<k>/mllog.txt     MLPerf-format log (:::MLLOG lines)
      summary.json              repro500/summary/v1   aggregate across repeats
      SHA256SUMS                ``sha256sum`` format, every file above, sorted by path;
                                a link is a ``# link {"path": ..., "target": ...}`` line

Files the digest list does not cover, because they are derived views that ``verify`` and
``report`` rewrite: ``verdict.json``, ``report.html`` and anything under ``derived/``.
``sha256sum -c SHA256SUMS`` inside the directory checks it with coreutils alone.

Links never carry trust: a link that leaves the directory (or a device or pipe) makes it
INVALID; a link inside is an entry of its own, recorded with its target.

Packing and unpacking (:func:`pack`, :func:`unpack`) live in ``repro500/rundir/archive.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from repro500 import untrusted
from repro500.digest import file_digest  # noqa: F401 - read from here by callers
from repro500.errors import InvalidInput
from repro500.rundir import atomic
from repro500.rundir.names import (  # noqa: F401 - the schemas re-exported: callers read bundle.RUN_SCHEMA, ...
    ATTESTATION,
    ATTESTATION_SIG,
    DERIVED,
    REPEAT_SUMMARY_SCHEMA,
    REPEATS,
    REPORT,
    RUN_SCHEMA,
    SUMMARY_SCHEMA,
    SUMS_NAME,
    VERDICT,
)

LINK_PREFIX = "# link "
# The attestation signs SHA256SUMS, so SHA256SUMS cannot cover it (docs/trust.md).
DERIVED_NAMES = frozenset({VERDICT, REPORT, SUMS_NAME, ATTESTATION, ATTESTATION_SIG})
DERIVED_DIRS = frozenset({DERIVED})


def repeat_dir(run_dir: Path, k: int) -> Path:
    return Path(run_dir) / REPEATS / str(k)


def _covered(rel: str) -> bool:
    """Whether the digest list covers this path (derived views and in-flight writes are not)."""
    first, _, rest = rel.partition("/")
    if (not rest and first in DERIVED_NAMES) or first in DERIVED_DIRS:
        return False
    name = rel.rsplit("/", 1)[-1]
    return not (name.startswith(".") and name.endswith(".partial"))  # an atomic write in flight (atomic.py)


@dataclass
class Entries:
    """What a run directory holds, as the digest list sees it; links are entries of their own."""

    files: list[str] = field(default_factory=list)  # covered regular files
    links: dict[str, str] = field(default_factory=dict)  # covered links that stay inside: path -> target
    link_files: set[str] = field(default_factory=set)  # those of ``links`` that resolve to a regular file
    unsafe: dict[str, str] = field(default_factory=dict)  # path -> why it can never be trusted


def _link_stays_inside(root: Path, rel: str, target: str) -> bool:
    """A link stays inside when its text names a place inside the directory *and* it resolves there.

    The text matters on its own: an absolute target, or one that leaves and comes back by the
    directory's own name, points elsewhere once the bundle is copied or unpacked."""
    if target.startswith("/"):
        return False
    lexical = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
    if lexical == ".." or lexical.startswith("../"):
        return False
    # realpath follows a chain of links, so a link to a link that leaves is caught here
    return Path(os.path.realpath(root / rel)).is_relative_to(os.path.realpath(root))


def scan(run_dir: str | Path) -> Entries:
    """Walk a run directory without following any link (os.walk lists a link to a directory among
    the directories but never descends into it); every link and non-regular file is examined,
    in derived views too, because ``pack`` and ``report`` read those."""
    root = Path(run_dir)
    out = Entries()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            rel = (rel_dir / name).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                target = os.readlink(path)
                if not _link_stays_inside(root, rel, target):
                    out.unsafe[rel] = f"{rel} -> {target} is a link that leaves the run directory"
                elif _covered(rel):
                    out.links[rel] = target
                    if os.path.isfile(path):
                        out.link_files.add(rel)
            elif stat.S_ISREG(mode):
                if _covered(rel):
                    out.files.append(rel)
            elif not stat.S_ISDIR(mode):  # reading a FIFO would hang verify; a device is never data
                out.unsafe[rel] = f"{rel} is not a regular file (a device, pipe or socket)"
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    out.files.sort()
    return out


_CHUNK = 1 << 20


def _digest(root: Path, rel: str) -> str:
    """SHA-256 of one covered file, read only if it is a regular file once opened: :func:`scan`
    saw one, but a file swapped afterwards for a FIFO would block the reader forever and a link
    to /dev/zero would stream without end (InvalidInput; FileNotFoundError passes through)."""
    digest = hashlib.sha256()
    with untrusted.open_regular(root / rel, f"{rel} of the run directory", cap=sys.maxsize) as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _not_regular(rel: str) -> str:
    return f"{rel} is not a regular file (a device, pipe or socket)"


def _link_line(rel: str, target: str) -> str:
    return LINK_PREFIX + json.dumps({"path": rel, "target": target}, sort_keys=True, ensure_ascii=True) + "\n"


def write_sums(run_dir: str | Path) -> Path:
    """(Re)write ``SHA256SUMS`` over every covered entry of the run directory.

    A link is recorded on a ``# link {...}`` line with its target (coreutils skips lines that
    start with ``#``); a link to a regular file also gets an ordinary line for the content it
    resolves to, which ``sha256sum -c`` checks through the link.  A directory holding a link that
    leaves it, or a device or pipe, is refused: sealing it would vouch for what it points at."""
    root = Path(run_dir)
    entries = scan(root)
    if entries.unsafe:
        raise InvalidInput(f"{root} cannot be sealed: {next(iter(entries.unsafe.values()))}")
    lines = []
    for rel in sorted([*entries.files, *entries.links]):
        if rel in entries.links:
            lines.append(_link_line(rel, entries.links[rel]))
            if rel not in entries.link_files:
                continue
        try:
            lines.append(f"{_digest(root, rel)}  {rel}\n")
        except InvalidInput:
            raise InvalidInput(f"{root} cannot be sealed: {_not_regular(rel)}") from None
    target = root / SUMS_NAME
    atomic.write_text(target, "".join(lines))
    return target


def _read_lines(run_dir: str | Path) -> tuple[dict[str, str], dict[str, str]]:
    path = Path(run_dir) / SUMS_NAME
    if path.is_symlink():
        raise InvalidInput(f"{path} is a symbolic link: the digest list must be a file of the run directory")
    sums: dict[str, str] = {}
    links: dict[str, str] = {}
    try:
        # a regular file under the document cap: a digest list of gigabytes (or a FIFO) is no run's
        text = untrusted.read_text(path, "the digest list")
    except (FileNotFoundError, NotADirectoryError):
        raise InvalidInput(f"{path} is missing: this is not a complete run directory") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith(LINK_PREFIX):
            try:
                record = untrusted.json_record(line[len(LINK_PREFIX):]) or {}
                links[str(record["path"])] = str(record["target"])
            except (ValueError, KeyError, TypeError):
                raise InvalidInput(f"{path}:{lineno} is not a '# link {{\"path\": ..., \"target\": ...}}' line") from None
            continue
        if line.startswith("#"):
            continue  # a comment, as coreutils treats it
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel:
            raise InvalidInput(f"{path}:{lineno} is not a 'sha256  path' line")
        sums[rel] = digest
    return sums, links


def read_sums(run_dir: str | Path) -> dict[str, str]:
    """Parse ``SHA256SUMS`` into {relative path: sha256} (its content lines; the links it records are
    checked by :func:`check_sums`)."""
    return _read_lines(run_dir)[0]


@dataclass
class IntegrityReport:
    """What differs between a run directory and its digest list."""

    modified: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    unsafe: list[str] = field(default_factory=list)  # sentences: links that leave, devices, pipes
    not_carried: list[str] = field(default_factory=list)  # absent, as the publication that left them out records

    @property
    def ok(self) -> bool:
        return not (self.modified or self.missing or self.extra or self.unsafe)

    def describe(self) -> str:
        parts = list(self.unsafe[:3])
        for label, names in (("edited", self.modified), ("missing", self.missing), ("extra", self.extra)):
            if names:
                shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                parts.append(f"{label}: {shown}")
        return "; ".join(parts) if parts else "all files match SHA256SUMS"

    def as_dict(self) -> dict[str, list[str] | bool]:
        return {"ok": self.ok, "modified": self.modified, "missing": self.missing, "extra": self.extra,
                "unsafe": self.unsafe, "not_carried": self.not_carried}


def check_sums(run_dir: str | Path, *, not_carried: Mapping[str, str] | None = None) -> IntegrityReport:
    """Recompute every digest and compare with ``SHA256SUMS``; every link is an entry of its own.

    ``not_carried`` ({path: sha256}) is what a publication records as left out of its archive
    (repro500.rundir.excluded): a file absent from the directory is *not carried*, not missing,
    when it is recorded there with the digest ``SHA256SUMS`` gives it.  Present, it is checked like
    any other file.  This is the one place that tells the two apart."""
    root = Path(run_dir)
    recorded, recorded_links = _read_lines(root)
    entries = scan(root)
    report = IntegrityReport(unsafe=sorted(entries.unsafe.values()))
    files = set(entries.files)
    for rel, digest in sorted(recorded.items()):
        if rel in entries.unsafe:
            continue  # reported as unsafe already; never followed
        if rel in files or rel in entries.link_files:
            try:
                if _digest(root, rel) != digest:
                    report.modified.append(rel)
            except InvalidInput:
                report.unsafe.append(_not_regular(rel))
            except FileNotFoundError:
                report.missing.append(rel)
        elif rel not in entries.links:
            report.missing.append(rel)
    for rel, target in sorted(recorded_links.items()):
        if rel in entries.links:
            if entries.links[rel] != target:
                report.modified.append(f"{rel} (a link to {target!r}, now to {entries.links[rel]!r})")
        elif rel in files:
            # ``pack`` stores a link's content, never the link: a regular file whose content
            # matches the recorded content line stands in for a link to a file
            if rel not in recorded:
                report.modified.append(f"{rel} (a link to {target!r}, now a file)")
        elif rel not in entries.unsafe:
            report.missing.append(rel)
    if not_carried:
        absent = set(report.missing)
        left_out = {rel for rel in absent if rel in recorded and not_carried.get(rel) == recorded[rel]}
        report.missing = [rel for rel in report.missing if rel not in left_out]
        report.not_carried = sorted(left_out)
    for rel in sorted(files - set(recorded)):
        if rel in recorded_links:
            continue
        report.extra.append(rel)
    for rel in sorted(entries.links):
        if rel not in recorded_links:
            report.extra.append(f"{rel} (a link to {entries.links[rel]!r})" if rel not in recorded else
                                f"{rel} (a file, now a link to {entries.links[rel]!r})")
    report.modified.sort()
    return report


def require_untouched(run_dir: str | Path, refusal: str) -> None:
    """InvalidInput unless the run directory matches its SHA256SUMS; ``refusal`` says what is then
    not done (pack, sign and publish work only on an untouched run)."""
    report = check_sums(run_dir)
    if not report.ok:
        raise InvalidInput(f"{run_dir} does not match its SHA256SUMS ({report.describe()}): {refusal}")
