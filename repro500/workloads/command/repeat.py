"""One repeat of a wrapped command: a subprocess in its own process group (docs/command.md).

The child runs with ``cwd = workdir`` and the environment :func:`child_env` gives it; its stdout
and stderr are saved to the repeat directory as they come and handed to ``echo`` for the live
display; a timeout and Ctrl-C/SIGTERM reach the whole group.  While it runs, the files its
processes open are watched (:mod:`repro500.workloads.command.observe`).  The repeat's ``summary.json`` is
written last, atomically: its presence marks the repeat as finished for ``--resume``.  Everything
repro500 writes about the command passes through :mod:`repro500.redact`; the child's own output
is the user's and is kept as is.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.capture import interpreters
from repro500.capture.seeds import Seeds
from repro500.digest import file_digest, tree_digest
from repro500.errors import InvalidInput
from repro500.redact import REDACTED, is_secret_name, redact_text, scrub
from repro500.rundir import layout
from repro500.rundir.atomic import write_json
from repro500.statuses import REPEAT_COMPLETED, REPEAT_FAILED, REPEAT_KILLED
from repro500.tracking.names import REPEAT_ENV, RUN_ID_ENV
from repro500.workloads.command.metric_sources import (
    MetricMissing,
    Produced,
    ScriptRuns,
    read_metric,
)
from repro500.workloads.command.observe import Watch
from repro500.workloads.command.process import Child
from repro500.workloads.command.recipe import CommandSpec, child_seed, fill, merged_env

SCHEMA = layout.REPEAT_SUMMARY_SCHEMA
SUMMARY = layout.REPEAT_SUMMARY
CHECKPOINT_ENV = "REPRO500_CHECKPOINT_DIR"
METRICS_FILE = layout.COMMAND_METRICS
STDOUT, STDERR = layout.STDOUT, layout.STDERR
GRACE_S = 10.0  # SIGTERM (timeout) or SIGINT (Ctrl-C) first; SIGKILL after this long
_SECRET_FLAG = re.compile(r"^--?([A-Za-z][\w.-]*)(?:=(.*))?$", re.DOTALL)


@dataclass
class MlflowTarget:
    """Where a repeat's MLflow runs go: the store, the experiment a script's runs land in unless it
    names its own, the file that exists once repro500 has the store open and the repeat's own run
    made (it holds that run's id and experiment: ``REPRO500_MLFLOW_READY``), and how to wait until
    the store is open (repro500 opens it beside the repeat)."""

    uri: str
    experiment: str
    ready_file: Path | None = None
    wait: Callable[[], None] | None = None


@dataclass
class RepeatContext:
    """What a repeat needs from the run around it (all optional for a repeat run by hand)."""

    run_id: str = ""  # the repro500 run: tags on the script's own MLflow runs
    deterministic: bool = False
    mlflow: MlflowTarget | None = None
    exclude: list[Path] = field(default_factory=list)  # repro500's own outputs: never inputs
    source_files: frozenset[str] = frozenset()  # the experiment's files kept in source/: its code, not inputs
    echo: Callable[[str, str], None] | None = None
    started: Callable[[], None] | None = None  # called once the command's process is running


# ----- redaction ------------------------------------------------------------------------------
class _Redactor:
    """Secrets in the child's environment, and secret-looking text, out of what repro500 writes."""

    def __init__(self, env: Mapping[str, str]) -> None:
        values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= 6 and v.lower() not in ("true", "false")}
        self.values = sorted(values, key=len, reverse=True)

    def text(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, REDACTED)
        return redact_text(text)

    def argv(self, argv: list[str]) -> list[str]:
        out = [self.text(a) for a in argv]
        for i, arg in enumerate(argv):
            flag = _SECRET_FLAG.match(arg)
            if not flag or not is_secret_name(flag.group(1)):
                continue
            if flag.group(2) is not None:  # --token=VALUE
                out[i] = arg[: arg.index("=") + 1] + REDACTED
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):  # --token VALUE
                out[i + 1] = REDACTED
        return scrub(out)


