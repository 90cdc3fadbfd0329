"""The ``repro500`` command line.

Thin by design: each sub-command lives in ``repro500/commands/<name>.py``, parses its
arguments and calls library functions.  Sub-commands are imported only when invoked, so
``repro500 --help`` never pays for torch, mlflow or scipy (it must start in < 0.3 s).

Every error a user can meet is printed here, once, as one line ``repro500: error: ...`` with
its documented exit code (docs/contracts.md): repro500's own errors, click's usage errors
(a misspelt option keeps click's "did you mean"), and files that cannot be written or read.
A reader that closes the pipe early (``repro500 verify RUN | head -1``) does not change the
exit code: the rest of the output is dropped and the command ends as it would have.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
from pathlib import Path

import click

from repro500 import __version__, untrusted

# name -> (module, attribute, one-line help shown by ``repro500 --help``)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "capture": ("repro500.commands.capture", "capture", "Snapshot code, environment, seeds, data and hardware into a manifest."),
    "diff": ("repro500.commands.diff", "diff", "Compare two manifests or run directories, most result-relevant first."),
    "data": ("repro500.commands.data", "data", "Generate synthetic scientific datasets and check dataset files."),
    "run": ("repro500.commands.run", "run", "Run a benchmark recipe or your own command several times with full provenance."),
    "init": ("repro500.commands.init", "init", "Put your own experiment under repro500 and DVC (repro500.yaml, params.yaml, dvc.yaml)."),
    "status": ("repro500.commands.status", "status", "Say where a run stands, repeat by repeat (a detached run's SLURM tasks too)."),
    "verify": ("repro500.commands.verify", "verify", "Decide statistically whether a run holds or reproduces a reference."),
    "locate": ("repro500.commands.locate", "locate", "Say where two runs part: the first step, the first operator, the likely cause."),
    "sign": ("repro500.commands.sign", "sign", "Sign a run: an in-toto attestation of its files, signed with your SSH key."),
    "pack": ("repro500.commands.pack", "pack", "Pack a run directory into one archive that verifies anywhere."),
    "unpack": ("repro500.commands.pack", "unpack", "Unpack a packed run safely into a directory."),
    "report": ("repro500.commands.report", "report", "Write a self-contained HTML report of a run."),
    "publish": ("repro500.commands.publish", "publish", "Write a self-contained publication of a run for others to reproduce."),
    "reproduce": ("repro500.commands.reproduce", "reproduce", "Rerun a published result and verify it against the publication."),
    "export": ("repro500.commands.export", "export", "Export a run in another format: export mlperf writes an MLPerf submission tree."),
    "history": ("repro500.commands.history", "history", "Show a metric across earlier runs and what changed where it moved."),
    "plan": ("repro500.commands.plan", "plan", "Say how many repeats the bands and an equivalence test need."),
    "model": ("repro500.commands.model", "model", "Predict step time and scaling efficiency with a fitted alpha-beta model."),
    "ops": ("repro500.commands.ops", "ops", "Benchmark operators: time, FLOP/s, bytes/s and error against float64 (--inference: a model's latency)."),
    "roofline": ("repro500.commands.roofline", "roofline", "Measure the machine's ceilings: peak FLOP/s, memory bandwidth, interconnect."),
    "io": ("repro500.commands.io", "io", "Measure read throughput of repro500's data formats against a raw read."),
    "ui": ("repro500.commands.ui", "ui", "Start the MLflow UI on the configured tracking store."),
}


class LazyGroup(click.Group):
    """A click group that imports a sub-command's module only when it is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module_name, attr, _ = COMMANDS[cmd_name]
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as err:
            raise _one_line(err) from None

    def invoke(self, ctx: click.Context):  # noqa: ANN201 - click's signature
        from repro500.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_INVALID, ReproError

        try:
            return super().invoke(ctx)
        except ReproError as err:
            _error(str(err))
            ctx.exit(err.exit_code)
        except click.exceptions.Exit:
            raise
        except click.ClickException as err:
            raise _one_line(err) from None
        except KeyboardInterrupt:
            click.echo("repro500: interrupted; finished work is kept on disk.", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        except Exception as err:  # noqa: BLE001 - the last resort: one line and a code of its own
            sentence = _os_error_sentence(err) if isinstance(err, OSError) else None
            if sentence is None:
                _internal_error(err)
                ctx.exit(EXIT_INTERNAL)
            _error(sentence)
            ctx.exit(EXIT_INVALID)


def _error(text: str) -> None:
    """Print ``repro500: error: <text>`` on one line, with anything secret-looking removed."""
    from repro500.redact import redact_text

    # a sentence may quote what a run chose (a tag, a name): no control or bidi character of it reaches the terminal
    sentence = untrusted.plain(" ".join(redact_text(text).split()), untrusted.SENTENCE_CHARS)
    click.echo(f"repro500: error: {sentence}", err=True)


def _internal_error(err: Exception) -> None:
    """A bug: one line saying so, and the traceback in a file (redacted) for the bug report.

    Its own exit code (70), not 1: a CI job reads 1 as a failed verdict and would take a crash for one."""
    import datetime
    import tempfile
    import traceback

    from repro500.capture.cache import cache_dir
    from repro500.redact import redact_text

    text = redact_text("".join(traceback.format_exception(err)))
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    where = None
    for folder in (lambda: cache_dir("crashes"), lambda: Path(tempfile.gettempdir())):
        try:
            path = folder() / f"repro500-crash-{stamp}-{os.getpid()}.txt"
            path.write_text(text, encoding="utf-8")
            where = path
            break
        except OSError:
            continue
    said = f"traceback in {where}" if where else "its traceback could not be written anywhere"
    _error(f"internal error (a bug in repro500, please report it): {type(err).__name__}: {err}; {said}")


class _OneLineError(click.ClickException):
    """click's error shown as one ``repro500: error:`` line instead of its Usage/Try/Error block."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None) -> None:  # noqa: ANN001 - click's signature
        _error(self.message)


def _one_line(err: click.ClickException) -> click.ClickException:
    if isinstance(err, (_OneLineError, click.exceptions.NoArgsIsHelpError)):
        return err  # the help page itself is the answer to `repro500 <command>` without arguments
    message = err.format_message().rstrip()
    ctx = getattr(err, "ctx", None)
    if isinstance(err, click.UsageError) and ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    if isinstance(err, click.FileError):
        from repro500.errors import EXIT_INVALID

        return _OneLineError(f"{err.ui_filename}: {message}", EXIT_INVALID)
    return _OneLineError(message, err.exit_code)


def _os_error_sentence(err: OSError) -> str | None:
    """A file-system failure a user meets (repro500.rundir.writable.USER_ERRNOS) that no command put in
    words itself, as one sentence; None for any other OSError (not guessed at)."""
    from repro500.rundir.writable import USER_ERRNOS

    if err.errno not in USER_ERRNOS or not err.filename:
        return None
    where = str(err.filename) + (f" -> {err.filename2}" if err.filename2 else "")
    return f"cannot use {where}: {(err.strerror or os.strerror(err.errno)).lower()}"


class _ClosedPipeSafe(io.TextIOBase):
    """stdout/stderr that, once the reader has gone (``| head -1``), drops further output silently.

    Without it the first write after the reader left raises BrokenPipeError, which click turns
    into exit 1, the code of a FAILED verdict.
    """

    def __init__(self, stream: io.TextIOBase) -> None:
        super().__init__()
        self._stream = stream
        self._gone = False

    def _reader_left(self) -> None:
        self._gone = True
        # Point the descriptor at /dev/null, so that the interpreter's last flush of the buffered
        # text (and any child process writing to it) finds no closed pipe either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                # names from someone else's run reach the terminal: no OSC/DCS, no bare controls
                self._stream.write(untrusted.terminal_safe(text))
                return len(text)
            except BrokenPipeError:
                self._reader_left()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_left()

    def __getattr__(self, name: str):  # noqa: ANN204 - encoding, errors, buffer, isatty, fileno ...
        return getattr(self._stream, name)

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self._stream.errors


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="repro500")
def cli() -> None:
    """repro500: deep-learning benchmark results you can check.

    \b
    Typical flow:
      repro500 run experiments/quickstart.yaml      # capture + repeats + MLflow
      repro500 verify runs/<run-id>                  # statistical verdict
      repro500 report runs/<run-id>                  # report.html

    Exit codes: 0 pass/reproduced, 1 fail/not reproduced, 2 usage error,
    3 inconclusive, 4 invalid input (missing, corrupt, tampered), 5 not completed
    (a repeat crashed, a measurement failed), 70 internal error (a bug), 130 interrupted
    (Ctrl-C; a run keeps its finished repeats: repro500 run --resume).
    """


def main() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _ClosedPipeSafe):
            setattr(sys, name, _ClosedPipeSafe(stream))
    try:
        cli(prog_name="repro500")
    except SystemExit as done:
        if "mlflow" not in sys.modules:
            # what the interpreter's exit does first: the threads that are not daemons end (a pool's
            # idle workers are told to); with MLflow loaded they were never waited for
            import threading

            shutdown = getattr(threading, "_shutdown", None)
            if shutdown is None:
                raise
            shutdown()
        _exit_without_teardown(done.code)


def _exit_without_teardown(code: object) -> None:
    """Exit as ``sys.exit(code)`` would, but without the interpreter's module teardown, which comes
    after every result is on disk and every file is closed: with MLflow loaded (SQLAlchemy,
    alembic, pandas, ...) it takes about a second, and 0.2 s after a wrapped command's run whose
    MLflow is in a process of its own (the wrapping budget is 2 %).  atexit handlers still run."""
    import atexit

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
