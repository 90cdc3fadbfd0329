"""Write files so that a crash or Ctrl-C never leaves a half-written one behind.

Everything is first written to a temporary name in the same directory and then renamed
over the target with ``os.replace`` (atomic on POSIX file systems).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files readable by the owner only; a finished file gets the permissions a plain
# open() would have given it (0666 minus the umask).
_FILE_MODE = 0o666 & ~_current_umask()


@contextlib.contextmanager
def atomic_path(target: str | Path, suffix: str = ".partial") -> Iterator[Path]:
    """Yield a temporary path next to *target*; rename it to *target* on success.

    On any exception (KeyboardInterrupt included) the temporary file is removed and
    *target* is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, _FILE_MODE)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_bytes(target: str | Path, data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_text(target: str | Path, text: str) -> None:
    write_bytes(target, text.encode("utf-8"))


def write_json(target: str | Path, value: Any) -> None:
    """Pretty, key-sorted JSON with a trailing newline, written atomically."""
    write_text(target, json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n")
