"""The command workload: a user's own program as the experiment; this module is its recipe side.

A recipe with ``fixed.workload: command`` names an argv with placeholders (``{seed}``,
``{repeat}``, ``{repeat_dir}``, ``{mutable.KEY}``), a ``metrics:`` section saying where each
metric comes from (:mod:`repro500.workloads.command.metric_sources`), and optionally the data it reads
(``fixed.inputs``) and how its reads are watched (``fixed.observe_inputs``).  The runner calls::

    spec = CommandSpec.from_recipe(recipe["fixed"], recipe["metrics"], recipe["mutable"], source=path)
    check(spec)                                    # before anything is written
    summary = command_repeat.run_repeat(spec, k, seeds, run_dir / "repeats" / str(k), context)

:mod:`repro500.workloads.command.repeat` runs one repeat (docs/command.md).
"""

from __future__ import annotations

import os
import re
import shutil
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro500.capture.inputs import BUDGET_MB, BUDGET_S, disk_size
from repro500.capture.seeds import Seeds
from repro500.errors import InvalidInput
from repro500.workloads.command.launchenv import user_environ
from repro500.workloads.command.metric_sources import MetricDecl
from repro500.workloads.command.observe import MODES as OBSERVE_MODES

# Set by repro500 for every repeat: a recipe's fixed.env may not set them.
RESERVED_ENV = frozenset({"REPRO500_SEED", "REPRO500_REPEAT", "REPRO500_REPEAT_DIR", "REPRO500_METRICS",
                          "REPRO500_CHECKPOINT_DIR",
                          "REPRO500_DETERMINISTIC", "REPRO500_RUN_ID", "REPRO500_OBSERVE_DIR",
                          "REPRO500_MLFLOW_READY", "PYTHONHASHSEED", "MLFLOW_RUN_ID"})
RESERVED_METRICS = frozenset({"total_time_s"})  # measured by repro500 itself
_SCALARS = (str, int, float)
_FORMATTER = string.Formatter()
_WHOLE = re.compile(r"^\{mutable\.([^{}!:]+)\}$")
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")  # python, python3, python3.11 (as adhoc.py names runs)


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
    inputs: list[str] = field(default_factory=list)  # declared data, hashed like a data set
    observe: str = "auto"  # how the files it opens are watched: auto | strace | off
    inputs_budget_mb: float = BUDGET_MB  # observed inputs past this are listed, not hashed
    inputs_budget_s: float = BUDGET_S  # hashing observed inputs the cache lacks stops after this long

    @classmethod
    def from_recipe(cls, fixed: Mapping[str, Any], metrics: Mapping[str, Any] | None,
                    mutable: Mapping[str, Any] | None, *, source: str, base: Path | None = None) -> CommandSpec:
        """Validate the recipe's command parts; relative paths are relative to *base* (the cwd)."""
        def bad(key: str, what: str) -> InvalidInput:
            return InvalidInput(f"{source}: {key}: {what}")

        command = _command_argv(fixed, bad)
        workdir = fixed.get("workdir", ".")
        if not isinstance(workdir, str) or not workdir:
            raise bad("fixed.workdir", "expected a directory path")
        timeout_s = fixed.get("timeout_s")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not timeout_s > 0):
            raise bad("fixed.timeout_s", f"expected a positive number of seconds or null, not {timeout_s!r}")
        outputs = _output_paths(fixed, bad)
        env = _extra_env(fixed, bad)
        decls = _metric_decls(metrics, source, bad)
        if mutable is not None and not isinstance(mutable, Mapping):
            raise bad("mutable", "expected a mapping")
        inputs, observe, budget, seconds = _input_options(fixed, bad)
        spec = cls(
            argv=[str(a) for a in command],
            workdir=((base or Path.cwd()) / workdir).resolve(),
            timeout_s=float(timeout_s) if timeout_s is not None else None,
            outputs=list(outputs),
            env={str(k): str(v) for k, v in env.items()},
            metrics=decls,
            mutable=dict(mutable or {}),
            source=source,
            inputs=list(inputs),
            observe=observe,
            inputs_budget_mb=float(budget),
            inputs_budget_s=float(seconds),
        )
        fill(spec, seed=0, repeat=0, repeat_dir="repeat_dir")  # unknown placeholders fail here
        return spec


# Each takes the recipe's complaint maker: bad("fixed.KEY", "what is wrong") -> InvalidInput.
_Complaint = Callable[[str, str], InvalidInput]


