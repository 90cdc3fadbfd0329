"""Progress of the steps that move many bytes (pack, unpack, publish, hashing data): a transient
bar on a terminal, one plain line per step elsewhere (CI logs, ``| tee``), as ``repro500 run``
shows its repeats (runner/display.py).

Small work stays quiet: a step below :data:`PROGRESS_MIN_BYTES` (``REPRO500_PROGRESS_MIN_BYTES``
changes it) shows nothing, so a run of summaries and logs packs without a word.  Everything goes
to stderr: stdout stays what the command prints as its result.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from repro500.errors import UsageError

PROGRESS_MIN_BYTES = 32 * 2**20
THRESHOLD_ENV = "REPRO500_PROGRESS_MIN_BYTES"


def min_bytes() -> int:
    raw = os.environ.get(THRESHOLD_ENV)
    if raw is None:
        return PROGRESS_MIN_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise UsageError(f"{THRESHOLD_ENV}={raw!r} is not a number of bytes (0 shows the progress of every step)")
    return value


def human_bytes(n: float) -> str:
    """Decimal units, as rich's DownloadColumn shows them: ``412.0 MB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


class Meter:
    """What a step reports as it goes: bytes done, and (unpack) which pass it is in."""

    def __init__(self, bar: Any = None, task: Any = None, label: str = "") -> None:
        self._bar, self._task, self._label = bar, task, label

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, n)

    def phase(self, name: str) -> None:
        """Start the bar again for another pass over the same bytes (unpack reads its archive twice)."""
        if self._bar is not None:
            self._bar.reset(self._task, description=f"{self._label}: {name}")


def _may_be_terminal() -> bool:
    """Whether rich could call stderr a terminal: a TTY, or a variable that forces one.  Asked
    first so that hashing off a terminal does not import rich (20 ms of a 0.2 s command)."""
    return sys.stderr.isatty() or any(os.environ.get(name) for name in ("FORCE_COLOR", "TTY_COMPATIBLE"))


@contextmanager
def step(label: str, total_bytes: int, *, files: int | None = None) -> Iterator[Meter]:
    """Show ``label`` while the block moves ``total_bytes``: ``packing x: 412.0 MB in 37 files
    ... done in 6.1 s (67.5 MB/s)`` off a terminal, a bar with the rate on one."""
    if total_bytes < min_bytes():
        yield Meter()
        return
    what = human_bytes(total_bytes) + (f" in {files} files" if files is not None else "")
    if _may_be_terminal():
        from rich.console import Console

        console = Console(emoji=False, stderr=True)
    if _may_be_terminal() and console.is_terminal:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                      TimeRemainingColumn(), console=console, transient=True) as bar:
            yield Meter(bar, bar.add_task(label, total=total_bytes), label)
        return
    stream = sys.stderr
    # one line written in two halves: a log shows what is under way while it is, and the line
    # is finished whatever happens, so an error message starts on a line of its own
    stream.write(f"{label}: {what} ...")
    stream.flush()
    started = time.monotonic()
    ending = " stopped\n"
    try:
        yield Meter()
        elapsed = max(time.monotonic() - started, 1e-6)
        ending = f" done in {elapsed:.1f} s ({human_bytes(total_bytes / elapsed)}/s)\n"
    finally:
        stream.write(ending)
        stream.flush()


class CountingReader:
    """A binary file that reports each read to a meter (tarfile reads through it)."""

    def __init__(self, raw: BinaryIO, meter: Meter) -> None:
        self._raw, self._meter = raw, meter

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._meter.advance(len(data))
        return data

    def __getattr__(self, name: str) -> Any:  # seek, tell, name, close ...: the file's own
        return getattr(self._raw, name)
