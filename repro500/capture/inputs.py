"""The data a wrapped command read, found by watching it (docs/command.md, "The data a command reads").

A built-in workload names its data; a user's program reads whatever it likes.  So, declared or
not, a command's inputs are recorded: the command workload reports the files its processes
opened (an audit hook in every Python process, or ``strace`` with ``--trace-inputs``), and this
module decides which of them are *inputs* and digests them as the data facet digests data sets
(DVC-compatible md5, the same cache):

* kept: regular files opened for reading and never for writing during the repeat;
* left out: the experiment's files copied into ``source/`` (a file beside them that was not
  copied, gitignored data for one, *is* an input), the interpreter's trees and site-packages
  (each process reports its own), Python source read as code wherever it lies (imported, run by
  ``runpy`` or shown by ``linecache``: an editable install's modules), repro500's own package,
  system trees (``/proc``, ``/sys``, ``/dev``, ``/usr``,
  ``/etc``, ...), caches (``~/.cache``, compiler caches in the temporary directory), hidden files
  and directories (credentials live there: ``~/.netrc``, ``~/.aws``, a project's ``.env``),
  loaded code (shared libraries, ``.pyc``), and repro500's own outputs (the run, the ``--out``
  directory, the tracking store);
* grouped: a directory from which :data:`DIR_MIN_FILES` or more files were read is recorded as
  one DVC directory digest (and sibling directories so recorded merge into their parent when
  nothing else of it was read), so an image folder is one entry, not a hundred thousand;
* bounded: past the byte budget (``fixed.inputs_budget_mb``), or once hashing what the digest
  cache does not know has taken the time budget (``fixed.inputs_budget_s``), an input is listed
  with its size, not hashed, and the record says so (and the run says so in one line).

The run keeps the result in ``inputs.json`` (written when the repeats end; the manifest was
sealed before they began); ``repro500 diff``, ``verify --against`` and ``reproduce`` compare it as
the data facet's ``observed`` entries.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.capture.data import OverTime, digest_paths
from repro500.errors import InvalidInput
from repro500.progress import human_bytes

SCHEMA = "repro500/inputs/v1"
DIR_MIN_FILES = 16
BUDGET_MB = 4096.0  # hashed after the repeat, beside the next one; the cache makes reruns free
BUDGET_BYTES = int(BUDGET_MB * 2**20)
# Hashing what the cache does not know yet stops after this long (each time the inputs are
# hashed: beside the next repeat, and once more after the last, where it is a cache lookup for
# everything hashed before): a run ends at most this much later for its inputs.
BUDGET_S = 60.0
SYSTEM_ROOTS = ("/proc", "/sys", "/dev", "/run", "/etc", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin",
                "/sbin", "/boot", "/snap", "/var/lib", "/var/cache", "/var/run", "/nix/store")
METHODS = ("audit-hook", "strace")
# Loaded code, not data: shared libraries and Python's byte-code caches
_COMPILED = re.compile(r"(\.so(\.\d+)*|\.pyc|\.dylib)$")
_TMP_CACHES = ("torchinductor_", "triton", "numba", "__pycache__")
# repro500's own package (an editable install lies outside site-packages): its modules, the
# run-context provider MLflow loads in the command, are never the command's data
OWN_TREE = str(Path(__file__).resolve().parents[1])


@dataclass
class Opened:
    """What one repeat's processes opened: paths read, paths written, their interpreters' trees,
    and directories a process read so many files from that it logged the directory instead."""

    read: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)
    trees: set[str] = field(default_factory=set)
    read_dirs: set[str] = field(default_factory=set)
    code: set[str] = field(default_factory=set)  # source files a Python opened to import or show them
    processes: int = 0
    relative: set[str] = field(default_factory=set)  # paths read that the command gave relative to its cwd


def read_hook_logs(directory: Path) -> Opened:
    """The ``opened-<pid>.txt`` files the child-side audit hook wrote (workloads/childsite)."""
    opened = Opened()
    for log in sorted(Path(directory).glob("opened-*.txt")):
        opened.processes += 1
        try:
            text = log.read_bytes().decode("utf-8", "surrogateescape")
        except OSError:
            continue
        for line in text.splitlines():
            kind, _, path = line.partition("\t")
            if not path:
                continue
            if kind == "r" and path.endswith("\trel"):  # the hook's mark of a relative open
                path = path[: -len("\trel")]
                opened.relative.add(os.path.abspath(path))
            if kind == "prefix":
                opened.trees.add(os.path.abspath(path))
            elif kind == "r":
                opened.read.add(os.path.abspath(path))
            elif kind == "w":
                opened.written.add(os.path.abspath(path))
            elif kind == "D":
                opened.read_dirs.add(os.path.abspath(path))
            elif kind == "c":
                opened.code.add(os.path.abspath(path))
    return opened


# strace -y: "openat(AT_FDCWD, "data.csv", O_RDONLY|O_CLOEXEC) = 3</abs/data.csv>" (with -f, a pid first)
_STRACE_OPEN = re.compile(r'^(?:\d+\s+)?(?:open|openat|openat2|creat)\(.*?, ([A-Z_|0-9]+)(?:, [^)]*)?\) = \d+<(.+)>$')
_STRACE_CREAT = re.compile(r'^(?:\d+\s+)?creat\(')


def read_strace(logs: list[Path]) -> Opened:
    """The successful opens in ``strace -ff -y -e trace=open,openat,openat2,creat`` logs, one file
    per process (so no call is split across lines by another process's)."""
    opened = Opened()
    for log in logs:
        try:
            text = Path(log).read_bytes().decode("utf-8", "surrogateescape")
        except OSError:
            continue
        opened.processes += 1
        for line in text.splitlines():
            match = _STRACE_OPEN.match(line.strip())
            if not match:
                continue
            flags, path = match.groups()
            path = _unescape(path)
            writes = _STRACE_CREAT.match(line.strip()) or any(f in flags.split("|") for f in ("O_WRONLY", "O_RDWR"))
            (opened.written if writes else opened.read).add(os.path.abspath(path))
    return opened


def _unescape(text: str) -> str:
    # strace prints non-printable bytes of a path as \xNN (or octal); decode them back
    if "\\" not in text:
        return text
    raw = re.sub(rb"\\x([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8", "surrogateescape"))
    return raw.decode("utf-8", "surrogateescape")