def _command_argv(fixed: Mapping[str, Any], bad: _Complaint) -> list[Any]:
    """``fixed.command``: a list of strings and numbers, or one string split as a shell would."""
    command = fixed.get("command")
    if isinstance(command, str):
        import shlex

        command = shlex.split(command)
    if not isinstance(command, list) or not command:
        raise bad("fixed.command", "expected a non-empty list such as [python, train.py, --seed, '{seed}']")
    for i, arg in enumerate(command):
        if isinstance(arg, bool) or not isinstance(arg, _SCALARS):
            raise bad("fixed.command", f"argument {i} is a {type(arg).__name__}; every argument is a string or a number")
    return command


def _output_paths(fixed: Mapping[str, Any], bad: _Complaint) -> list[str]:
    """``fixed.outputs``: relative paths, none climbing out of the repeat directory or the workdir."""
    outputs = fixed.get("outputs") or []
    if not isinstance(outputs, list) or not all(isinstance(o, str) and o for o in outputs):
        raise bad("fixed.outputs", "expected a list of file paths")
    for name in outputs:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise bad("fixed.outputs", f"{name!r} must be relative to the repeat directory or the workdir")
    return outputs


def _extra_env(fixed: Mapping[str, Any], bad: _Complaint) -> Mapping[str, Any]:
    """``fixed.env``: scalar values, and none of the variables repro500 sets itself."""
    env = fixed.get("env") or {}
    if not isinstance(env, Mapping):
        raise bad("fixed.env", "expected a mapping of variable names to values")
    for name, value in env.items():
        if name in RESERVED_ENV:
            raise bad(f"fixed.env.{name}", "is set by repro500 for every repeat; remove it")
        if isinstance(value, bool) or not isinstance(value, _SCALARS):
            raise bad(f"fixed.env.{name}", "expected a string or a number")
    return env


def _metric_decls(metrics: Mapping[str, Any] | None, source: str, bad: _Complaint) -> dict[str, MetricDecl]:
    """The ``metrics:`` section, each declaration parsed; the names repro500 measures are refused."""
    if metrics is not None and not isinstance(metrics, Mapping):
        raise bad("metrics", "expected a mapping of metric names to declarations")
    decls = {}
    for name, raw in (metrics or {}).items():
        if not isinstance(name, str) or not name or name in RESERVED_METRICS:
            raise bad(f"metrics.{name}", "is not a usable metric name (total_time_s is measured by repro500)")
        decls[name] = MetricDecl.parse(name, raw, where=f"{source}: metrics.{name}")
    return decls


def _input_options(fixed: Mapping[str, Any], bad: _Complaint) -> tuple[list[str], str, float, float]:
    """The data the command reads: ``fixed.inputs``, how its reads are watched, and the budgets
    for hashing what it was seen to read (MiB, seconds)."""
    inputs = fixed.get("inputs") or []
    if not isinstance(inputs, list) or not all(isinstance(i, str) and i for i in inputs):
        raise bad("fixed.inputs", "expected a list of file or directory paths the command reads")
    observe = fixed.get("observe_inputs", "auto")
    if observe not in OBSERVE_MODES:
        raise bad("fixed.observe_inputs", f"expected one of {', '.join(OBSERVE_MODES)}, not {observe!r}")
    budget = fixed.get("inputs_budget_mb", BUDGET_MB)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget >= 0:
        raise bad("fixed.inputs_budget_mb", f"expected a number of MiB (0 or more), not {budget!r}")
    seconds = fixed.get("inputs_budget_s", BUDGET_S)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise bad("fixed.inputs_budget_s", f"expected a number of seconds (0 or more), not {seconds!r}")
    return inputs, observe, budget, seconds


def declared_metrics(spec: CommandSpec) -> list[str]:
    """The metric names the recipe declares (a repeat reports these and ``total_time_s``)."""
    return list(spec.metrics)


def input_paths(spec: CommandSpec) -> list[str]:
    """The declared inputs, ``{mutable.KEY}`` filled in, absolute (relative ones are relative to
    the workdir).  Other placeholders are refused: an input exists before any repeat runs."""
    out = []
    for raw in spec.inputs:
        names = [name for _, name, _, _ in _parse(spec, raw, "fixed.inputs") if name is not None]
        bad = [n for n in names if not n.startswith("mutable.")]
        if bad:
            raise InvalidInput(f"{spec.source}: fixed.inputs: {raw!r} uses {{{bad[0]}}}; an input exists before the "
                               "repeats run, so only {mutable.KEY} placeholders may appear in it")
        filled = _fill_one(spec, raw, {}, "fixed.inputs")
        out.append(os.path.abspath(spec.workdir / os.path.expanduser(filled)))
    return list(dict.fromkeys(out))


