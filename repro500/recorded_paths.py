"""Where a path that a record names may be used here: the one resolver.

A run, a packed run or a publication names paths in its records: data entries and the outputs of
their generation specs, declared and observed inputs, a command's outputs, repeat directories,
source files, DVC outputs.  Every one of them was chosen by whoever wrote the record, so every
reader turns such a text into a filesystem path through :func:`resolve`, which says where it may
land or refuses it with one sentence naming the field and the file (InvalidInput, exit 4).

Never, whatever the record says (checked on the path as resolved, links and ``/proc/self/root``
aliases followed, not only on its text):

* ``..`` out of its root, or an absolute path where the path must stay under a root;
* ``.``, the root itself, or the working directory (or one above it) as a whole: a data path of
  ``.`` would make a reader hash the reproducer's whole directory before refusing it;
* ``/proc``, ``/sys`` and ``/dev``, or anything on the same file system as one of them: their
  files claim a size of 0 or 4096 and stream far more (``/proc/self/pagemap`` takes minutes);
* a FIFO, a socket or a device (a read would block or never end);
* the places the caller names as never (a publication's snapshot and the directory it came
  from): a data path ``publication/recipe.yaml`` must not land on the checked recipe, and a data
  root that holds the publication must not serve the publication's own files as data.

What a path resolves to is not read here; readers that hash it stop at its recorded size
(:mod:`repro500.capture.data`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from repro500.errors import InvalidInput
from repro500.untrusted import plain

# Kernel file systems whose files are not data: their sizes lie and their reads stream or block.
PSEUDO_ROOTS = ("/proc", "/sys", "/dev")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _pseudo_devices() -> set[int]:
    devices = set()
    for root in PSEUDO_ROOTS:
        try:
            devices.add(os.stat(root).st_dev)
        except OSError:
            continue
    return devices


def _refuse(field: str, file: Any, text: Any, why: str) -> InvalidInput:
    return InvalidInput(f"{plain(file)}: {field} {plain(repr(text))[:200]} {why}: refused")


def _lexical(text: Any, field: str, file: Any, anywhere: bool) -> PurePosixPath:
    """The path the text names, refused when it cannot be one (checks on the text alone)."""
    if not isinstance(text, str) or not text.strip() or "\x00" in text:
        raise _refuse(field, file, text, "is not a path")
    path = PurePosixPath(text)
    absolute = path.is_absolute() or text.startswith("\\") or (len(text) > 1 and text[1] == ":")
    if absolute and not anywhere:
        raise _refuse(field, file, text, "is an absolute path, where only a path under its directory is used")
    if ".." in path.parts and not anywhere:  # read where it is, ../data is a place like /data
        raise _refuse(field, file, text, "leaves its directory with '..'")
    if not absolute and not [part for part in path.parts if part != "."]:
        raise _refuse(field, file, text, "names the whole directory, not a file or directory of data in it")
    return path


def relative(text: Any, *, field: str, file: Any) -> PurePosixPath:
    """``text`` (``field`` of the record ``file``) as a path under some directory, checked on its
    text alone: where a record is read and its paths validated before anything exists to resolve
    them against (:func:`resolve` then says where each lands)."""
    return _lexical(text, field, file, anywhere=False)


def resolve(text: Any, *, field: str, file: Any, root: str | Path | None = None, anywhere: bool = False,
            never: Iterable[str | Path] = ()) -> Path:
    """The path ``text`` (``field`` of the record ``file``) names, where it may be used here.

    A relative path is taken under ``root`` (default: the working directory) and must resolve
    there, links followed; with ``anywhere`` (a recorded input or data path read where the run read
    it, never written) an absolute path or one through ``..`` is allowed too, and is then checked
    as resolved like any other.  What is refused (InvalidInput, one sentence naming ``field`` and
    ``file``) is in the module docstring.  The path returned is the one to use (``root / text``,
    not resolved), so that messages show it as the record named it."""
    path = _lexical(text, field, file, anywhere)
    base = Path(root) if root is not None else Path(".")
    candidate = Path(path) if path.is_absolute() else base / path
    real = os.path.realpath(candidate)
    if any(_under(real, pseudo) for pseudo in PSEUDO_ROOTS):
        raise _refuse(field, file, text, f"resolves to {plain(real)}, a kernel file, not data")
    if not anywhere and not _under(real, os.path.realpath(base)):
        raise _refuse(field, file, text, f"resolves to {plain(real)}, outside {plain(base)} (through a link)")
    if real == os.path.realpath(base) or _under(os.path.realpath("."), real):
        raise _refuse(field, file, text, "names the working directory (or one above it) as a whole")
    for place in never:
        kept = os.path.realpath(place)
        if _under(real, kept) or _under(kept, real):
            raise _refuse(field, file, text, f"lands on {plain(place)}, the publication's own files")
    try:
        info = os.stat(real)
    except OSError:
        return candidate  # not here (yet): where it may be written or looked for
    if info.st_dev in _pseudo_devices():
        raise _refuse(field, file, text, f"resolves to {plain(real)}, on a kernel file system, not data")
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        raise _refuse(field, file, text, f"resolves to {plain(real)}, which is not a regular file or directory "
                                        "(a FIFO, a socket or a device)")
    return candidate
