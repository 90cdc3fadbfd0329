"""Exit codes and the exceptions that carry them.

The exit codes are a documented contract (docs/contracts.md): scripts and CI systems
branch on them.  Library code raises these exceptions with one sentence a user can act
on; the command line prints that sentence and exits with the code, never a traceback.
"""

from __future__ import annotations

EXIT_OK = 0  # passed / reproduced / no result-relevant difference
EXIT_FAIL = 1  # failed / not reproduced / result-relevant difference
EXIT_USAGE = 2  # usage error (click's own code)
EXIT_INCONCLUSIVE = 3  # too few repeats, or the interval straddles the band
EXIT_INVALID = 4  # invalid input: missing, corrupt, tampered, unreadable
EXIT_NOT_COMPLETED = 5  # the work did not complete: a repeat crashed, a measurement failed, a service stopped
EXIT_INTERNAL = 70  # a bug in repro500 (sysexits' EX_SOFTWARE): an exception nothing caught
EXIT_INTERRUPTED = 130  # Ctrl-C: what finished is kept, the rest can be resumed
# Set by `repro500 reproduce` for the rerun it starts, to the reproduce command that continues it: that
# command, not `run --resume`, completes the reproduction (the rerun alone never writes its verdict),
# and the reproduction, not the rerun, prints the one verdict.
REPRODUCTION_ENV = "REPRO500_REPRODUCTION"


class ReproError(Exception):
    """An error a user can fix; ``str(err)`` is the sentence shown to them."""

    exit_code = EXIT_INVALID

    def __str__(self) -> str:
        text = super().__str__()
        # torch's DataLoader re-raises a worker's exception as the same type with the worker's
        # traceback as its message ("Caught InvalidInput in DataLoader worker process 0. Original
        # Traceback ..."); the sentence is the traceback's last line.
        if "\nOriginal Traceback" in text:
            head, sep, sentence = text.rstrip().rsplit("\n", 1)[-1].partition(": ")
            if sep and head.rsplit(".", 1)[-1] == type(self).__name__:
                return sentence
        return text


class InvalidInput(ReproError):
    """Missing, corrupt, tampered or unreadable input (exit 4)."""

    exit_code = EXIT_INVALID


class UsageError(ReproError):
    """Arguments that do not make sense together (exit 2)."""

    exit_code = EXIT_USAGE


class RunFailed(ReproError):
    """The work did not complete: a repeat crashed, a measurement or a service failed (exit 5).

    Not exit 1: a CI job reads 1 as a failed verdict, and a crash is no verdict."""

    exit_code = EXIT_NOT_COMPLETED
