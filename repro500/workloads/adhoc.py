"""An ad-hoc command recipe: ``repro500 run --command -- python train.py --lr 0.1``.

The command line's ``--metric`` and ``--accept`` declarations become the same recipe a user
would write (docs/command.md); the runner writes it into the run directory as ``recipe.yaml``,
so ``--resume``, ``verify``, ``publish`` and ``reproduce`` read it like any other.
"""

from __future__ import annotations

import re
from typing import Any

from repro500.errors import UsageError

SOURCES = ("regex", "mlflow", "mllog", "json", "auto")
_ACCEPT = re.compile(r"^\s*([A-Za-z_][\w.-]*)\s*(>=|<=)\s*([-+0-9.eE]+)\s*(?:(?:±|\+-|~)\s*([0-9.eE+-]+))?\s*$")


def parse_metric(text: str) -> tuple[str, Any]:
    """``accuracy=regex:Acc@1 ([0-9.]+)``, ``loss=mlflow``, ``f1=json:scores.f1``, ``top5`` (auto)."""
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
                timeout_s: float | None = None, repeats: int = 3, seed: int = 0) -> dict[str, Any]:
    """The recipe a ``--command`` run writes into its run directory."""
    if not argv:
        raise UsageError("--command needs the program after --, e.g. repro500 run --command --metric "
                         "'accuracy=regex:Acc ([0-9.]+)' --accept 'accuracy>=0.9' -- python train.py")
    declared = dict(parse_metric(m) for m in metrics)
    if not declared:
        raise UsageError("--command needs at least one --metric saying where a metric comes from, "
                         "e.g. --metric 'accuracy=regex:Acc@1 ([0-9.]+)'")
    acceptance = dict(parse_accept(a) for a in accept)
    if not acceptance:
        raise UsageError("--command needs at least one --accept, e.g. --accept 'accuracy>=0.9±0.02'")
    stem = re.sub(r"[^\w-]+", "-", (argv[1] if len(argv) > 1 and argv[0].startswith("python") else argv[0]).rsplit("/", 1)[-1])
    fixed: dict[str, Any] = {"workload": "command", "command": list(argv)}
    if timeout_s is not None:
        fixed["timeout_s"] = timeout_s
    return {"schema": "repro500/recipe/v1", "name": name or stem.removesuffix("-py") or "command",
            "description": "written by repro500 run --command", "fixed": fixed, "mutable": {},
            "acceptance": acceptance, "metrics": declared, "repeats": repeats, "seed": seed}
