"""The command workload: one repeat of a user's own program, run as a subprocess.

A recipe with ``fixed.workload: command`` names an argv with placeholders (``{seed}``,
``{repeat}``, ``{repeat_dir}``, ``{mutable.KEY}``) and a ``metrics:`` section saying where each
metric comes from (:mod:`repro500.workloads.metric_sources`).  The runner calls, per repeat::

    spec = CommandSpec.from_recipe(recipe["fixed"], recipe["metrics"], recipe["mutable"], source=path)
    check(spec)                                    # before anything is written
    summary = run_repeat(spec, k, seeds.derive(S, k), run_dir / "repeats" / str(k), mlflow=(uri, run_id))

The child runs in its own process group with ``cwd = workdir``; its stdout and stderr are saved
to the repeat directory as they come and handed to ``echo`` for the live display; a timeout and
Ctrl-C/SIGTERM reach the whole group.  The repeat's ``summary.json`` is written last, atomically:
its presence marks the repeat as finished for ``--resume``.  Everything repro500 writes about the
command passes through :mod:`repro500.redact`; the child's own output is the user's and is kept
as is (docs/command.md).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import string
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.atomic import write_json
from repro500.capture.seeds import Seeds
from repro500.digest import file_digest
from repro500.errors import InvalidInput
from repro500.redact import REDACTED, is_secret_name, redact_text, scrub
from repro500.workloads.command_process import Child, group_alive
from repro500.workloads.metric_sources import MetricDecl, MetricMissing, Produced, read_metric

SCHEMA = "repro500/repeat-summary/v1"
SUMMARY = "summary.json"
METRICS_FILE = "metrics.json"
STDOUT, STDERR = "stdout.txt", "stderr.txt"
GRACE_S = 10.0  # SIGTERM (timeout) or SIGINT (Ctrl-C) first; SIGKILL after this long
# Set by repro500 for every repeat: a recipe's fixed.env may not set them.
RESERVED_ENV = frozenset({"REPRO500_SEED", "REPRO500_REPEAT", "REPRO500_REPEAT_DIR", "REPRO500_METRICS",
                          "REPRO500_DETERMINISTIC", "PYTHONHASHSEED", "MLFLOW_RUN_ID"})
RESERVED_METRICS = frozenset({"total_time_s"})  # measured by repro500 itself
_SCALARS = (str, int, float)
_FORMATTER = string.Formatter()
_SECRET_FLAG = re.compile(r"^--?([A-Za-z][\w.-]*)(?:=(.*))?$", re.DOTALL)
_WHOLE = re.compile(r"^\{mutable\.([^{}!:]+)\}$")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def child_seed(seeds: Seeds) -> int:
    """The one seed the child gets (``REPRO500_SEED``, ``{seed}``).

    The repeat's 32-bit numpy word rather than the 64-bit torch one: a script seeds everything
    from one number, and ``numpy.random.seed``, scikit-learn and others refuse seeds >= 2**32.
    """
    return seeds.numpy


@dataclass
class CommandSpec:
    """A command workload, validated from a recipe (or built by hand, then :func:`check` it)."""

    argv: list[str]
    workdir: Path
    timeout_s: float | None = None
    outputs: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, MetricDecl] = field(default_factory=dict)
    mutable: dict[str, Any] = field(default_factory=dict)
    source: str = "recipe"  # prefixes error sentences

    @classmethod
    def from_recipe(cls, fixed: Mapping[str, Any], metrics: Mapping[str, Any] | None,
                    mutable: Mapping[str, Any] | None, *, source: str, base: Path | None = None) -> CommandSpec:
        """Validate the recipe's command parts; relative paths are relative to *base* (the cwd)."""
        def bad(key: str, what: str) -> InvalidInput:
            return InvalidInput(f"{source}: {key}: {what}")

        command = fixed.get("command")
        if isinstance(command, str):
            import shlex

            command = shlex.split(command)
        if not isinstance(command, list) or not command:
            raise bad("fixed.command", "expected a non-empty list such as [python, train.py, --seed, '{seed}']")
        for i, arg in enumerate(command):
            if isinstance(arg, bool) or not isinstance(arg, _SCALARS):
                raise bad("fixed.command", f"argument {i} is a {type(arg).__name__}; every argument is a string or a number")
        workdir = fixed.get("workdir", ".")
        if not isinstance(workdir, str) or not workdir:
            raise bad("fixed.workdir", "expected a directory path")
        timeout_s = fixed.get("timeout_s")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not timeout_s > 0):
            raise bad("fixed.timeout_s", f"expected a positive number of seconds or null, not {timeout_s!r}")
        outputs = fixed.get("outputs") or []
        if not isinstance(outputs, list) or not all(isinstance(o, str) and o for o in outputs):
            raise bad("fixed.outputs", "expected a list of file paths")
        for name in outputs:
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise bad("fixed.outputs", f"{name!r} must be relative to the repeat directory or the workdir")
        env = fixed.get("env") or {}
        if not isinstance(env, Mapping):
            raise bad("fixed.env", "expected a mapping of variable names to values")
        for name, value in env.items():
            if name in RESERVED_ENV:
                raise bad(f"fixed.env.{name}", "is set by repro500 for every repeat; remove it")
            if isinstance(value, bool) or not isinstance(value, _SCALARS):
                raise bad(f"fixed.env.{name}", "expected a string or a number")
        if metrics is not None and not isinstance(metrics, Mapping):
            raise bad("metrics", "expected a mapping of metric names to declarations")
        decls = {}
        for name, raw in (metrics or {}).items():
            if not isinstance(name, str) or not name or name in RESERVED_METRICS:
                raise bad(f"metrics.{name}", "is not a usable metric name (total_time_s is measured by repro500)")
            decls[name] = MetricDecl.parse(name, raw, where=f"{source}: metrics.{name}")
        if mutable is not None and not isinstance(mutable, Mapping):
            raise bad("mutable", "expected a mapping")
        spec = cls(
            argv=[str(a) for a in command],
            workdir=((base or Path.cwd()) / workdir).resolve(),
            timeout_s=float(timeout_s) if timeout_s is not None else None,
            outputs=list(outputs),
            env={str(k): str(v) for k, v in env.items()},
            metrics=decls,
            mutable=dict(mutable or {}),
            source=source,
        )
        fill(spec, seed=0, repeat=0, repeat_dir="repeat_dir")  # unknown placeholders fail here
        return spec