def _caches() -> list[str]:
    home = os.path.expanduser("~")
    found = [os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), os.path.join(home, ".config")]
    return [os.path.abspath(p) for p in found if p]


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _private_or_cache(path: str) -> bool:
    """A hidden file or directory anywhere on the path (credentials live there: ~/.netrc,
    ~/.aws/credentials, ~/.mlflow/credentials, a project's .env, as source.py leaves them out
    too), or a compiler cache in the temporary directory (torchinductor, triton)."""
    parts = path.split(os.sep)
    if any(part.startswith(".") and part not in (".", "..") for part in parts):
        return True
    tmp = tempfile.gettempdir()
    return _under(path, [tmp]) and path[len(tmp):].lstrip(os.sep).startswith(_TMP_CACHES)


def select(opened: Opened, exclude: Iterable[str | os.PathLike[str]], *,
           exclude_files: Iterable[str] = ()) -> list[str]:
    """The inputs among what was opened (module docstring), as grouped paths, sorted.  *exclude*
    are trees that are never inputs (repro500's outputs, the run); *exclude_files* single files
    (the experiment's files copied into ``source/``: an uncopied file beside them is an input)."""
    skip = [*(os.path.abspath(os.fspath(p)) for p in exclude), *sorted(opened.trees), *SYSTEM_ROOTS, *_caches(),
            OWN_TREE]
    copied = {os.path.abspath(p) for p in exclude_files}

    def kept(path: str) -> bool:
        return not (path in copied or path in opened.code or _under(path, skip) or "/site-packages/" in path
                    or "/dist-packages/" in path or _COMPILED.search(path) or _private_or_cache(path))

    files = []
    for path in sorted(opened.read - opened.written):
        if not kept(path):
            continue
        try:
            if not os.path.isfile(path):
                continue  # a directory, a device, or a file that is gone
        except OSError:
            continue
        files.append(path)
    dirs = [d for d in sorted(opened.read_dirs) if kept(d) and os.path.isdir(d) and d not in copied
            and not any(_under(c, [d]) for c in copied)]  # never the experiment's own tree
    return group(files, dirs)


