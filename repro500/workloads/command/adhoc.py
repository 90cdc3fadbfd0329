"""An ad-hoc command recipe: ``repro500 run --command -- python train.py --lr 0.1``.

The command line's ``--metric`` and ``--accept`` declarations become the same recipe a user
would write (docs/command.md); the runner writes it into the run directory as ``recipe.yaml``,
so ``--resume``, ``verify``, ``publish`` and ``reproduce`` read it like any other.
"""

from __future__ import annotations

import re
from typing import Any

from repro500.errors import UsageError
from repro500.rundir.names import RECIPE_SCHEMA

SOURCES = ("regex", "mlflow", "mllog", "json", "auto")
_ACCEPT = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(>=|<=)\s*([-+0-9.eE]+)\s*(?:(?:±|\+-|~)\s*([0-9.eE+-]+))?\s*$")


def parse_metric(text: str) -> tuple[str, Any]:
    """``accuracy=regex:Acc@1 ([0-9.]+)``, ``loss=mlflow``, ``f1=json:scores.f1``, ``top5`` (auto).

    A factor is not part of the text (a regex may hold any character): ``--scale NAME=FACTOR``
    sets it (:func:`recipe_data`)."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not name or not re.fullmatch(r"[A-Za-z_][\w.-]*", name):
        raise UsageError(f"--metric {text!r}: expected NAME=SOURCE[:ARG], e.g. 'accuracy=regex:Acc@1 ([0-9.]+)'")
    if not sep:
        return name, {}
    source, _, arg = rest.partition(":")
    source = source.strip()
    if source not in SOURCES:
        raise UsageError(f"--metric {text!r}: source must be one of {', '.join(SOURCES)}, not {source!r}")
    if source == "regex":
        if not arg:
            raise UsageError(f"--metric {text!r}: regex needs a pattern, e.g. 'accuracy=regex:Acc@1 ([0-9.]+)'")
        return name, {"regex": arg}
    decl: dict[str, Any] = {} if source == "auto" else {"source": source}
    if arg:
        decl["key"] = arg
    return name, decl


def parse_accept(text: str) -> tuple[str, dict[str, Any]]:
    """``accuracy>=0.9`` (higher is better, no tolerance) or ``loss<=0.5±0.1``."""
    match = _ACCEPT.match(text)
    if not match:
        raise UsageError(f"--accept {text!r}: expected NAME>=TARGET or NAME<=TARGET, optionally ±TOLERANCE "
                         "(e.g. 'accuracy>=0.9±0.02')")
    name, op, target, tol = match.groups()
    try:
        entry: dict[str, Any] = {"target": float(target), "direction": "higher" if op == ">=" else "lower",
                                 "tolerance": float(tol) if tol else 0.0}
    except ValueError:
        raise UsageError(f"--accept {text!r}: {target!r} or {tol!r} is not a number") from None
    return name, entry


def recipe_data(argv: list[str], *, metrics: list[str], accept: list[str], name: str | None = None,
                timeout_s: float | None = None, repeats: int = 3, seed: int = 0,
                inputs: list[str] | None = None, scales: dict[str, float] | None = None) -> dict[str, Any]:
    """The recipe a ``--command`` run writes into its run directory; ``inputs`` (the data the
    command reads, paths as given) becomes ``fixed.inputs``, ``scales`` (``--scale NAME=FACTOR``)
    each named metric's ``scale``."""
    if not argv:
        raise UsageError("--command needs the program after --, e.g. repro500 run --command --metric "
                         "'accuracy=regex:Acc ([0-9.]+)' --accept 'accuracy>=0.9' -- python train.py")
    declared = dict(parse_metric(m) for m in metrics)
    if not declared:
        raise UsageError("--command needs at least one --metric saying where a metric comes from, "
                         "e.g. --metric 'accuracy=regex:Acc@1 ([0-9.]+)'")
    for metric, factor in (scales or {}).items():
        if metric not in declared:
            raise UsageError(f"--scale {metric}={factor:g}: no --metric declares {metric!r} "
                             f"(declared: {', '.join(declared)})")
        declared[metric] = {**declared[metric], "scale": factor}
    acceptance = dict(parse_accept(a) for a in accept)
    if not acceptance:
        raise UsageError("--command needs at least one --accept, e.g. --accept 'accuracy>=0.9±0.02'")
    fixed: dict[str, Any] = {"workload": "command", "command": list(argv)}
    if timeout_s is not None:
        fixed["timeout_s"] = timeout_s
    if inputs:
        fixed["inputs"] = list(inputs)
    return {"schema": RECIPE_SCHEMA, "name": name or run_name(argv),
            "description": "written by repro500 run --command", "fixed": fixed, "mutable": {},
            "acceptance": acceptance, "metrics": declared, "repeats": repeats, "seed": seed}


# A Python interpreter as a program: python, python3, python3.11, /usr/bin/python3, .venv/bin/python.
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
# Interpreter options that take the next argument as their value (python -X dev -W error -m pkg).
_PYTHON_VALUED = ("-X", "-W", "--check-hash-based-pycs")
# Launchers whose own program is the experiment's script or module: torchrun and its module forms.
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def run_name(argv: list[str]) -> str:
    """The recipe's name for a command: the script's stem or the module (``python -m mypkg.train``
    -> ``mypkg.train``, ``torchrun --nproc-per-node 2 train.py`` -> ``train``), else the program's
    name; reduced to letters, digits, ``_ - .`` (never leading dots) so it is safe inside a run
    directory's name and an MLflow experiment name."""
    program = argv[0].rsplit("/", 1)[-1] if argv else ""
    if _PYTHON.match(program):
        target = _python_target(argv[1:])
    elif program in _LAUNCHERS:
        target = _launched(argv[1:]) or program
    else:
        target = program
    if target in _LAUNCHERS[1:]:  # python -m torch.distributed.run [options] train.py
        rest = argv[argv.index(target) + 1:]
        target = _launched(rest) or target
    stem = target.rsplit("/", 1)[-1].removesuffix(".py")
    return re.sub(r"[^\w.-]+", "-", stem).lstrip(".-") or "command"


def _python_target(args: list[str]) -> str:
    """What ``python ARGS`` runs: the module after ``-m``, else the script (first non-option)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m":
            return args[i + 1] if i + 1 < len(args) else "python"
        if arg.startswith("-m") and not arg.startswith("--"):
            return arg[2:]  # python -mpkg.mod
        if arg in ("-c", "-"):
            return "python"
        if arg in _PYTHON_VALUED:
            i += 2
            continue
        if not arg.startswith("-"):
            return arg
        i += 1
    return "python"


def _launched(args: list[str]) -> str | None:
    """The script (first ``*.py``) or module (after ``-m``/``--module``) a torchrun line launches;
    its other options are not parsed (which take a value is torchrun's to say)."""
    for i, arg in enumerate(args):
        if arg.endswith(".py"):
            return arg
        if arg in ("-m", "--module") and i + 1 < len(args) and not args[i + 1].startswith("-"):
            return args[i + 1]
    return None