def declared_metrics(spec: CommandSpec) -> list[str]:
    """The metric names the recipe declares (a repeat reports these and ``total_time_s``)."""
    return list(spec.metrics)


# ----- placeholders ---------------------------------------------------------------------------
def _mutable_value(spec: CommandSpec, path: str, placeholder: str, *, whole: bool = False) -> Any:
    node: Any = spec.mutable
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            known = ", ".join(sorted(spec.mutable)) or "none"
            raise InvalidInput(f"{spec.source}: fixed.command: placeholder {placeholder} names no mutable value (mutable has: {known})")
        node = node[part]
    if whole and isinstance(node, list) and all(isinstance(v, _SCALARS) and not isinstance(v, bool) for v in node):
        return node
    if isinstance(node, (Mapping, list)) or node is None:
        hint = "; a list fills a whole argument only, as several arguments" if isinstance(node, list) else ""
        raise InvalidInput(f"{spec.source}: fixed.command: placeholder {placeholder} is not a single value (it is {node!r}){hint}")
    return node


def _fill_one(spec: CommandSpec, arg: str, values: Mapping[str, Any]) -> str:
    hint = "use {seed}, {repeat}, {repeat_dir}, {mutable.KEY}, or {{ and }} for literal braces"
    try:
        parts = list(_FORMATTER.parse(arg))
    except ValueError as err:
        raise InvalidInput(f"{spec.source}: fixed.command: argument {arg!r} is not a valid template ({err}); {hint}") from None
    out = []
    for literal, name, spec_text, conversion in parts:
        out.append(literal)
        if name is None:
            continue
        placeholder = "{" + name + "}"
        if conversion:
            raise InvalidInput(f"{spec.source}: fixed.command: placeholder {placeholder}!{conversion} takes no conversion")
        if name in values:
            value = values[name]
        elif name.startswith("mutable.") and len(name) > len("mutable."):
            value = _mutable_value(spec, name.removeprefix("mutable."), placeholder)
        else:
            raise InvalidInput(f"{spec.source}: fixed.command: unknown placeholder {placeholder} in {arg!r}; {hint}")
        try:
            out.append(format(value, spec_text or ""))
        except (ValueError, TypeError) as err:
            raise InvalidInput(f"{spec.source}: fixed.command: placeholder {{{name}:{spec_text}}} cannot format {value!r} ({err})") from None
    return "".join(out)


