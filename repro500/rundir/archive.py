"""Packing a run directory into one archive, and unpacking one safely (docs/verify.md).

``pack`` writes one ``.tar.gz`` holding ``<run-id>/...``; packing the same directory twice gives
the same bytes (fixed owner, modes and timestamps).  It stores content, never a link.

``unpack`` treats an archive as hostile.  Python's ``tarfile`` "data" filter (PEP 706) guards
each member against leaving the destination; the checks here are about the *run directory*,
which the filter does not know: they run on every header before a byte is written, and each
says why it exists next to it.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import stat
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Collection
from pathlib import Path, PurePosixPath

from repro500 import progress, untrusted
from repro500.errors import InvalidInput, UsageError
from repro500.rundir import atomic, writable
from repro500.rundir import sums as bundle
from repro500.untrusted import MAX_PATH_DEPTH, path_depth_ok

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
_FILE_MODE, _DIR_MODE = 0o644, 0o755
# the caps on what an archive may hold are repro500.untrusted's (the one rule for others' files)
MAX_UNPACK_BYTES, MAX_MEMBERS, MAX_RATIO, BOMB_FLOOR = (untrusted.MAX_UNPACK_BYTES, untrusted.MAX_MEMBERS,
                                                        untrusted.MAX_RATIO, untrusted.BOMB_FLOOR)
_CORRUPT = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)
_COPY_BYTES = 2**20  # tarfile's own 16 KiB copies cost a few percent on a run of checkpoints


def is_archive(path: str | Path) -> bool:
    """True for a file whose name says it is a tar archive (.tar.gz, .tgz, .tar)."""
    path = Path(path)
    return path.is_file() and path.name.lower().endswith(ARCHIVE_SUFFIXES)


# --------------------------------------------------------------------------- pack


def packed_files(root: Path) -> list[str]:
    """Covered entries, SHA256SUMS, and the derived views (verdict, report) that are regular files.

    A derived view that is a link is left out: it is not covered, and following it could put any
    file of the packing machine into the archive."""
    entries = bundle.scan(root)
    refused = sorted(set(entries.links) - entries.link_files)
    if refused:
        raise InvalidInput(
            f"{root / refused[0]} is a link to a directory (or to nothing): pack stores content, never a "
            "link, and a directory's files are packed under their own paths; remove the link and reseal the run")
    names = {*entries.files, *entries.links, bundle.SUMS_NAME}
    names |= {n for n in bundle.DERIVED_NAMES if _regular(root / n)}
    for dirname in bundle.DERIVED_DIRS:
        for dirpath, _, filenames in os.walk(root / dirname):
            rel_dir = Path(dirpath).relative_to(root)
            names |= {(rel_dir / f).as_posix() for f in filenames if _regular(Path(dirpath) / f)}
    return sorted(names)


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def pack(run_dir: str | Path, out: str | Path | None = None, *, force: bool = False,
         leave_out: Collection[str] = ()) -> Path:
    """Pack a run directory into one reproducible ``.tar.gz``; returns the archive's path.

    The directory must match its ``SHA256SUMS`` (an archive that would not verify is
    refused).  ``out`` defaults to ``<run-dir>.tar.gz`` next to the directory; an existing
    directory as ``out`` receives ``<run-id>.tar.gz``.  An existing archive is replaced only
    with ``force``.  The archive is written to a temporary name and renamed when complete, so an
    output that cannot be written leaves nothing behind (InvalidInput, one sentence).
    A link to a file inside the run is stored as that file's content, never as a link.
    ``leave_out``: files of the run the archive does not hold; alone it reports them missing (only a
    publication records them: repro500.rundir.excluded).
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise InvalidInput(f"{root} is not a run directory: nothing to pack")
    bundle.require_untouched(root, "refusing to pack a bundle that would not verify")
    target = Path(out) if out is not None else root.parent / f"{root.name}.tar.gz"
    if target.is_dir():
        target = target / f"{root.name}.tar.gz"
    if target.resolve().is_relative_to(root.resolve()):
        raise UsageError(f"{target} lies inside the run directory: write the archive somewhere else")
    if target.exists() and not force:
        raise InvalidInput(f"{target} already exists: remove it or pass --force to replace it")
    files = packed_files(root)
    if stray := sorted(set(leave_out) - set(files) | set(leave_out) & {bundle.SUMS_NAME}):
        raise UsageError(f"{stray[0]} is not a file of {root} that can be left out of its archive")
    files = [rel for rel in files if rel not in set(leave_out)]
    dirs = sorted({p.as_posix() for rel in files for p in PurePosixPath(rel).parents if p != PurePosixPath(".")})
    try:
        total = sum(os.stat(root / rel).st_size for rel in files)
        with progress.step(f"packing {root.name}", total, files=len(files)) as meter:
            _write_archive(root, target, dirs, files, meter)
    except OSError as err:
        if err.filename and Path(err.filename).resolve().is_relative_to(root.resolve()):
            raise InvalidInput(f"cannot read {err.filename} ({err.strerror or err.__class__.__name__}): "
                               "check the run directory's permissions") from None
        raise InvalidInput(f"cannot write the archive {target} ({err.strerror or err.__class__.__name__}): "
                           "choose a writable place with -o") from None
    return target


