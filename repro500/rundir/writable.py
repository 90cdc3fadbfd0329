"""One sentence for an output that cannot be written (permissions, a file in the way, a full disk).

Writes go through :mod:`repro500.rundir.atomic`, so a failure leaves nothing half-written; this module
only turns the ``OSError`` into the sentence a user can act on (exit 4, docs/contracts.md).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from repro500.errors import InvalidInput

# The file-system failures a user meets and fixes; any other OSError is not guessed at.
USER_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ENOENT,
                         errno.EEXIST, errno.ENOSPC, errno.EDQUOT, errno.ENAMETOOLONG, errno.ELOOP,
                         errno.ETXTBSY})


def reason(err: OSError) -> str:
    """What went wrong, naming the place (``no write permission in /srv/runs/x``)."""
    name = Path(str(err.filename)) if err.filename else None
    where = str(name.parent) if name is not None and str(name.parent) else "."
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"no write permission in {where}"
    if err.errno == errno.EROFS:
        return f"{where} is on a read-only file system"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left for {where} (disk or quota full)"
    if err.errno in (errno.EEXIST, errno.ENOTDIR) and name is not None:
        # mkdir of a parent that is a file (/dev/null/x), or a path through a file
        blocker = next((p for p in (name, *name.parents) if p.exists() and not p.is_dir()), name)
        return f"{blocker} is not a directory"
    if err.errno == errno.EISDIR and name is not None:
        return f"{name} is a directory"
    text = (err.strerror or os.strerror(err.errno or 0)).lower()
    return f"{text}: {name}" if name is not None else text


def free_bytes(path: str | Path) -> int | None:
    """Free space of the file system that holds (or will hold) ``path``: its nearest existing
    ancestor's; None when it cannot be read."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


@contextlib.contextmanager
def writing(what: str, target: str | Path, hint: str) -> Iterator[None]:
    """Turn a file-system failure inside the block into InvalidInput: ``cannot write <what> <target>:
    <reason>; <hint>``."""
    try:
        yield
    except OSError as err:
        if err.errno not in USER_ERRNOS:
            raise
        raise InvalidInput(f"cannot write {what} {target}: {reason(err)}; {hint}") from None