def fill(spec: CommandSpec, *, seed: int, repeat: int, repeat_dir: str) -> list[str]:
    """The argv of one repeat: every placeholder replaced (``{mutable.lr:.3f}`` formats too)."""
    values = {"seed": seed, "repeat": repeat, "repeat_dir": repeat_dir}
    argv: list[str] = []
    for arg in spec.argv:
        # An argument that is only ``{mutable.KEY}`` holding a list becomes one argument per item
        # (``--layers {mutable.layers}`` -> ``--layers 64 32``, argparse's nargs="+").
        whole = _WHOLE.match(arg)
        if whole:
            value = _mutable_value(spec, whole.group(1), arg, whole=True)
            if isinstance(value, list):
                argv.extend(str(v) for v in value)
                continue
        argv.append(_fill_one(spec, arg, values))
    return argv


# ----- pre-flight -----------------------------------------------------------------------------
def _merged_env(spec: CommandSpec) -> dict[str, str]:
    return {**os.environ, **spec.env}


def check(spec: CommandSpec, *, tracking: bool = True) -> None:
    """Everything that can be known wrong before the first repeat; one sentence each (exit 4)."""
    where = spec.source
    if not spec.workdir.is_dir():
        raise InvalidInput(f"{where}: fixed.workdir {spec.workdir} is not a directory")
    for name, decl in spec.metrics.items():
        decl.validate(f"{where}: metrics.{name}")
        if decl.source == "mlflow" and not tracking:
            raise InvalidInput(f"{where}: metrics.{name} is read from MLflow, but this run is not tracked (--no-tracking)")
    if spec.timeout_s is not None and not spec.timeout_s > 0:
        raise InvalidInput(f"{where}: fixed.timeout_s must be a positive number of seconds")
    argv = fill(spec, seed=0, repeat=0, repeat_dir=str(spec.workdir))
    program = argv[0]
    if os.sep in program:
        path = spec.workdir / program
        if not path.is_file():
            raise InvalidInput(f"{where}: fixed.command: program {program} was not found (looked in {spec.workdir})")
        if not os.access(path, os.X_OK):
            raise InvalidInput(f"{where}: fixed.command: program {program} is not executable (chmod +x {path})")
        found = str(path)
    else:
        found = shutil.which(program, path=_merged_env(spec).get("PATH", os.defpath)) or ""
        if not found:
            raise InvalidInput(f"{where}: fixed.command: program {program!r} was not found on PATH")
    # ``python train.py`` with a misspelt script fails in the first repeat otherwise.
    if (_PYTHON.match(Path(found).name) and len(argv) > 1 and argv[1].endswith(".py")
            and not (spec.workdir / argv[1]).is_file()):
        raise InvalidInput(f"{where}: fixed.command: script {argv[1]} was not found in {spec.workdir}")


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
def child_env(spec: CommandSpec, repeat: int, seeds: Seeds, out_dir: Path, *, deterministic: bool,
              mlflow: tuple[str, str] | None) -> dict[str, str]:
    """The child's environment: ours, the recipe's fixed.env, then what repro500 sets per repeat."""
    env = _merged_env(spec)
    env.update({
        "REPRO500_SEED": str(child_seed(seeds)),
        "REPRO500_REPEAT": str(repeat),
        "REPRO500_REPEAT_DIR": str(out_dir),
        "REPRO500_METRICS": str(out_dir / METRICS_FILE),
        "REPRO500_DETERMINISTIC": "1" if deterministic else "0",
        "PYTHONHASHSEED": str(seeds.python % 2**32),  # Python accepts 0 .. 2**32 - 1
    })
    # Python block-buffers a pipe: without this the live display would show a script's prints
    # in bursts, and a killed script would lose its last lines.  A recipe may set it to "".
    env.setdefault("PYTHONUNBUFFERED", "1")
    if deterministic:
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # a recipe's own (e.g. :16:8) stays
    if mlflow is not None:
        env["MLFLOW_TRACKING_URI"], env["MLFLOW_RUN_ID"] = mlflow
    else:
        env.pop("MLFLOW_RUN_ID", None)  # never log into a run that is not this repeat's
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
    if not digests:
        return None
    lines = "".join(f"{name}\0{digest}\n" for name, digest in sorted(digests.items()))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def _exit_error(child: Child, timeout_s: float | None, last_stderr: str) -> str | None:
    if child.timed_out:
        return f"the command exceeded fixed.timeout_s = {timeout_s:g} s and was stopped with {child.signal_name or 'SIGTERM'}"
    if child.signal_name:
        return f"the command was killed by {child.signal_name}"
    if child.returncode:
        text = f"the command exited with status {child.returncode}"
        if "active experiment ID does not match environment run ID" in last_stderr:
            text += (": the script calls mlflow.set_experiment() with another experiment than the repeat's; "
                     "remove the call or skip it when MLFLOW_RUN_ID is set")
        elif last_stderr:
            text += f": {last_stderr[:300]}"
        return text
    return None