def group(files: list[str], dirs: Iterable[str] = ()) -> list[str]:
    """Files, with directories from which many were read collapsed to the directory (and *dirs*,
    directories known to have been read from, taken as they are)."""
    by_dir: dict[str, list[str]] = {}
    for path in files:
        by_dir.setdefault(os.path.dirname(path), []).append(path)
    dirs = {*dirs, *(d for d, members in by_dir.items() if len(members) >= DIR_MIN_FILES)}
    loose = [p for p in files if os.path.dirname(p) not in dirs]
    changed = True
    while changed:  # imagefolder/train/cat + imagefolder/train/dog -> imagefolder/train
        changed = False
        parents: dict[str, set[str]] = {}
        for d in dirs:
            parents.setdefault(os.path.dirname(d), set()).add(d)
        for parent, children in parents.items():
            if len(children) < 2 or parent in ("", os.sep) or any(os.path.dirname(p) == parent for p in loose):
                continue
            dirs = (dirs - children) | {parent}
            changed = True
            break
    dirs = {d for d in dirs if not any(_under(d, [o]) and d != o for o in dirs)}
    loose = [p for p in loose if not _under(p, dirs)]
    return sorted([*dirs, *loose])


def digest(paths: list[str], budget_bytes: int = BUDGET_BYTES, *, jobs: int | None = None,
           budget_s: float | None = BUDGET_S) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(entries, skipped): DVC-compatible digests of *paths* within the byte budget and, for what
    the digest cache does not know, the time budget; smallest first, so a time budget spent on
    one huge directory does not leave every small file unrecorded."""
    import time


    sized = []
    skipped: list[dict[str, Any]] = []
    for path in paths:
        try:
            size, nfiles = disk_size(path)
        except OSError as err:
            skipped.append({"path": path, "reason": f"cannot be read ({err.strerror or err})"})
            continue
        sized.append((size, path, nfiles))
    deadline = None if budget_s is None else time.monotonic() + budget_s
    entries, spent = [], 0
    for size, path, nfiles in sorted(sized):
        if spent + size > budget_bytes:
            skipped.append({"path": path, "bytes": size, "nfiles": nfiles,
                            "reason": f"over the hashing budget ({budget_bytes / 2**20:g} MiB, fixed.inputs_budget_mb): "
                                      "listed with its size, not hashed"})
            continue
        try:
            entries.append(digest_paths([path], jobs=jobs, deadline=deadline)[0])
        except OverTime:
            skipped.append({"path": path, "bytes": size, "nfiles": nfiles,
                            "reason": f"not hashed within the time budget ({budget_s:g} s, fixed.inputs_budget_s): "
                                      "listed with its size"})
            continue
        except InvalidInput as err:  # vanished or unreadable since the repeat
            skipped.append({"path": path, "reason": str(err)})
            continue
        spent += size
    return sorted(entries, key=lambda e: e["path"]), sorted(skipped, key=lambda e: e["path"])


def skipped_line(skipped: list[Mapping[str, Any]]) -> str | None:
    """One line saying which inputs were not hashed and why (docs/command.md), or None."""
    if not skipped:
        return None

    def why(entry: Mapping[str, Any]) -> str:
        reason = str(entry.get("reason") or "")
        if reason.startswith("over the hashing budget"):
            return f"{human_bytes(int(entry.get('bytes') or 0))}, over the size budget"
        if reason.startswith("not hashed within"):
            return f"{human_bytes(int(entry.get('bytes') or 0))}, past the time budget"
        return reason
    shown = "; ".join(f"{e['path']} ({why(e)})" for e in skipped[:3])
    more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    return (f"{len(skipped)} input(s) the command read were not hashed (inputs.json lists them): {shown}{more}; "
            "raise fixed.inputs_budget_mb / fixed.inputs_budget_s, or declare the part it reads with --input")


def disk_size(path: str) -> tuple[int, int | None]:
    """(bytes, files) of a file or directory (files is None for a file)."""
    if not os.path.isdir(path):
        return os.stat(path).st_size, None
    total, count = 0, 0
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".hg", ".dvc")]
        for name in filenames:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
                count += 1
            except OSError:
                continue
    return total, count


def budget(observed: Mapping[str, Any]) -> int:
    """The hashing budget, in bytes, a repeat's ``observed_inputs`` were recorded under."""
    return int(float(observed.get("budget_mb") or BUDGET_MB) * 2**20)