# ----- one repeat -----------------------------------------------------------------------------
def child_env(spec: CommandSpec, repeat: int, seeds: Seeds, out_dir: Path,
              context: RepeatContext | None = None) -> dict[str, str]:
    """The child's environment: the one the run started with (repro500.workloads.command.launchenv), the recipe's
    fixed.env, then what repro500 sets per repeat (docs/command.md, "What the command gets")."""
    context = context or RepeatContext()
    env = merged_env(spec)
    env.update({
        "REPRO500_SEED": str(child_seed(seeds)),
        REPEAT_ENV: str(repeat),
        "REPRO500_REPEAT_DIR": str(out_dir),
        "REPRO500_METRICS": str(out_dir / METRICS_FILE),
        CHECKPOINT_ENV: str(out_dir / layout.CHECKPOINT),
        "REPRO500_DETERMINISTIC": "1" if context.deterministic else "0",
        "PYTHONHASHSEED": str(seeds.python % 2**32),  # Python accepts 0 .. 2**32 - 1
    })
    if context.run_id:
        env[RUN_ID_ENV] = context.run_id  # with REPRO500_REPEAT: the tags of the script's MLflow runs
    # Python block-buffers a pipe: without this the live display would show a script's prints
    # in bursts, and a killed script would lose its last lines.  A recipe may set it to "".
    env.setdefault("PYTHONUNBUFFERED", "1")
    if context.deterministic:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # a recipe's own (e.g. :16:8) stays
    env.pop("MLFLOW_RUN_ID", None)  # a script's runs are its own, tagged; never another run's
    target = context.mlflow
    if target is not None:
        env["MLFLOW_TRACKING_URI"] = target.uri
        if not env.get("MLFLOW_EXPERIMENT_NAME") and not env.get("MLFLOW_EXPERIMENT_ID"):
            env["MLFLOW_EXPERIMENT_NAME"] = target.experiment  # beside the repeat's run, unless the script names one
        if target.ready_file is not None:
            env["REPRO500_MLFLOW_READY"] = str(target.ready_file)
    return env


def _outputs(spec: CommandSpec, out_dir: Path) -> dict[str, str]:
    digests = {}
    for name in spec.outputs:
        for base in (out_dir, spec.workdir):
            if (base / name).is_file():
                digests[name] = file_digest(base / name)
                break
        else:
            raise MetricMissing(f"declared output {name} was not written (looked in {out_dir} and {spec.workdir})")
    return digests


def _outputs_digest(digests: Mapping[str, str]) -> str | None:
    """The declared outputs as one digest, by the formula the source snapshot's digest uses."""
    return tree_digest((digest, name) for name, digest in sorted(digests.items())) if digests else None


def _exit_error(child: Child, timeout_s: float | None, last_stderr: str) -> str | None:
    if child.timed_out:
        return f"the command exceeded fixed.timeout_s = {timeout_s:g} s and was stopped with {child.signal_name or 'SIGTERM'}"
    if child.signal_name:
        return f"the command was killed by {child.signal_name}"
    if child.returncode:
        text = f"the command exited with status {child.returncode}"
        if last_stderr:
            text += f": {last_stderr[:300]}"
        return text
    return None


def _record_interpreters(watch: Watch, program: str, workdir: Path, path_env: str | None, out_dir: Path) -> None:
    """What ran the command, kept in the repeat (the manifest's environment is read from it)."""
    found = watch.interpreters()
    program_info = None if found else interpreters.program_record(program, Path(workdir), path_env)
    write_json(out_dir / layout.INTERPRETERS, interpreters.document(found, program_info))