def run_repeat(spec: CommandSpec, repeat: int, seeds: Seeds, out_dir: Path, *, deterministic: bool = False,
               mlflow: tuple[str, str] | None = None, echo: Callable[[str, str], None] | None = None,
               grace_s: float = GRACE_S) -> dict[str, Any]:
    """Run one repeat of the command; return its summary (also written, last, to ``summary.json``).

    A failure of the command is a ``failed`` summary with one sentence in ``error``; the runner
    decides what that means for the run.  KeyboardInterrupt is forwarded to the child's group as
    SIGINT (SIGKILL after *grace_s*, or at once on a second one), recorded as ``killed``, re-raised.
    """
    out_dir = Path(out_dir).resolve()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in (SUMMARY, METRICS_FILE):  # a resumed repeat must not read an earlier attempt's files
            (out_dir / stale).unlink(missing_ok=True)
        for stream in (STDOUT, STDERR):
            (out_dir / stream).write_bytes(b"")
    except OSError as err:
        raise InvalidInput(f"the repeat directory {out_dir} cannot be written ({err.strerror or err})") from None
    argv = fill(spec, seed=child_seed(seeds), repeat=repeat, repeat_dir=str(out_dir))
    env = child_env(spec, repeat, seeds, out_dir, deterministic=deterministic, mlflow=mlflow)
    redactor = _Redactor(env)
    summary: dict[str, Any] = {
        "schema": SCHEMA, "repeat": repeat, "status": "failed", "seeds": seeds.as_dict(), "engine": "command",
        "world_size": 1, "command": redactor.argv(argv), "exit_status": None, "signal": None, "timed_out": False,
        "metrics": {}, "metric_sources": {}, "total_time_s": 0.0, "final_param_digest": None, "outputs": {},
        "error": None,
    }
    start = time.monotonic()

    def finish(status: str, error: str | None) -> dict[str, Any]:
        summary["total_time_s"] = summary["total_time_s"] or time.monotonic() - start
        summary["metrics"]["total_time_s"] = summary["total_time_s"]
        summary.update(status=status, error=redactor.text(error) if error else None)
        write_json(out_dir / SUMMARY, summary)
        return summary

    try:
        child = Child.start(argv, cwd=spec.workdir, env=env, stdout=out_dir / STDOUT, stderr=out_dir / STDERR, echo=echo)
    except OSError as err:
        reason = "was not found" if isinstance(err, FileNotFoundError) else f"could not be started ({err.strerror or err})"
        return finish("failed", f"program {argv[0]} {reason} (workdir {spec.workdir})")
    try:
        child.wait(spec.timeout_s, grace_s)
    except KeyboardInterrupt:
        child.interrupt(grace_s)
        summary.update(exit_status=child.exit_status, signal=child.signal_name, total_time_s=child.elapsed_s)
        finish("killed", "interrupted (Ctrl-C or SIGTERM); the command's process group was stopped")
        raise
    summary.update(exit_status=child.exit_status, signal=child.signal_name, timed_out=child.timed_out,
                   total_time_s=child.elapsed_s)
    error = _exit_error(child, spec.timeout_s, child.last_stderr)
    if error:
        return finish("failed", error)
    produced = Produced(stdout=out_dir / STDOUT, stderr=out_dir / STDERR, metrics_file=out_dir / METRICS_FILE,
                        search=[out_dir, spec.workdir], mlflow=mlflow)
    try:
        for name, decl in spec.metrics.items():
            value, label = read_metric(decl, produced)
            if not math.isfinite(value):
                raise MetricMissing(f"metric {name} is {value} ({label})")
            summary["metrics"][name] = value
            summary["metric_sources"][name] = label
        summary["outputs"] = _outputs(spec, out_dir)
    except MetricMissing as err:
        # A failed repeat reports no metric values, not the ones read before the missing one.
        summary["metrics"], summary["metric_sources"], summary["outputs"] = {}, {}, {}
        return finish("failed", str(err))
    summary["final_param_digest"] = produced.param_digest() or _outputs_digest(summary["outputs"])
    return finish("completed", None)


__all__ = ["CommandSpec", "check", "child_env", "child_seed", "declared_metrics", "fill", "group_alive",
           "run_repeat"]
