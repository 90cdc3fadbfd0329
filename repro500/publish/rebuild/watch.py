"""What a rebuild is doing, said on stderr as it happens, so that minutes of installing are not
minutes of silence; stdout stays the reproduction's answer.

A line a step as it starts (``environment: creating the venv with /usr/bin/python3.11``,
``environment: installing 143 distributions with uv from https://pypi.org/simple (up to 1.9 GB
to download)``) and as it ends (``environment: installed 143 distributions in 83 s``).  While the
installer runs, its own per-package lines are relayed, short (``  pip: Collecting six==1.16.0``,
``  uv: Prepared 143 packages in 1m 02s``); after :data:`QUIET_S` seconds with nothing to relay
(uv says nothing while it downloads) ``  still installing: 45 s, 12 of 143 distributions taken
up`` says that it goes on.  On a terminal the installer's lines and the time share one line
redrawn in place, the steps' lines staying; elsewhere (a CI log, ``2> log``) every line is
written once, plain, as it comes.

What the installer prints names the publication's packages: each relayed line has credentials
taken out (:func:`repro500.redact.redact_text`) and goes through :func:`repro500.untrusted.shown`,
so none of it can drive the reader's terminal.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
from typing import IO, Any

from repro500 import untrusted
from repro500.redact import redact_text, secret_values

PREFIX = "environment: "
QUIET_S = 15.0  # seconds without an installer line before "still ..." is said (off a terminal)
TIMEOUT_S = 3600  # one step of the installer; a longer one is stopped and named
# a relayed line is cut here (a width to read, not a cap on input): pip names every package of a
# big install on one line
RELAYED_WIDTH = 160
# The installer's lines worth a reader's eye, pip's and uv's: what it takes up, fetches, builds and
# installs, and its totals.  Index chatter, warnings and uv's " + name==version" list are left out.
_RELAYED = re.compile(r"^(?:Collecting|Processing|Obtaining|Downloading|Downloaded|Using cached|Building|Built|"
                      r"Created wheel|Installing collected packages|Successfully installed|Would install|"
                      r"Would download|Resolved|Prepared|Installed|Uninstalled|Audited)\b")
_TAKEN_UP = re.compile(r"^(?:Collecting|Processing|Obtaining)\b")  # pip: once a distribution, as it starts on it
_FROM = re.compile(r"\s+\(from .*$")  # pip's "(from -r /long/path/requirements.repro500.txt (line 3))"
_PATH = re.compile(r"^(Processing|Obtaining) (\S+)")
_CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colours, when FORCE_COLOR reaches the installer


def relayed(line: str, secrets: frozenset[str] = frozenset()) -> str | None:
    """The installer's *line* as it is relayed, short and with no credentials; None when it is
    not one a reader follows an install by.  Still the installer's text: show it with
    :func:`repro500.untrusted.shown`."""
    text = _CSI.sub("", line).strip()
    if not _RELAYED.match(text):
        return None
    text = _PATH.sub(lambda m: f"{m.group(1)} {m.group(2).rstrip('/').rsplit('/', 1)[-1]}", _FROM.sub("", text))
    text = redact_text(text, secrets)
    return text if len(text) <= RELAYED_WIDTH else text[:RELAYED_WIDTH - 3] + "..."


def seconds(elapsed: float) -> str:
    """``0.4 s``, ``83 s``: a tenth where it is worth reading."""
    return f"{elapsed:.1f} s" if elapsed < 10 else f"{elapsed:.0f} s"


class Watch:
    """The rebuild's steps on stderr (see the module docstring)."""

    def __init__(self, console: Any = None, quiet_s: float = QUIET_S) -> None:
        if console is None:
            from rich.console import Console

            console = Console(emoji=False, stderr=True)
        self._console = console
        self._quiet_s = quiet_s
        self._secrets = secret_values()

    def say(self, text: str) -> None:
        """A line of its own: a step that starts or ends.  *text* may hold the publication's names."""
        self._console.print(PREFIX + untrusted.shown(text, untrusted.SENTENCE_CHARS), highlight=False, soft_wrap=True)

    def run(self, cmd: list[str], *, doing: str, done: str, waiting: str, tool: str | None = None,
            total: int | None = None) -> subprocess.CompletedProcess[str]:
        """*cmd* run to its end, said as it goes: *doing* when it starts, *done* and the time when it
        ends well; *tool*'s lines relayed (None: none), "still *waiting*" while it is quiet, with how
        many of *total* distributions the installer took up.  Its output is kept whole for the
        sentence that names what went wrong."""
        self.say(doing)
        started = time.monotonic()
        # a Python installer (pip) writes to a pipe in blocks: unbuffered, its lines come as they happen
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
                                errors="replace", env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines: queue.Queue[str | None] = queue.Queue()
        kept: tuple[list[str], list[str]] = ([], [])
        readers = [threading.Thread(target=_read, args=(stream, into, lines), daemon=True)
                   for stream, into in ((proc.stdout, kept[0]), (proc.stderr, kept[1]))]
        for reader in readers:
            reader.start()
        try:
            stopped = self._follow(proc, lines, started, waiting, tool, total)
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C): the installer does not outlive the rebuild
                proc.kill()
            proc.wait()
            for reader in readers:
                reader.join(timeout=5)
        elapsed = time.monotonic() - started
        stdout, stderr = "".join(kept[0]), "".join(kept[1])
        if stopped:
            stderr += f"\nstopped after {TIMEOUT_S} s, the most one step may take"
        self.say(f"{done} in {seconds(elapsed)}" if proc.returncode == 0 and not stopped
                 else f"{waiting}: {tool or cmd[0]} failed after {seconds(elapsed)}")
        return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)

    def _follow(self, proc: subprocess.Popen[str], lines: queue.Queue[str | None], started: float, waiting: str,
                tool: str | None, total: int | None) -> bool:
        """Relay *proc*'s lines until both its streams end; True when it ran past :data:`TIMEOUT_S`."""
        waiting = untrusted.shown(waiting)  # it may name the experiment's own package, a name from the lock
        status = self._console.status(f"{waiting} ...") if self._console.is_terminal else None
        ended, taken_up, last_said, last_text = 0, 0, time.monotonic(), ""
        try:
            if status is not None:
                status.start()
            while ended < 2:
                try:
                    line = lines.get(timeout=min(1.0, self._quiet_s))
                except queue.Empty:
                    line = ""
                now = time.monotonic()
                if now - started > TIMEOUT_S:
                    proc.kill()
                    return True
                if line is None:
                    ended += 1
                    continue
                text = relayed(line, self._secrets) if tool and line else None
                taken_up += bool(text and _TAKEN_UP.match(text))
                last_text = f" - {tool}: {untrusted.shown(text, untrusted.SENTENCE_CHARS)}" if text else last_text
                so_far = f", {taken_up} of {total} distributions taken up" if total and taken_up else ""
                if status is not None:  # one line, redrawn: the time, and what the installer said last
                    status.update(f"{waiting}: {seconds(now - started)}{so_far}{last_text}")
                elif text:
                    self._console.print(f"  {tool}: {untrusted.shown(text, untrusted.SENTENCE_CHARS)}", highlight=False, soft_wrap=True)
                    last_said = now
                elif now - last_said >= self._quiet_s:
                    self._console.print(f"  still {waiting}: {seconds(now - started)}{so_far}", highlight=False,
                                        soft_wrap=True)
                    last_said = now
        finally:
            if status is not None:
                status.stop()
        return False


def _read(stream: IO[str] | None, into: list[str], lines: queue.Queue[str | None]) -> None:
    """Every line of *stream*, kept and handed on as it comes; None at its end."""
    try:
        for line in stream or ():
            into.append(line)
            lines.put(line)
    finally:
        lines.put(None)
