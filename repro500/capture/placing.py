"""Where a rerun's command will read each recorded input, and putting the bytes there first.

A recorded input (``inputs.json``'s ``observed`` entries, the manifest's declared ``inputs``)
says how the command addressed it (:func:`repro500.capture.inputs.addressed`): ``opened``, the
path as it opened it (relative to its working directory, or absolute), ``experiment``, the path
relative to the experiment's directory, and the size and digest of its bytes.  A reproduction runs
the command from another directory, so before any repeat each input is resolved for the rerun's
working directory:

* opened by a relative path, the command will read ``CWD/opened``: the bytes are found there
  already, or under the reproducer's data root (at the path relative to the experiment, with the
  parts that climb out of it left off: ``../data/train.csv`` is ``DATA_ROOT/data/train.csv``; or by
  digest among the files there), or at the recorded absolute path, and linked or copied into
  place.  A place outside the rerun's tree is refused, as is one inside the publication's files;
* opened by an absolute path (``/data/imagenet`` on a cluster), the command will read that path:
  it is checked, never written;
* otherwise it is missing, and :func:`missing_error` names the path the command will open and
  where to put a copy.

Two inputs that claim one place with different digests are refused, naming both.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro500 import recorded_paths, untrusted
from repro500.capture.data import digest_path
from repro500.errors import InvalidInput

# Files of the data root hashed at most when an input is looked for by digest (the digest cache
# makes a second look a lookup); past it the look stops and the input is named missing
MAX_SCANNED = untrusted.MAX_TREE_FILES


@dataclass
class Placed:
    """One input of the rerun: where the command will read it and where the bytes came from."""

    opened: str  # as the command opens it
    target: Path  # where that is for the rerun
    md5: str
    how: str  # "in place" | "linked" | "copied" | "at its recorded path" | "missing" | "differs"
    source: Path | None = None

    @property
    def ok(self) -> bool:
        return self.how not in ("missing", "differs")

    def line(self) -> str:
        """One line of the plan: where the command reads the input and where it came from."""
        where = f"{untrusted.plain(self.opened)}: read at {untrusted.plain(self.target)}"
        if self.how == "missing":
            return f"{where}: missing (md5 {self.md5[:12]}); put a copy there, or under --data-root"
        if self.how == "differs":
            return f"{where}: other bytes are there than the recorded md5 {self.md5[:12]}"
        came = f" from {untrusted.plain(self.source)}" if self.source is not None and self.how in ("linked", "copied") else ""
        return f"{where} ({self.how}{came}, md5 {self.md5[:12]} matches)"


def _md5(path: Path) -> str | None:
    try:
        return str(digest_path(path)["md5"]) if path.exists() else None
    except (InvalidInput, OSError):
        return None


def _within(relative: str) -> str | None:
    """*relative* with the parts that climb out of its directory left off (``../data/x`` -> ``data/x``);
    None when nothing is left."""
    parts = [p for p in Path(os.path.normpath(relative)).parts if p not in ("..", ".", os.sep)]
    return os.path.join(*parts) if parts else None


def _allowed(text: str, protected: list[Path], root: Path | None = None) -> Path | None:
    """*text* (under *root*, or absolute) where the one path rule lets it be read, else None.  A
    candidate is only where the bytes may be: one the rule refuses (a kernel file, the publication's
    own files in a data root that holds the publication) is not looked at, rather than the whole
    reproduction refused for a place the command never reads."""
    try:
        return recorded_paths.resolve(text, field="input path", file="the recorded inputs", root=root,
                                      anywhere=True, never=protected)
    except InvalidInput:
        return None


def _candidates(entry: Mapping[str, Any], data_root: Path | None, protected: list[Path]) -> list[Path]:
    """Where the bytes may be, in order: under the data root at the path relative to the experiment
    (and as opened), then the recorded absolute path."""
    texts: list[tuple[str, Path | None]] = []
    if data_root is not None:
        for relative in (entry.get("experiment"), entry.get("opened")):
            inner = _within(relative) if isinstance(relative, str) and not os.path.isabs(relative) else None
            if inner:
                texts.append((inner, data_root))
    for recorded in (entry.get("resolved"), entry.get("path")):
        if isinstance(recorded, str) and os.path.isabs(recorded):
            texts.append((recorded, None))
    out: list[Path] = []
    for text, root in texts:
        path = _allowed(text, protected, root)
        if path is not None and path not in out:
            out.append(path)
    return out


def _by_digest(md5: str, size: Any, data_root: Path | None, protected: list[Path]) -> Path | None:
    """A file of the data root with these bytes (same size first, then the digest), never one of
    the publication's own files (the default data root, the working directory, may hold them)."""
    if data_root is None or not data_root.is_dir() or not isinstance(size, int):
        return None
    kept = [p.resolve() for p in protected]
    scanned = 0
    for folder, dirs, files in os.walk(data_root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and (Path(folder) / d).resolve() not in kept)
        for name in sorted(files):
            path = Path(folder) / name
            scanned += 1
            if scanned > MAX_SCANNED:
                return None
            try:
                if path.is_file() and path.stat().st_size == size and path.resolve() not in kept \
                        and _md5(path) == md5:
                    return path
            except OSError:
                continue
    return None


