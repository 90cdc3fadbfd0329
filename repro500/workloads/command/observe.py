"""Watching which files a wrapped command opens, for one repeat (docs/command.md).

``auto`` (the default): every Python process of the command loads repro500's ``sitecustomize``
(``childsite/``, first on its ``PYTHONPATH``), whose audit hook logs the files it opens; a command
that starts no Python process is not observed, and the record says so.  ``strace``
(``--trace-inputs``): the command runs under ``strace -f``, which sees every program's opens (the
hook still tells which trees are its Pythons' own).
``off``: nothing is watched.  Which of the opened files are inputs is decided by
:mod:`repro500.capture.inputs`; this module only sets the watch up and reads what it saw.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from repro500.capture import inputs
from repro500.capture.interpreters import read_hook_records
from repro500.errors import InvalidInput

MODES = ("auto", "strace", "off")
CHILD_SITE = Path(__file__).resolve().parent / "childsite"
_STRACE_LOG = "strace.txt"
_STRACE_CALLS = "trace=open,openat,openat2,creat"


def check_strace() -> str:
    """The strace program, checked to trace here (ptrace may be forbidden in a container)."""
    found = shutil.which("strace")
    if not found:
        raise InvalidInput("--trace-inputs (fixed.observe_inputs: strace) needs strace, which is not installed "
                           "(apt-get install strace); or leave it out: Python commands are observed without it")
    try:
        probe = subprocess.run([found, "-f", "-qq", "-e", "trace=none", "--", "true"], capture_output=True,
                               text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise InvalidInput(f"strace cannot run here ({err}); leave out --trace-inputs") from None
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or ["no reason given"])[-1][:200]
        raise InvalidInput(f"strace cannot trace processes here ({reason}); leave out --trace-inputs")
    return found


class Watch:
    """One repeat's watch: the environment and argv it needs, then what it saw."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.dir = Path(tempfile.mkdtemp(prefix="repro500-observe-")) if mode != "off" else None
        # Which interpreters ran is the environment's record, not an input's: kept whatever the mode
        self.interpreter_dir: Path | None = Path(tempfile.mkdtemp(prefix="repro500-python-"))

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """*env* with the hook: its directory first on PYTHONPATH, and where to log.  The hook is
        also what makes ``import mlflow`` wait for repro500's store (``REPRO500_MLFLOW_READY``) and
        records which interpreters ran (the run's environment), so it is loaded even when nothing
        is watched."""
        out = dict(env)
        # no empty entry: an empty PYTHONPATH item would put the working directory on sys.path
        out["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHILD_SITE), env.get("PYTHONPATH", "")) if p)
        if self.interpreter_dir is not None:
            out["REPRO500_INTERPRETER_DIR"] = str(self.interpreter_dir)
        if self.dir is not None:
            out["REPRO500_OBSERVE_DIR"] = str(self.dir)
        return out

    def argv(self, argv: list[str]) -> list[str]:
        if self.mode != "strace" or self.dir is None:
            return argv
        # -ff: a log per process, so no call is split across lines by another process's
        return [shutil.which("strace") or "strace", "-ff", "-qq", "-y", "-e", _STRACE_CALLS,
                "-o", str(self.dir / _STRACE_LOG), "--", *argv]

    def result(self, exclude: list[Path], exclude_files: frozenset[str] = frozenset(),
               budget_mb: float = inputs.BUDGET_MB, budget_s: float = inputs.BUDGET_S,
               cwd: Path | None = None) -> dict[str, Any] | None:
        """``observed_inputs`` for the repeat's summary: method, the input paths, a note, the
        hashing budgets they are held to, the command's working directory *cwd* and the paths it
        gave relative to it (capture.inputs.document)."""
        if self.dir is None:
            return None
        try:
            if self.mode == "strace":
                # strace sees every open; the hook's logs add which trees are the interpreters' and
                # which source files they opened as code
                opened = inputs.read_strace(sorted(self.dir.glob(_STRACE_LOG + ".*")))
                hooked = inputs.read_hook_logs(self.dir)
                opened.trees |= hooked.trees
                opened.code |= hooked.code
                method, note = "strace", None
            else:
                opened = inputs.read_hook_logs(self.dir)
                method = "audit-hook"
                note = None if opened.processes else (
                    "no Python process of the command reported its opens (a program other than Python, or "
                    "python -I/-E): declare its inputs with --input, or trace it with --trace-inputs")
            paths = inputs.select(opened, [*exclude, CHILD_SITE], exclude_files=exclude_files)
            return {"method": method, "processes": opened.processes, "paths": paths, "note": note,
                    "budget_mb": budget_mb, "budget_s": budget_s,
                    "cwd": str(Path(cwd).resolve()) if cwd is not None else None,
                    "relative": inputs.relative_of(paths, opened.relative)}
        finally:
            self.close()

    def interpreters(self) -> list[dict[str, Any]]:
        """The Python interpreters the command's processes ran, each with its distributions, in
        the order they started (repro500.capture.interpreters); read before :meth:`close`."""
        if self.interpreter_dir is None:
            return []

        return read_hook_records(self.interpreter_dir)

    def close(self) -> None:
        if self.interpreter_dir is not None:
            shutil.rmtree(self.interpreter_dir, ignore_errors=True)
            self.interpreter_dir = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