def run_repeat(spec: CommandSpec, repeat: int, seeds: Seeds, out_dir: Path, context: RepeatContext | None = None,
               *, grace_s: float = GRACE_S) -> dict[str, Any]:
    """Run one repeat of the command; return its summary (also written, last, to ``summary.json``).

    A failure of the command is a ``failed`` summary with one sentence in ``error``; the runner
    decides what that means for the run.  KeyboardInterrupt is forwarded to the child's group as
    SIGINT (SIGKILL after *grace_s*, or at once on a second one), recorded as ``killed``, re-raised.
    """
    context = context or RepeatContext()
    out_dir = Path(out_dir).resolve()
    _fresh_repeat_dir(out_dir)
    continued = _checkpoint(out_dir / layout.CHECKPOINT)
    argv = fill(spec, seed=child_seed(seeds), repeat=repeat, repeat_dir=str(out_dir))
    env = child_env(spec, repeat, seeds, out_dir, context)
    redactor = _Redactor(env)
    summary = _initial_summary(repeat, seeds, redactor.argv(argv))
    if continued is not None:
        summary["checkpoint"] = continued
    start = time.monotonic()
    watch = Watch(spec.observe)

    def finish(status: str, error: str | None) -> dict[str, Any]:
        summary["total_time_s"] = summary["total_time_s"] or time.monotonic() - start
        summary["metrics"]["total_time_s"] = summary["total_time_s"]
        summary.update(status=status, error=redactor.text(error) if error else None)
        with contextlib.suppress(OSError):  # a command that saved nothing leaves no empty folder behind
            (out_dir / layout.CHECKPOINT).rmdir()
        write_json(out_dir / SUMMARY, summary)
        return summary

    try:
        try:
            child = Child.start(watch.argv(argv), cwd=spec.workdir, env=watch.env(env), stdout=out_dir / STDOUT,
                                stderr=out_dir / STDERR, echo=context.echo)
        except OSError as err:
            return finish(REPEAT_FAILED, _start_error(err, argv[0], spec.workdir, env.get("PATH")))
        try:  # from here on a Ctrl-C reaches the command (its own process group): none is left running
            if context.started is not None:
                context.started()
            child.wait(spec.timeout_s, grace_s)
        except KeyboardInterrupt:
            child.interrupt(grace_s)
            summary.update(exit_status=child.exit_status, signal=child.signal_name, total_time_s=child.elapsed_s)
            finish(REPEAT_KILLED, "interrupted (Ctrl-C or SIGTERM); the command's process group was stopped")
            raise
        summary.update(exit_status=child.exit_status, signal=child.signal_name, timed_out=child.timed_out,
                       total_time_s=child.elapsed_s)
        # what it read, however it ended: a failed repeat's inputs explain it too
        summary["observed_inputs"] = _observed_inputs(watch, spec, argv[0], env, out_dir, context)
    finally:
        watch.close()
    error = _exit_error(child, spec.timeout_s, child.last_stderr)
    if error:
        return finish(REPEAT_FAILED, error)
    missing = _collect_results(spec, repeat, out_dir, context, summary)
    if missing is not None:
        return finish(REPEAT_FAILED, missing)
    return finish(REPEAT_COMPLETED, None)


def _initial_summary(repeat: int, seeds: Seeds, command: list[str]) -> dict[str, Any]:
    """A repeat's summary before the command runs: failed, with nothing measured yet."""
    return {
        "schema": SCHEMA, "repeat": repeat, "status": REPEAT_FAILED, "seeds": seeds.as_dict(), "engine": "command",
        "world_size": 1, "command": command, "exit_status": None, "signal": None, "timed_out": False,
        "metrics": {}, "metric_sources": {}, "total_time_s": 0.0, "final_param_digest": None, "outputs": {},
        "error": None,
    }


def _start_error(err: OSError, program: str, workdir: Path, path_env: str | None) -> str:
    """The sentence for a command that could not be started at all."""
    if isinstance(err, FileNotFoundError):
        # the program exists (the run checked it) when its #! line names an interpreter that does not
        shebang = interpreters.program_record(program, Path(workdir), path_env).get("shebang")
        if shebang:
            return (f"program {program} could not be started: the interpreter its #! line names "
                    f"({shebang}) was not found (workdir {workdir})")
        return f"program {program} was not found (workdir {workdir})"
    return f"program {program} could not be started ({err.strerror or err}) (workdir {workdir})"