def _write_archive(root: Path, target: Path, dirs: list[str], files: list[str], meter: progress.Meter) -> None:
    # mtime=0 and an empty name in the gzip header keep the bytes reproducible
    with (
        atomic.atomic_path(target) as tmp,
        open(tmp, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.copybufsize = _COPY_BYTES
        tar.addfile(_tarinfo(root.name, tarfile.DIRTYPE))
        for rel in dirs:
            tar.addfile(_tarinfo(f"{root.name}/{rel}", tarfile.DIRTYPE))
        for rel in files:
            # follows a link inside (its content is stored), but never blocks on a FIFO or streams a device
            with untrusted.open_regular(root / rel, "a file of the run", sys.maxsize) as fh:
                info = _tarinfo(f"{root.name}/{rel}", tarfile.REGTYPE)
                info.size = os.fstat(fh.fileno()).st_size
                tar.addfile(info, progress.CountingReader(fh, meter))


def _tarinfo(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = _DIR_MODE if kind == tarfile.DIRTYPE else _FILE_MODE
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


# --------------------------------------------------------------------------- unpack


max_unpack_bytes = untrusted.unpack_cap  # the cap and its environment variable are untrusted's


def _unsafe(member: tarfile.TarInfo) -> str | None:
    """Why one member, on its own, must not be extracted; None when it may be."""
    name = member.name
    parts = PurePosixPath(name).parts
    if not parts:
        return "an entry with an empty name"
    # a run directory is a few levels deep; thousands of nested directories make path checks
    # quadratic and tarfile's and shutil's directory walks recurse past Python's limit
    if not path_depth_ok(parts) or not path_depth_ok(PurePosixPath(member.linkname).parts):
        return f"{'link target' if path_depth_ok(parts) else 'path'} nested more than {MAX_PATH_DEPTH} directories deep"
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return f"absolute path {name!r}"
    if ".." in parts:
        return f"path {name!r} escapes the target directory with '..'"
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        return f"device or pipe {name!r}"
    if member.issym() and (member.linkname.startswith("/") or not member.linkname):
        return f"link {name!r} -> {member.linkname!r} points outside the run directory"
    if member.islnk():
        link_parts = PurePosixPath(member.linkname).parts
        if member.linkname.startswith("/") or ".." in link_parts or not link_parts:
            return f"link {name!r} -> {member.linkname!r} points outside the run directory"
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return f"unsupported entry type for {name!r}"
    return None


def _read_members(archive: Path, cap: int, dest: Path, free: int | None,
                  meter: progress.Meter) -> tuple[list[tarfile.TarInfo], int]:
    """Every header, checked as it is read; returns the members and their declared bytes.

    The size checks run on each header before the reader moves past that member's data, so a
    member declaring 10 GB (a sparse file, or a gzip bomb of zeros) is refused without
    decompressing it."""
    members: list[tarfile.TarInfo] = []
    total = 0
    packed = archive.stat().st_size
    try:
        with _open_counted(archive, meter) as tar:
            while (member := tar.next()) is not None:
                reason = _unsafe(member)
                if reason:
                    raise InvalidInput(f"{archive} is unsafe to unpack: {reason}; refusing to extract anything")
                if member.isreg():
                    total += member.size
                if total > cap:
                    raise InvalidInput(
                        f"{archive} declares at least {_size(total)} of content, more than the {_size(cap)} a run "
                        "directory may hold (REPRO500_MAX_UNPACK_BYTES raises the cap); refusing to extract anything")
                if total > BOMB_FLOOR and total > MAX_RATIO * packed:
                    raise InvalidInput(
                        f"{archive} declares at least {_size(total)} of content in {_size(packed)}, more than "
                        f"{MAX_RATIO} times its size (a decompression bomb; a run's files do not compress so "
                        "well); refusing to extract anything")
                if free is not None and total > free:
                    raise InvalidInput(f"{archive} declares at least {_size(total)} of content but {dest} has "
                                       f"{_size(free)} free: free some space or unpack elsewhere")
                members.append(member)
                if len(members) > MAX_MEMBERS:
                    raise InvalidInput(f"{archive} holds more than {MAX_MEMBERS} entries: not a run directory")
    except PermissionError as err:
        raise InvalidInput(f"{archive} cannot be read ({err.strerror})") from None
    except (*_CORRUPT, OSError) as err:
        raise InvalidInput(f"{archive} is not a readable archive (corrupt or truncated: {err.__class__.__name__})") from None
    return members, total


@contextlib.contextmanager
def _open_counted(archive: Path, meter: progress.Meter):  # noqa: ANN202 - a context manager of a TarFile
    with untrusted.open_regular(archive, "a packed run", sys.maxsize) as raw, tarfile.open(fileobj=progress.CountingReader(raw, meter), mode="r:*") as tar:
        yield tar


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n} bytes"


def _resolve(parts: list[str], links: dict[str, str]) -> str | None:
    """Where a path inside the archive leads once its links are followed (POSIX rules), or None
    when it climbs above the archive's root, is absolute, or loops."""
    out: list[str] = []
    queue = list(parts)
    hops = 0
    while queue:
        part = queue.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return None
            out.pop()
            continue
        out.append(part)
        target = links.get("/".join(out))
        if target is not None:
            hops += 1
            if hops > untrusted.MAX_LINK_HOPS or target.startswith("/"):
                return None
            out.pop()
            queue = target.split("/") + queue
    return "/".join(out)


def _check_tree(archive: Path, members: list[tarfile.TarInfo]) -> str:
    """Checks across members, against the run directory they form; returns its name."""
    def refuse(reason: str) -> InvalidInput:
        return InvalidInput(f"{archive} is unsafe to unpack: {reason}; refusing to extract anything")

    if not members:
        raise InvalidInput(f"{archive} is empty: it holds no run directory")
    by_name: dict[str, tarfile.TarInfo] = {}
    order: dict[str, int] = {}
    for i, member in enumerate(members):
        norm = "/".join(PurePosixPath(member.name).parts)
        # a second entry of the same name replaces the first on disk: a file turned into a link
        # (or the reverse) after the checks below looked at the first one
        if norm in by_name:
            raise refuse(f"{member.name!r} appears twice")
        by_name[norm], order[norm] = member, i
    tops = {name.split("/", 1)[0] for name in by_name}
    if len(tops) != 1 or tops == {"."}:
        raise InvalidInput(f"{archive} must hold exactly one run directory at its top level, found {sorted(tops)}")
    top = tops.pop()
    if top in by_name and not by_name[top].isdir():
        raise InvalidInput(f"{archive} must hold a run directory at its top level, but {top!r} is not a directory")
    links = {name: m.linkname for name, m in by_name.items() if m.issym()}

    def inside(path: str | None) -> bool:
        return path is not None and (path == top or path.startswith(top + "/"))

    for name, member in by_name.items():
        parts = name.split("/")
        # nothing is written through a link: a link to a directory inside the run followed by
        # a file under the link would land wherever the link points when it is extracted
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in links:
                raise refuse(f"{member.name!r} would be written through the link {prefix!r}")
            if prefix in by_name and not by_name[prefix].isdir():
                raise refuse(f"{member.name!r} lies under {prefix!r}, which is not a directory")
        if member.issym():
            # the link must stay in the run directory, not merely in --dest: a run whose file links
            # to a neighbour in --dest would verify against content nobody sealed
            resolved = _resolve(parts[:-1] + member.linkname.split("/"), links)
            if not inside(resolved):
                raise refuse(f"link {member.name!r} -> {member.linkname!r} points outside the run directory")
        elif member.islnk():
            # a hard link shares the bytes of its target: that target must be a file of this
            # run extracted before it, reached without passing through a link
            target = "/".join(PurePosixPath(member.linkname).parts)
            source = by_name.get(target)
            if (not inside(target) or _resolve(target.split("/"), links) != target or source is None
                    or not source.isreg() or order[target] > order[name]):
                raise refuse(f"hard link {member.name!r} -> {member.linkname!r} does not name a file of the run directory")
    return top


def _make_dest(dest: Path) -> Path | None:
    """Create ``dest`` (and missing parents); returns the first directory created, or None."""
    first = None
    probe = dest
    while not probe.exists() and probe != probe.parent:
        first = probe
        probe = probe.parent
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInput(f"cannot create {dest} ({err.strerror or err.__class__.__name__}): "
                           "give --dest a writable directory") from None
    return first


def unpack(archive: str | Path, dest: str | Path) -> Path:
    """Unpack a packed run into ``dest``; returns ``dest/<run-id>``.

    Refuses, before writing anything (InvalidInput, one sentence): absolute paths, ``..``
    components, links whose target leaves the run directory, hard links to anything but a file
    of the run, entries written through a link, duplicate names, device files and pipes, more
    than one top-level directory, and content above the size cap or the free space of ``dest``.
    A corrupt or truncated archive raises InvalidInput.  Files land in a temporary directory
    inside ``dest`` first and are renamed into place only when everything was extracted; on any
    failure nothing is left behind (a ``dest`` this call created is removed again).
    """
    archive = Path(archive)
    if not archive.is_file():
        raise InvalidInput(f"{archive} does not exist or is not a file: give a .tar.gz made by repro500 pack")
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise InvalidInput(f"{dest} is not a directory: give --dest a directory to unpack into")
    cap = max_unpack_bytes()
    free = writable.free_bytes(dest)
    with progress.step(f"unpacking {archive}", archive.stat().st_size) as meter:
        meter.phase("checking")
        members, _ = _read_members(archive, cap, dest, free, meter)
        top = _check_tree(archive, members)
        target = dest / top
        if target.exists() or target.is_symlink():
            raise InvalidInput(f"{target} already exists: remove it or unpack into another directory")
        meter.phase("extracting")
        _extract(archive, dest, members, top, min(cap, free) if free is not None else cap, meter)
    return target


def _extract(archive: Path, dest: Path, members: list[tarfile.TarInfo], top: str, budget: int, meter: progress.Meter) -> None:
    created = _make_dest(dest)
    done = False
    staging: Path | None = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=".repro500-unpack-", dir=dest))
        with _open_counted(archive, meter) as tar:
            tar.extractall(staging, members=members, filter=_counting_filter(archive, budget))
        os.replace(staging / top, dest / top)
        done = True
    except tarfile.FilterError as err:
        raise InvalidInput(f"{archive} is unsafe to unpack: {err}; nothing was kept") from None
    except _CORRUPT as err:
        raise InvalidInput(f"{archive} could not be extracted (corrupt or truncated: {err.__class__.__name__})") from None
    except OSError as err:
        raise InvalidInput(f"could not write into {dest} ({err.strerror or err.__class__.__name__}): "
                           "give --dest a writable directory with enough space") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if not done and created is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(created)


def _counting_filter(archive: Path, budget: int):
    """The "data" filter, plus a running count of the bytes extracted: the declared sizes were
    checked already, and this keeps the promise if the archive's second reading differs."""
    written = 0

    def accept(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        nonlocal written
        member = tarfile.data_filter(member, path)
        if member is not None and member.isreg():
            written += member.size
            if written > budget:
                raise InvalidInput(f"{archive} holds more than {_size(budget)} once extracted; nothing was kept")
        return member

    return accept

