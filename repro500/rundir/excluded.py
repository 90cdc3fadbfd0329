"""Files a publication leaves out of its packed run (``repro500 publish --exclude GLOB``).

A command that writes checkpoints into its repeat directory makes a run of hundreds of
megabytes whose result is its summaries.  ``--exclude`` leaves such files out of the archive
while their digests stay sealed: the run's ``SHA256SUMS`` is not touched (a signature over it stays
valid), and ``publication.json`` lists each file left out under ``not_carried``
(``{path, bytes, sha256}``), where the publication's own ``SHA256SUMS`` covers it.  Whoever
obtains such a file elsewhere checks it against both.

Only the experiment's own outputs can be left out: files under ``repeats/<k>/`` that repro500
does not write there itself.  Everything else (the run's documents at its top, ``source/``, and
per repeat what :data:`REPEAT_RECORDS` names) is what verify, reproduce, report and resume read.

``repro500 verify`` of a publication (its directory, or its archive where it lies in it, as the
run or as ``--against``) reads the list with :func:`publication_of`, so the files left out are
not carried, not missing; a carried file that differs from its digest is still tampering.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from repro500 import untrusted
from repro500.digest import file_digest
from repro500.errors import InvalidInput, UsageError
from repro500.rundir import archive as archives
from repro500.rundir import layout as rundir
from repro500.rundir import names
from repro500.rundir import sums as bundle
from repro500.rundir.archive import packed_files

INDEX_KEY = "not_carried"  # in publication.json
PUBLICATION_INDEX = names.PUBLICATION_INDEX
# what repro500 writes into a repeat directory (layout.py); COMMAND_METRICS is $REPRO500_METRICS,
# which the command workload reads (workloads/command/repeat.py)
REPEAT_RECORDS = frozenset({*rundir.REPEAT_ARTIFACTS, rundir.PARAMS, rundir.RANKS, names.COMMAND_METRICS})
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class LeftOut:
    path: str  # relative to the run directory, POSIX
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def required(rel: str) -> bool:
    """Whether repro500 needs this file of a run to verify, reproduce, report or resume it."""
    parts = rel.split("/")
    if len(parts) < 3 or parts[0] != rundir.REPEATS or not parts[1].isdigit():
        return True
    return len(parts) == 3 and parts[2] in REPEAT_RECORDS


def _matches(rel: str, glob: str) -> bool:
    # a glob that names a directory leaves out everything under it
    path = PurePosixPath(rel)
    return any(fnmatch.fnmatchcase(p.as_posix(), glob) for p in (path, *list(path.parents)[:-1]))


def select(run_dir: str | Path, globs: Sequence[str]) -> list[LeftOut]:
    """The sealed files of ``run_dir`` that ``globs`` match (fnmatch on the path relative to the run
    directory; ``*`` crosses ``/``).  UsageError, before anything is written, for a glob that
    matches a file repro500 needs or matches nothing."""
    root = Path(run_dir)
    if not globs:
        return []
    recorded = bundle.read_sums(root)
    candidates = packed_files(root)  # what the archive would hold, records included: those are refused
    chosen: set[str] = set()
    for glob in globs:
        hits = [rel for rel in candidates if _matches(rel, glob)]
        needed = [rel for rel in hits if required(rel)]
        if needed:
            raise UsageError(f"--exclude {glob!r} matches {needed[0]}, one of repro500's own records of the run, "
                             "which verify and reproduce read: only the experiment's own outputs under repeats/<k>/ "
                             "can be left out (e.g. 'repeats/*/checkpoint.pt')")
        if not hits:
            # the run's name, not its path: a packed run is read from a temporary directory
            raise UsageError(f"--exclude {glob!r} matches no file of run {root.name}: a glob matches paths relative "
                             "to the run directory (e.g. 'repeats/*/checkpoint.pt' or '*.pt')")
        chosen.update(hits)
    return [LeftOut(rel, (root / rel).stat().st_size, recorded[rel]) for rel in sorted(chosen)]


def read_list(index: dict[str, Any], recorded: dict[str, str], where: Path) -> list[LeftOut]:
    """``not_carried`` of a publication index, checked against the packed run's ``SHA256SUMS``
    (``recorded``): each entry a file the run sealed, with the digest it sealed, and never one
    repro500 needs.  InvalidInput names the first entry that is not."""
    raw = index.get(INDEX_KEY, [])
    if not isinstance(raw, list):
        raise InvalidInput(f"{where}: {INDEX_KEY} must be a list of {{path, bytes, sha256}}")
    out: dict[str, LeftOut] = {}
    for i, item in enumerate(raw):
        entry = f"{where}: {INDEX_KEY}[{i}]"
        if not (isinstance(item, dict) and set(item) == {"path", "bytes", "sha256"} and isinstance(item["path"], str)
                and isinstance(item["bytes"], int) and not isinstance(item["bytes"], bool) and item["bytes"] >= 0
                and isinstance(item["sha256"], str) and _SHA256.fullmatch(item["sha256"])):
            raise InvalidInput(f"{entry} is not {{path, bytes, sha256}}: the index was edited")
        path = item["path"]
        if path in out:
            raise InvalidInput(f"{entry}: {path} is listed twice: the index was edited")
        if required(path):
            raise InvalidInput(f"{entry}: {path} is a file every publication carries, never left out: "
                               "the index was edited")
        if recorded.get(path) != item["sha256"]:
            raise InvalidInput(f"{entry}: {path} is not a file the packed run's SHA256SUMS seals with that "
                               "SHA-256: the index was edited")
        out[path] = LeftOut(path, item["bytes"], item["sha256"])
    return list(out.values())


@dataclass(frozen=True)
class PackedIn:
    """A publication's packed run: the archive, and what the publication says it left out."""

    root: Path  # the publication directory
    archive: Path
    index: dict[str, Any]

    def not_carried(self, unpacked: Path) -> list[dict[str, Any]]:
        """The index's ``not_carried`` list checked against the unpacked run's ``SHA256SUMS``
        (:func:`read_list`), and that ``SHA256SUMS`` against the digest the index recorded."""
        if file_digest(Path(unpacked) / bundle.SUMS_NAME) != self.index.get("sums_digest"):
            raise InvalidInput(f"the packed run's SHA256SUMS differs from the digest in {self.root / PUBLICATION_INDEX}")
        recorded = bundle.read_sums(unpacked)
        return [e.to_dict() for e in read_list(self.index, recorded, self.root / PUBLICATION_INDEX)]


