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
      SHA256SUMS                ``sha256sum`` format, every file above, sorted by path

Files the digest list does not cover, because they are derived views that ``verify`` and
``report`` rewrite: ``verdict.json``, ``report.html`` and anything under ``derived/``.
``sha256sum -c SHA256SUMS`` inside the directory checks it with coreutils alone.

Packing (:func:`pack`) writes one ``.tar.gz`` holding ``<run-id>/...``; packing the same
directory twice gives the same bytes (fixed owner, modes and timestamps).  Unpacking
(:func:`unpack`) refuses anything that could write outside its target directory.
"""

from __future__ import annotations

import gzip
import os
import posixpath
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from repro500 import atomic
from repro500.digest import file_digest
from repro500.errors import InvalidInput, UsageError

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


# ------------------------------------------------------------------------ pack / unpack

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
_FILE_MODE, _DIR_MODE = 0o644, 0o755


def is_archive(path: str | Path) -> bool:
    """True for a file whose name says it is a tar archive (.tar.gz, .tgz, .tar)."""
    path = Path(path)
    return path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)


def _packed_files(root: Path) -> list[str]:
    """Covered files, SHA256SUMS, and the derived views (verdict, report) when present."""
    names = set(covered_files(root)) | {SUMS_NAME}
    names |= {name for name in DERIVED_NAMES if (root / name).is_file()}
    for dirname in DERIVED_DIRS:
        for dirpath, _, filenames in os.walk(root / dirname):
            rel_dir = Path(dirpath).relative_to(root)
            names |= {(rel_dir / f).as_posix() for f in filenames}
    return sorted(names)


def pack(run_dir: str | Path, out: str | Path | None = None, *, force: bool = False) -> Path:
    """Pack a run directory into one reproducible ``.tar.gz``; returns the archive's path.

    The directory must match its ``SHA256SUMS`` (an archive that would not verify is
    refused).  ``out`` defaults to ``<run-dir>.tar.gz`` next to the directory; an existing
    directory as ``out`` receives ``<run-id>.tar.gz``.  An existing archive is replaced only
    with ``force``.  The archive is written to a temporary name and renamed when complete.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise InvalidInput(f"{root} is not a run directory: nothing to pack")
    report = check_sums(root)
    if not report.ok:
        raise InvalidInput(f"{root} does not match its SHA256SUMS ({report.describe()}): refusing to pack a bundle that would not verify")
    target = Path(out) if out is not None else root.parent / f"{root.name}.tar.gz"
    if target.is_dir():
        target = target / f"{root.name}.tar.gz"
    if target.resolve().is_relative_to(root.resolve()):
        raise UsageError(f"{target} lies inside the run directory: write the archive somewhere else")
    if target.exists() and not force:
        raise InvalidInput(f"{target} already exists: remove it or pass --force to replace it")
    files = _packed_files(root)
    dirs = sorted({p.as_posix() for rel in files for p in PurePosixPath(rel).parents if p != PurePosixPath(".")})
    # mtime=0 and an empty name in the gzip header keep the bytes reproducible
    with (
        atomic.atomic_path(target) as tmp,
        open(tmp, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.addfile(_tarinfo(root.name, tarfile.DIRTYPE))
        for rel in dirs:
            tar.addfile(_tarinfo(f"{root.name}/{rel}", tarfile.DIRTYPE))
        for rel in files:
            path = root / rel
            info = _tarinfo(f"{root.name}/{rel}", tarfile.REGTYPE)
            info.size = path.stat().st_size  # content, never a link: the archive is self-contained
            with open(path, "rb") as fh:
                tar.addfile(info, fh)
    return target


def _tarinfo(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = _DIR_MODE if kind == tarfile.DIRTYPE else _FILE_MODE
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _unsafe(member: tarfile.TarInfo) -> str | None:
    """Why a member could write outside the target directory, or None when it is safe."""
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return f"absolute path {name!r}"
    if ".." in parts:
        return f"path {name!r} escapes the target directory with '..'"
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        return f"device or pipe {name!r}"
    if member.issym() or member.islnk():
        link = member.linkname
        # a symlink resolves from its own directory, a hard link from the archive root
        base = posixpath.dirname(name) if member.issym() else ""
        resolved = posixpath.normpath(posixpath.join(base, link))
        if link.startswith("/") or resolved == ".." or resolved.startswith("../"):
            return f"link {name!r} -> {link!r} points outside the target directory"
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return f"unsupported entry type for {name!r}"
    return None


def unpack(archive: str | Path, dest: str | Path) -> Path:
    """Unpack a packed run into ``dest``; returns ``dest/<run-id>``.

    Refuses, before writing anything, archives with absolute paths, ``..`` components,
    links pointing outside, device files, or more than one top-level directory.  A corrupt
    or truncated archive raises InvalidInput.  Files land in a temporary directory inside
    ``dest`` first and are renamed into place only when everything was extracted.
    """
    archive = Path(archive)
    if not archive.is_file():
        raise InvalidInput(f"{archive} does not exist or is not a file: give a .tar.gz made by repro500 pack")
    corrupt = (tarfile.TarError, EOFError, zlib.error, OSError, gzip.BadGzipFile)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()  # reads to the end: a truncated archive fails here
    except corrupt as err:
        raise InvalidInput(f"{archive} is not a readable archive (corrupt or truncated: {err.__class__.__name__})") from None
    if not members:
        raise InvalidInput(f"{archive} is empty: it holds no run directory")
    for member in members:
        reason = _unsafe(member)
        if reason:
            raise InvalidInput(f"{archive} is unsafe to unpack: {reason}; refusing to extract anything")
    tops = {PurePosixPath(m.name).parts[0] for m in members if PurePosixPath(m.name).parts}
    if len(tops) != 1 or tops == {"."}:
        raise InvalidInput(f"{archive} must hold exactly one run directory at its top level, found {sorted(tops)}")
    top = tops.pop()
    dest = Path(dest)
    target = dest / top
    if target.exists():
        raise InvalidInput(f"{target} already exists: remove it or unpack into another directory")
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".repro500-unpack-", dir=dest))
    try:
        with tarfile.open(archive, "r:*") as tar:
            # the "data" filter (PEP 706) re-checks every member as defence in depth
            tar.extractall(staging, members=members, filter="data")
        os.replace(staging / top, target)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise InvalidInput(f"{archive} could not be extracted (corrupt or truncated: {err.__class__.__name__})") from None
    except OSError as err:
        raise InvalidInput(f"could not write into {dest} ({err.strerror or err.__class__.__name__})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