# ----- placeholders ---------------------------------------------------------------------------
def _mutable_value(spec: CommandSpec, path: str, placeholder: str, *, whole: bool = False,
                   key: str = "fixed.command") -> Any:
    node: Any = spec.mutable
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            known = ", ".join(sorted(spec.mutable)) or "none"
            raise InvalidInput(f"{spec.source}: {key}: placeholder {placeholder} names no mutable value (mutable has: {known})")
        node = node[part]
    if whole and isinstance(node, list) and all(isinstance(v, _SCALARS) and not isinstance(v, bool) for v in node):
        return node
    if isinstance(node, (Mapping, list)) or node is None:
        hint = "; a list fills a whole argument only, as several arguments" if isinstance(node, list) else ""
        raise InvalidInput(f"{spec.source}: {key}: placeholder {placeholder} is not a single value (it is {node!r}){hint}")
    return node


_HINT = "use {seed}, {repeat}, {repeat_dir}, {mutable.KEY}, or {{ and }} for literal braces"


def _parse(spec: CommandSpec, arg: str, key: str) -> list[tuple[str, str | None, str | None, str | None]]:
    try:
        return list(_FORMATTER.parse(arg))
    except ValueError as err:
        raise InvalidInput(f"{spec.source}: {key}: argument {arg!r} is not a valid template ({err}); {_HINT}") from None


def _fill_one(spec: CommandSpec, arg: str, values: Mapping[str, Any], key: str = "fixed.command") -> str:
    out = []
    for literal, name, spec_text, conversion in _parse(spec, arg, key):
        out.append(literal)
        if name is None:
            continue
        placeholder = "{" + name + "}"
        if conversion:
            raise InvalidInput(f"{spec.source}: {key}: placeholder {placeholder}!{conversion} takes no conversion")
        if name in values:
            value = values[name]
        elif name.startswith("mutable.") and len(name) > len("mutable."):
            value = _mutable_value(spec, name.removeprefix("mutable."), placeholder, key=key)
        else:
            raise InvalidInput(f"{spec.source}: {key}: unknown placeholder {placeholder} in {arg!r}; {_HINT}")
        try:
            out.append(format(value, spec_text or ""))
        except (ValueError, TypeError) as err:
            raise InvalidInput(f"{spec.source}: {key}: placeholder {{{name}:{spec_text}}} cannot format {value!r} ({err})") from None
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
def merged_env(spec: CommandSpec) -> dict[str, str]:
    # The environment the run was started with, not os.environ now (repro500.workloads.command.launchenv).
    return {**user_environ(), **spec.env}


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
        found = shutil.which(program, path=merged_env(spec).get("PATH", os.defpath)) or ""
        if not found:
            raise InvalidInput(f"{where}: fixed.command: program {program!r} was not found on PATH")
    _check_inputs(spec)
    if tracking and any(decl.source == "mlflow" for decl in spec.metrics.values()):
        from repro500.workloads.command import provider_check

        provider_check.check(where, argv, found, spec.workdir, merged_env(spec))
    if spec.observe == "strace":
        from repro500.workloads.command.observe import check_strace

        check_strace()
    # ``python train.py`` with a misspelt script fails in the first repeat otherwise.
    if (_PYTHON.match(Path(found).name) and len(argv) > 1 and argv[1].endswith(".py")
            and not (spec.workdir / argv[1]).is_file()):
        raise InvalidInput(f"{where}: fixed.command: script {argv[1]} was not found in {spec.workdir}")


def _check_inputs(spec: CommandSpec) -> None:
    """Declared inputs exist, can be read, and fit the hashing budget (each is hashed in full)."""
    budget = spec.inputs_budget_mb * 2**20
    for path in input_paths(spec):
        if not os.path.exists(path):
            raise InvalidInput(f"{spec.source}: fixed.inputs: {path} does not exist (a relative input is relative "
                               f"to {spec.workdir})")
        if not os.access(path, os.R_OK) or (os.path.isdir(path) and not os.access(path, os.X_OK)):
            raise InvalidInput(f"{spec.source}: fixed.inputs: {path} cannot be read (no read permission)")
        size, _ = disk_size(path)
        if size > budget:
            raise InvalidInput(f"{spec.source}: fixed.inputs: {path} holds {size / 2**20:,.0f} MiB, over "
                               f"fixed.inputs_budget_mb ({spec.inputs_budget_mb:g} MiB): raise the budget or "
                               "declare the part the command reads")