def _put(source: Path, target: Path) -> str:
    """Link (a hard link of a file, where the file system allows) or copy *source* to *target*."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, symlinks=False)
        return "copied"
    try:
        os.link(source, target)
        return "linked"
    except OSError:
        shutil.copy2(source, target)
        return "copied"


def _target(entry: Mapping[str, Any], cwd: Path, tree: Path, protected: list[Path]) -> tuple[str, Path, bool]:
    """(as opened, where the rerun's command reads it, whether it may be written), by the one path
    rule (:func:`repro500.recorded_paths.resolve`): a relative path lands in the rerun's tree (never
    out of it, through ``..`` or a link, nor on the publication's files); an absolute one is read
    where it is, never a kernel file nor the publication's files.  InvalidInput otherwise."""
    opened = entry.get("opened") or entry.get("path")
    if not isinstance(opened, str) or not opened:
        raise InvalidInput("a recorded input has no path: the record is not what repro500 writes")
    file = f"the recorded input {untrusted.plain(opened)}"
    if os.path.isabs(opened):
        return opened, recorded_paths.resolve(opened, field="read at its recorded path", file=file, anywhere=True,
                                              never=protected), False
    # the command climbs out of its working directory (``../data``) but stays in the rerun's tree:
    # the rule is applied to the place relative to the tree, where ``..`` means outside it
    inside = os.path.relpath(os.path.normpath(cwd / opened), tree)
    target = recorded_paths.resolve(inside, field="read from the rerun's directory as", file=file, root=tree,
                                    never=protected)
    return opened, target, True


def _conflicts(entries: list[Mapping[str, Any]], targets: list[Path]) -> None:
    claimed: dict[Path, Mapping[str, Any]] = {}
    for entry, target in zip(entries, targets, strict=True):
        other = claimed.setdefault(target, entry)
        if other is not entry and other.get("md5") != entry.get("md5"):
            raise InvalidInput(f"two recorded inputs claim {untrusted.plain(target)} with different digests: "
                               f"{untrusted.plain(other.get('opened') or other.get('path'))} (md5 {other.get('md5')}) and "
                               f"{untrusted.plain(entry.get('opened') or entry.get('path'))} (md5 {entry.get('md5')})")


def place_inputs(entries: Iterable[Mapping[str, Any]], *, cwd: Path, tree: Path, data_root: Path | None = None,
                 protected: Iterable[Path] = ()) -> list[Placed]:
    """Each recorded input with a digest, placed where the rerun's command (working directory *cwd*,
    inside the rerun's directory *tree*) will read it: one :class:`Placed` each, in order.  Nothing
    is written until every input's place is known to be allowed and unclaimed by another."""
    entries = [e for e in entries if isinstance(e, Mapping) and e.get("md5")]
    kept = [Path(p) for p in protected]
    resolved = [_target(e, Path(cwd), Path(tree), kept) for e in entries]
    _conflicts(entries, [target for _, target, _ in resolved])
    placed: list[Placed] = []
    done: dict[Path, Placed] = {}
    for entry, (opened, target, writable) in zip(entries, resolved, strict=True):
        md5 = str(entry["md5"])
        if target in done:  # the same bytes claimed twice: placed once
            placed.append(Placed(opened, target, md5, done[target].how, done[target].source))
            continue
        found = _md5(target)
        if found is not None:
            how = ("in place" if writable else "at its recorded path") if found == md5 else "differs"
            placed.append(Placed(opened, target, md5, how, target))
        elif not writable:
            placed.append(Placed(opened, target, md5, "missing"))
        else:
            source = next((c for c in _candidates(entry, data_root, kept) if _md5(c) == md5), None)
            if source is None and entry.get("kind", "file") == "file":
                source = _by_digest(md5, entry.get("size"), data_root, kept)
            how = _put(source, target) if source is not None else "missing"
            placed.append(Placed(opened, target, md5, how, source))
        done[target] = placed[-1]
    return placed


def missing_error(placed: list[Placed]) -> InvalidInput | None:
    """The refusal, before any repeat runs, when an input is not where the command will look: it
    names the path the command will open and where to put a copy; None when every input is there."""
    missing = [p for p in placed if not p.ok]
    if not missing:
        return None
    first = missing[0]
    more = f" and {len(missing) - 1} more (one a line above)" if len(missing) > 1 else ""
    return InvalidInput(f"the command will open {untrusted.plain(first.opened)} at {untrusted.plain(first.target)}, "
                        f"which {'holds other bytes than' if first.how == 'differs' else 'lacks'} the recorded data "
                        f"(md5 {first.md5}){more}: put a copy there, or pass --data-root DIR holding it (at its path "
                        "relative to the experiment, or anywhere under DIR: it is found by digest), or rerun anyway "
                        "with --allow-data-differences (the verdict then names each difference)")