def budget_s(observed: Mapping[str, Any]) -> float:
    """The hashing time budget, in seconds, a repeat's ``observed_inputs`` were recorded under
    (a run recorded before there was one: the default)."""
    value = observed.get("budget_s")
    return BUDGET_S if value is None else float(value)


def relative_of(paths: Iterable[str], relative: set[str]) -> list[str]:
    """Those of the selected *paths* the command gave relative to its working directory (a
    directory entry when any file read in it was)."""
    return [p for p in paths if p in relative or any(r.startswith(p.rstrip(os.sep) + os.sep) for r in relative)]


# The fields that say how a command addressed an input: how it is found again, not what it is (the
# comparison of two runs compares the bytes and the path, never these)
ADDRESSED = ("opened", "experiment", "resolved")


def addressed(path: str, *, cwd: str | None, relative: bool, root: str | None) -> dict[str, str | None]:
    """How the command addressed the input at (absolute) *path*: ``opened``, the path as it opened
    it (relative to its working directory *cwd* when it gave a relative path, else absolute: a
    cluster's ``/data/imagenet`` stays what it is); ``experiment``, the path relative to the
    experiment's directory *root* (None when unknown); ``resolved``, with every link followed."""
    return {"opened": os.path.relpath(path, cwd) if relative and cwd else path,
            "experiment": os.path.relpath(path, root) if root else None,
            "resolved": os.path.realpath(path)}


def document(summaries: Mapping[int, Mapping[str, Any]], root: str | None = None) -> dict[str, Any] | None:
    """The run's ``inputs.json`` from its repeats' ``observed_inputs``; None when no repeat has them.
    Each input keeps how the command addressed it (:func:`addressed`; *root*: the experiment's
    directory), its size and its digest."""
    observed = {k: s["observed_inputs"] for k, s in sorted(summaries.items()) if s.get("observed_inputs")}
    if not observed:
        return None
    budget_bytes = min(budget(seen) for seen in observed.values())
    seconds = min(budget_s(seen) for seen in observed.values())
    by_path: dict[str, list[int]] = {}
    for k, seen in observed.items():
        for path in seen.get("paths") or []:
            by_path.setdefault(path, []).append(k)
    entries, skipped = digest(sorted(by_path), budget_bytes, budget_s=seconds)
    relative = {p for seen in observed.values() for p in seen.get("relative") or []}
    cwd = next((seen["cwd"] for seen in observed.values() if seen.get("cwd")), None)
    for entry in (*entries, *skipped):
        entry["repeats"] = by_path.get(entry["path"], [])
        entry.update(addressed(entry["path"], cwd=cwd, relative=entry["path"] in relative, root=root))
    methods = sorted({s.get("method") for s in observed.values() if s.get("method")})
    notes = sorted({s["note"] for s in observed.values() if s.get("note")})
    return {"schema": SCHEMA, "method": methods[0] if len(methods) == 1 else (methods or None),
            "note": "; ".join(notes) or None, "observed": entries, "skipped": skipped}


def comparable(manifest: Mapping[str, Any] | None, inputs: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The manifest as ``diff`` compares it: the observed inputs as the data facet's ``observed``
    entries (a changed, added or missing one is a data difference, impact 95)."""
    if manifest is None or not inputs:
        return None if manifest is None else dict(manifest)
    facets = dict(manifest.get("facets") or {})
    data = dict(facets.get("data") or {})
    data["observed"] = [{k: v for k, v in e.items() if k != "repeats" and k not in ADDRESSED}
                        for e in inputs.get("observed") or []]
    facets["data"] = data
    return {**manifest, "facets": facets}
