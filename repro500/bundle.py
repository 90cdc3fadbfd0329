"""The run directory (results bundle): its layout and its digest list.

Layout (docs/contracts.md, "Run directory")::

    runs/<run-id>/
      run.json                  repro500/run/v1       identity, status, command, seeds, MLflow ids
      manifest.json             repro500/manifest/v1  provenance (capture)
      code.diff                 uncommitted tracked changes (when the tree was dirty)
      recipe.yaml               the resolved recipe
      repeats/<k>/metrics.jsonl one JSON object per line (step and epoch records)
      repeats/<k>/summary.json  repro500/repeat-summary/v1
      repeats/<k>/params.jsonl  parameter digests per epoch (per tensor)
      repeats/<k>/mllog.txt     MLPerf-format log (:::MLLOG lines)
      summary.json              repro500/summary/v1   aggregate across repeats
      SHA256SUMS                ``sha256sum`` format, every file above, sorted by path

Files the digest list does not cover, because they are derived views that ``verify`` and
``report`` rewrite: ``verdict.json``, ``report.html`` and anything under ``derived/``.
``sha256sum -c SHA256SUMS`` inside the directory checks it with coreutils alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from repro500 import atomic
from repro500.digest import file_digest
from repro500.errors import InvalidInput

SUMS_NAME = "SHA256SUMS"
DERIVED_NAMES = frozenset({"verdict.json", "report.html", SUMS_NAME})
DERIVED_DIRS = frozenset({"derived"})

RUN_SCHEMA = "repro500/run/v1"
SUMMARY_SCHEMA = "repro500/summary/v1"
REPEAT_SUMMARY_SCHEMA = "repro500/repeat-summary/v1"


def repeat_dir(run_dir: Path, k: int) -> Path:
    return Path(run_dir) / "repeats" / str(k)


def covered_files(run_dir: str | Path) -> list[str]:
    """Relative POSIX paths of every file the digest list covers, sorted."""
    root = Path(run_dir)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in DERIVED_DIRS]
        for name in filenames:
            rel = (rel_dir / name).as_posix()
            if rel_dir == Path(".") and name in DERIVED_NAMES:
                continue
            if name.startswith(".") and name.endswith(".partial"):
                continue  # an atomic write in flight (atomic.py)
            out.append(rel)
    return sorted(out)


def write_sums(run_dir: str | Path) -> Path:
    """(Re)write ``SHA256SUMS`` over every covered file of the run directory."""
    root = Path(run_dir)
    lines = [f"{file_digest(root / rel)}  {rel}\n" for rel in covered_files(root)]
    target = root / SUMS_NAME
    atomic.write_text(target, "".join(lines))
    return target


def read_sums(run_dir: str | Path) -> dict[str, str]:
    """Parse ``SHA256SUMS`` into {relative path: sha256}."""
    path = Path(run_dir) / SUMS_NAME
    if not path.is_file():
        raise InvalidInput(f"{path} is missing: this is not a complete run directory")
    sums: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel:
            raise InvalidInput(f"{path}:{lineno} is not a 'sha256  path' line")
        sums[rel] = digest
    return sums


@dataclass
class IntegrityReport:
    """What differs between a run directory and its digest list."""

    modified: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.modified or self.missing or self.extra)

    def describe(self) -> str:
        parts = []
        for label, names in (("edited", self.modified), ("missing", self.missing), ("extra", self.extra)):
            if names:
                shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                parts.append(f"{label}: {shown}")
        return "; ".join(parts) if parts else "all files match SHA256SUMS"

    def as_dict(self) -> dict[str, list[str] | bool]:
        return {"ok": self.ok, "modified": self.modified, "missing": self.missing, "extra": self.extra}


def check_sums(run_dir: str | Path) -> IntegrityReport:
    """Recompute every digest and compare with ``SHA256SUMS``."""
    root = Path(run_dir)
    recorded = read_sums(root)
    present = set(covered_files(root))
    report = IntegrityReport()
    for rel, digest in sorted(recorded.items()):
        if rel not in present:
            report.missing.append(rel)
        elif file_digest(root / rel) != digest:
            report.modified.append(rel)
    report.extra = sorted(present - set(recorded))
    return report