def _observed_inputs(watch: Watch, spec: CommandSpec, program: str, env: Mapping[str, str], out_dir: Path,
                     context: RepeatContext) -> dict[str, Any] | None:
    """What the command's processes read, its interpreters recorded in the repeat on the way."""
    # repro500's own: the run, its outputs, and the file naming the repeat's MLflow run
    ready = [context.mlflow.ready_file] if context.mlflow and context.mlflow.ready_file else []
    _record_interpreters(watch, program, spec.workdir, env.get("PATH"), out_dir)
    return watch.result([out_dir.parent.parent, *context.exclude, *ready],
                        context.source_files, spec.inputs_budget_mb, spec.inputs_budget_s, cwd=spec.workdir)


def _collect_results(spec: CommandSpec, repeat: int, out_dir: Path, context: RepeatContext,
                     summary: dict[str, Any]) -> str | None:
    """Put the command's metrics, declared outputs and final digest into ``summary``; return the
    sentence naming what is missing instead, if anything is (the summary then holds none of them)."""
    target = context.mlflow
    produced = Produced(stdout=out_dir / STDOUT, stderr=out_dir / STDERR, metrics_file=out_dir / METRICS_FILE,
                        search=[out_dir, spec.workdir],
                        mlflow=ScriptRuns(target.uri, context.run_id, repeat, target.wait) if target else None)
    try:
        summary["metrics"], summary["metric_sources"] = _read_metrics(spec, produced)
        summary["outputs"] = _outputs(spec, out_dir)
    except MetricMissing as err:
        # A failed repeat reports no metric values, not the ones read before a missing output.
        summary["metrics"], summary["metric_sources"], summary["outputs"] = {}, {}, {}
        return str(err)
    summary["final_param_digest"] = produced.param_digest() or _outputs_digest(summary["outputs"])
    return None


def _checkpoint(folder: Path) -> dict[str, Any] | None:
    """Make the folder a command saves its state in (``$REPRO500_CHECKPOINT_DIR``); what an earlier
    attempt of this repeat left there (it continues from it), or None where it starts afresh.  The
    record says what the attempt started from: its files, their size and one digest over them."""
    try:
        folder.mkdir(exist_ok=True)
        # os.walk, not rglob: a link the command left there is not followed out of the folder
        files = sorted(Path(top, name) for top, _, names in os.walk(folder) for name in names
                       if not Path(top, name).is_symlink() and Path(top, name).is_file())
        if not files:
            return None
        pairs = [(file_digest(p), p.relative_to(folder).as_posix()) for p in files]
        size = sum(p.stat().st_size for p in files)
    except OSError as err:
        raise InvalidInput(f"the repeat's checkpoint folder {folder} cannot be read or made "
                           f"({err.strerror or err})") from None
    return {"continued": True, "files": len(files), "bytes": size, "sha256": tree_digest(pairs)}


def _fresh_repeat_dir(out_dir: Path) -> None:
    """The repeat's directory, with empty output streams and no earlier attempt's summary or metrics
    (a resumed repeat must not read them)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in (SUMMARY, METRICS_FILE):
            (out_dir / stale).unlink(missing_ok=True)
        for stream in (STDOUT, STDERR):
            (out_dir / stream).write_bytes(b"")
    except OSError as err:
        raise InvalidInput(f"the repeat directory {out_dir} cannot be written ({err.strerror or err})") from None


def _read_metrics(spec: CommandSpec, produced: Produced) -> tuple[dict[str, float], dict[str, str]]:
    """({metric: value}, {metric: where it was read}) for every declared metric; MetricMissing
    for the first one that is absent or not a finite number."""
    values, sources = {}, {}
    for name, decl in spec.metrics.items():
        value, label = read_metric(decl, produced)
        if not math.isfinite(value):
            raise MetricMissing(f"metric {name} is {value} ({label})")
        values[name], sources[name] = value, label
    return values, sources
