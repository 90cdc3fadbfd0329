"""One child process of the command workload: its own process group, its streams teed, stopped
as a group.

The group is the unit: a script's DataLoader workers, a shell's children or an ``mpirun`` all
share it, so a timeout or Ctrl-C reaches every one of them, and nothing of a finished repeat is
left running into the next one (holding a GPU, writing into the next repeat's files).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

_POLL_S = 0.05
# After the child itself has ended: how long what it left behind in its group gets after SIGTERM.
STRAGGLER_GRACE_S = 2.0


def group_alive(pgid: int) -> bool:
    """True while a process of group *pgid* is still running (zombies do not count).

    ``killpg(pgid, 0)`` alone would also see zombies, which stay forever in a container whose
    PID 1 does not reap orphans; /proc tells them apart.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) "
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(pgid, sig)


class Child:
    """A started child: wait for it with a timeout, interrupt it, read how it ended."""

    def __init__(self, proc: subprocess.Popen[bytes], echo: Callable[[str, str], None] | None,
                 stdout: IO[bytes], stderr: IO[bytes], started: float) -> None:
        self.proc = proc
        self.pgid = proc.pid  # process_group=0: the child leads a group of its own
        self.started = started  # time.monotonic() before the launch (Child.start)
        self.ended: float | None = None
        self.timed_out = False
        self.last_stderr = ""
        self._echo = echo
        self._echo_lock = threading.Lock()
        assert proc.stdout is not None and proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._pump, args=(proc.stdout, stdout, "stdout"), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, stderr, "stderr"), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @classmethod
    def start(cls, argv: list[str], *, cwd: Path, env: dict[str, str], stdout: Path, stderr: Path,
              echo: Callable[[str, str], None] | None = None) -> Child:
        """Start *argv*; OSError (FileNotFoundError for a missing program) when it cannot start."""
        # Opened here, not in the reader threads: a file that cannot be written must stop the
        # start, not leave a pipe undrained until the child blocks on it.
        files = [open(stdout, "wb"), open(stderr, "wb")]  # noqa: SIM115 - the readers close them
        # The clock starts before the launch: the child runs from the moment it is forked, and a
        # parent descheduled after Popen returns (a loaded machine) would miss its first part, or
        # all of it (a repeat of 0.36 s once recorded 0.005 s).
        started = time.monotonic()
        try:
            # stdin is not the terminal's: a child waiting for input would otherwise hang the run.
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, process_group=0)
        except BaseException:
            for fh in files:
                fh.close()
            raise
        return cls(proc, echo, files[0], files[1], started)

    # ----- streams -------------------------------------------------------------------------------
    def _pump(self, pipe: IO[bytes], fh: IO[bytes], stream: str) -> None:
        # The child's bytes go to the file unchanged (they are the user's output); each line is
        # flushed so a crash or a kill keeps everything printed so far.
        with pipe, fh:
            for raw in iter(pipe.readline, b""):
                fh.write(raw)
                fh.flush()
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if stream == "stderr" and line.strip():
                    self.last_stderr = line.strip()
                if self._echo is not None:
                    try:
                        with self._echo_lock:  # lines of the two streams never interleave
                            self._echo(stream, line)
                    except Exception:  # noqa: BLE001 - a broken display must not stop the copy to disk
                        self._echo = None

    # ----- waiting and stopping ----------------------------------------------------------------
    def _wait_leader(self, seconds: float | None) -> bool:
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            # Short waits, not one long one: KeyboardInterrupt then arrives within one poll.
            step = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
            try:
                self.proc.wait(timeout=step)
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                continue
            if self.ended is None:
                self.ended = time.monotonic()
            return True

    def _wait_group(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while group_alive(self.pgid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def _stop(self, first: int, grace_s: float) -> None:
        """*first* to the group; SIGKILL to the group if the child is not gone after *grace_s*."""
        _signal_group(self.pgid, first)
        if not self._wait_leader(grace_s) or not self._wait_group(min(grace_s, STRAGGLER_GRACE_S)):
            self.kill()

    def kill(self) -> None:
        _signal_group(self.pgid, signal.SIGKILL)
        self.proc.wait()
        if self.ended is None:
            self.ended = time.monotonic()
        self._wait_group(STRAGGLER_GRACE_S)

    def _end(self, grace_s: float) -> None:
        """After the child ended: stop what it left in its group, then drain its streams."""
        if group_alive(self.pgid):
            _signal_group(self.pgid, signal.SIGTERM)
            if not self._wait_group(STRAGGLER_GRACE_S):
                _signal_group(self.pgid, signal.SIGKILL)
                self._wait_group(STRAGGLER_GRACE_S)
        for reader in self._readers:
            # A process that left the group (setsid) may still hold a pipe: do not wait forever.
            reader.join(timeout=grace_s)

    def wait(self, timeout_s: float | None, grace_s: float) -> None:
        """Until the child ends, or *timeout_s* passes (then SIGTERM, SIGKILL after *grace_s*)."""
        if not self._wait_leader(timeout_s):
            self.timed_out = True
            self._stop(signal.SIGTERM, grace_s)
        self._end(grace_s)

    def interrupt(self, grace_s: float) -> None:
        """Forward a Ctrl-C: SIGINT to the group, SIGKILL after *grace_s* or on a second Ctrl-C."""
        try:
            self._stop(signal.SIGINT, grace_s)
            self._end(min(grace_s, STRAGGLER_GRACE_S))
        except KeyboardInterrupt:
            self.kill()
            for reader in self._readers:
                reader.join(timeout=STRAGGLER_GRACE_S)

    # ----- how it ended -------------------------------------------------------------------------
    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def exit_status(self) -> int | None:
        rc = self.proc.returncode
        return rc if rc is not None and rc >= 0 else None

    @property
    def signal_name(self) -> str | None:
        rc = self.proc.returncode
        if rc is None or rc >= 0:
            return None
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"

    @property
    def elapsed_s(self) -> float:
        return (self.ended or time.monotonic()) - self.started