def is_publication_dir(path: str | Path) -> bool:
    """Whether ``path`` is a directory holding a publication index (not a run directory)."""
    path = Path(path)
    return (path / PUBLICATION_INDEX).is_file() and not (path / rundir.RUN_JSON).is_file()


def _own_files_are_files(root: Path, names: list[str]) -> None:
    """Every file the publication lists (and its index, digest list and archive) is a regular file
    of its own: a link (``published.yaml -> ../forged.yaml``), a FIFO or a device among them is a
    refusal, never followed nor skipped (InvalidInput)."""
    for name in names:
        path = root / name
        if (path.is_symlink() or path.exists()) and not untrusted.regular_file(path):
            raise InvalidInput(f"publication {root}: {untrusted.plain(name)} is not a regular file (a link, a FIFO "
                               "or a device): the publication is refused")


def publication_of(path: str | Path) -> PackedIn | None:
    """The publication ``path`` is (a directory holding ``publication.json``) or whose archive it
    is (the archive ``publication.json`` beside it names), checked as far as it vouches for the
    archive: the publication's ``SHA256SUMS`` covers the index unchanged, and the archive has the
    SHA-256 the index records.  None for anything else (a run directory, an archive on its own:
    then a file left out is missing, since nothing records it).  InvalidInput when the
    publication was changed."""
    path = Path(path)
    root = path if path.is_dir() else path.parent
    index_path = root / PUBLICATION_INDEX
    if not is_publication_dir(root) or (path.is_file() and not archives.is_archive(path)):
        return None
    # someone else's file: a FIFO, a device, a file over the document cap or JSON nested beyond
    # the recursion limit is refused (InvalidInput), never read into memory
    index = untrusted.read_json(index_path, f"the publication's {PUBLICATION_INDEX}")
    try:
        name = str(index["archive"]["name"])
    except (KeyError, TypeError):
        return None  # not a publication of repro500's: the path is verified as it is
    archive = root / name
    if path.is_file() and path.resolve() != archive.resolve():
        return None  # another archive in the same directory
    if "/" in name or name in ("", ".", ".."):
        raise InvalidInput(f"{index_path}: archive.name {name!r} is not a file beside it")
    _own_files_are_files(root, [*bundle.read_sums(root), bundle.SUMS_NAME, PUBLICATION_INDEX, name])
    sums = bundle.check_sums(root)
    if sums.modified or sums.missing or PUBLICATION_INDEX not in bundle.read_sums(root):
        changed = bundle.IntegrityReport(modified=sums.modified, missing=sums.missing).describe() or \
            f"{PUBLICATION_INDEX} is not in its SHA256SUMS"
        raise InvalidInput(f"publication {root} was changed after repro500 publish wrote it ({changed}): "
                           "obtain an untouched copy")
    if not archive.is_file() or file_digest(archive) != index["archive"].get("sha256"):
        raise InvalidInput(f"{archive} is missing or its SHA-256 differs from {index_path}: the packed run was replaced")
    return PackedIn(root, archive, index)


@dataclass(frozen=True)
class OpenedRun:
    """A run as a directory to read: where it is, what the path given was, and, for a publication,
    what it vouches for (its :class:`PackedIn`, whose ``not_carried`` the reader checks)."""

    root: Path  # the run directory: the path given, or the archive unpacked
    kind: str  # "run" (a directory), "bundle" (a packed run) or "publication"
    packed: PackedIn | None


@contextlib.contextmanager
def opened_run(path: str | Path, prefix: str = "repro500-run-") -> Iterator[OpenedRun]:
    """The run a path names (a run directory, a packed run, or a publication: its directory or
    its archive), unpacked into a temporary directory for as long as the with-block lasts: the one
    way a command reads a run it was given packed.  The publication is checked as far as it vouches
    for its archive (:func:`publication_of`); the archive is unpacked by :func:`archives.unpack`,
    which refuses path escapes and links.  Anything else is handed on as it is, as a directory or
    not: what the path must be is the reader's to say."""
    path = Path(path)
    packed = publication_of(path)
    if packed is None and not archives.is_archive(path):
        yield OpenedRun(path, "run", None)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = archives.unpack(packed.archive if packed is not None else path, tmp)
        yield OpenedRun(root, "publication" if packed is not None else "bundle", packed)
