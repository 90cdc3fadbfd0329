"""Benchmark recipes: load, validate, override and resolve ``experiments/*.yaml``.

Deep500's split, made strict (docs/recipes.md):

- ``fixed``: what defines the benchmark (workload, model, dataset, target quality, epoch budget;
  or, for ``workload: command``, the program and where it runs, docs/command.md).
  Changing any of it makes the run *open division*, which must be declared and is recorded.
- ``mutable``: what a submitter may tune (batch size, optimizer, lr schedule, device, engine,
  compressor, workers, ...).
- ``acceptance``: per metric, a target, a direction (higher/lower is better) and a tolerance.
- ``metrics`` (commands only): where each metric comes from.
- ``repeats`` and ``seed``.

The schema and its validation live in :mod:`repro500.recipe.schema`.

Every error names the file and line of the offending key, e.g.
``experiments/x.yaml:12: mutable.batch_size must be an integer, got 'big'``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from repro500 import untrusted
from repro500.errors import InvalidInput, UsageError
from repro500.recipe.schema import (  # noqa: F401 - the schema is part of this module's interface
    ACCEPTANCE_ENTRY_SCHEMA,
    COMMAND_ONLY,
    DEFAULT_MUTABLE,
    DIRECTIONS,
    FIXED_SCHEMA,
    MUTABLE_SCHEMA,
    OPTIMIZERS,
    SCHEMA,
    SYSTEM_MUTABLE,
    TASKS,
    TOP_LEVEL,
    TRAINED_ONLY,
    WORKLOADS,
    Located,
    is_command_fixed,
    load_located,
    validate,
)
from repro500.rundir import layout


@dataclass
class Recipe:
    """A validated, resolved recipe."""

    name: str
    fixed: dict[str, Any]
    mutable: dict[str, Any]
    acceptance: dict[str, dict[str, Any]]
    repeats: int
    seed: int
    description: str = ""
    source: str = "<memory>"
    open_division: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)  # a command's metric declarations
    # params.yaml's run.tracking (log to MLflow or not); None when the params file does not say.
    # Not part of the benchmark: never written into recipe.yaml, and --tracking/--no-tracking wins.
    tracking: bool | None = None
    # the recipe's launcher section (schema.LAUNCHER_SCHEMA): like tracking, how it runs, not what
    launcher: dict[str, Any] = field(default_factory=dict)

    @property
    def is_command(self) -> bool:
        return self.fixed.get("workload") == "command"

    @property
    def kind(self) -> str:
        """``trained``, ``command`` or ``system`` (a measurement of the machine, repro500.system)."""
        workload = self.fixed.get("workload")
        return workload if workload in ("command", "system") else "trained"

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as written to a run directory's ``recipe.yaml``."""
        return {
            "schema": SCHEMA,
            "name": self.name,
            "description": self.description,
            "fixed": copy.deepcopy(self.fixed),
            "mutable": copy.deepcopy(self.mutable),
            "acceptance": copy.deepcopy(self.acceptance),
            **({"metrics": copy.deepcopy(self.metrics)} if self.metrics else {}),
            "repeats": self.repeats,
            "seed": self.seed,
            "open_division": self.open_division,
            "overrides": copy.deepcopy(self.overrides),
        }

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def flat_params(self) -> dict[str, str]:
        """``{"fixed.model": "resnet20", "mutable.optimizer.lr": "0.1", ...}`` for MLflow params."""
        out: dict[str, str] = {}
        for section in ("fixed", "mutable", "acceptance"):
            _flatten(getattr(self, section), section, out)
        out["repeats"] = str(self.repeats)
        out["seed"] = str(self.seed)
        out["open_division"] = str(self.open_division).lower()
        return out


def _flatten(value: Any, prefix: str, out: dict[str, str]) -> None:
    if isinstance(value, Mapping) and value:
        for key, sub in value.items():
            _flatten(sub, f"{prefix}.{key}", out)
    else:
        out[prefix] = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _deep_merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# ---------------------------------------------------------------------------------------------
# Overrides (--set key=value, params.yaml)
# ---------------------------------------------------------------------------------------------
def parse_assignment(text: str) -> tuple[str, Any]:
    """``"optimizer.lr=0.05"`` -> ``("optimizer.lr", 0.05)``; the value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--set expects key=value, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _apply_override(data: dict[str, Any], key: str, value: Any, open_division: bool, origin: str) -> str:
    parts = key.split(".")
    if parts[0] in ("repeats", "seed") and len(parts) == 1:
        data[parts[0]] = value
        return key
    if parts[0] not in ("fixed", "mutable", "acceptance"):
        # a bare key: mutable if the schema knows it, else fixed; a command's mutable keys are its own
        command = is_command_fixed(data.get("fixed") or {})
        section = ("mutable" if command or parts[0] in MUTABLE_SCHEMA
                   else "fixed" if parts[0] in FIXED_SCHEMA else None)
        if section is None:
            raise UsageError(
                f"{origin}: unknown key {key!r}; mutable keys are {', '.join(MUTABLE_SCHEMA)}"
            )
        parts = [section, *parts]
    if parts[0] in ("fixed", "acceptance") and not open_division:
        raise UsageError(
            f"{origin}: {'.'.join(parts)} is part of the benchmark's definition; overriding it is only allowed "
            "in the open division (add --open-division, which is recorded with the results)"
        )
    node = data.setdefault(parts[0], {})
    for part in parts[1:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            # a scalar (e.g. compressor: none) is replaced by the mapping being set into it
            child = node[part] = {}
        node = child
    node[parts[-1]] = value
    return ".".join(parts)


def load(
    path: str | Path,
    *,
    overrides: list[str] | None = None,
    params_file: str | Path | None = None,
    open_division: bool = False,
    repeats: int | None = None,
) -> Recipe:
    """Load, override, validate and resolve a recipe file."""
    path = Path(path)
    if path.is_dir():
        raise InvalidInput(f"recipe {path} is a directory, not a recipe file")
    try:
        text = untrusted.read_text(path, "a recipe")
    except FileNotFoundError:
        raise InvalidInput(f"recipe {path} does not exist") from None
    data, loc = load_located(text, str(path))
    return from_data(data, loc, overrides=overrides, params_file=params_file, open_division=open_division,
                     repeats=repeats, name=path.stem)


def from_data(
    data: Any,
    loc: Located | str,
    *,
    overrides: list[str] | None = None,
    params_file: str | Path | None = None,
    open_division: bool = False,
    repeats: int | None = None,
    name: str = "recipe",
) -> Recipe:
    """Validate, override and resolve recipe ``data`` (a parsed YAML mapping); ``loc`` names its
    source in error messages (an ad-hoc ``--command`` recipe has no file)."""
    if isinstance(loc, str):
        loc = Located(loc)
    path = loc.source
    validate(data, loc)
    data = copy.deepcopy(data)
    applied, open_division, tracking = _apply_changes(data, path, overrides, params_file, open_division, repeats)
    fixed_changed = any(k.startswith(("fixed.", "acceptance.")) for k in applied)
    fixed, mutable = _with_defaults(data)
    acceptance = {
        metric: {"target": entry["target"], "direction": entry.get("direction", "higher"), "tolerance": entry.get("tolerance", 0.0)}
        for metric, entry in data["acceptance"].items()
    }
    return Recipe(
        name=str(data.get("name") or name),
        description=str(data.get("description") or ""),
        fixed=fixed,
        mutable=mutable,
        acceptance=acceptance,
        repeats=int(data.get("repeats", 3)),
        seed=int(data.get("seed", 0)),
        source=str(path),
        open_division=bool(open_division and fixed_changed),
        overrides=applied,
        metrics=copy.deepcopy(data.get("metrics") or {}),
        tracking=tracking,
        launcher=copy.deepcopy(data.get("launcher") or {}),
    )


def _apply_changes(data: dict[str, Any], path: Any, overrides: list[str] | None, params_file: str | Path | None,
                   open_division: bool, repeats: int | None) -> tuple[dict[str, Any], bool, Any]:
    """A params file, then each ``--set``, then ``--repeats`` applied to ``data`` in place, each
    validated as it lands; returns (what was applied, the open division, the params' tracking)."""
    applied: dict[str, Any] = {}
    tracking = None
    if params_file is not None:
        params = load_params_file(params_file)
        open_division = open_division or bool(params.pop("open_division", False))
        params.pop("recipe", None)
        tracking = params.pop("tracking", None)  # how the run is logged, not what it runs
        for key, value in _flatten_params(params):
            applied[_apply_override(data, key, value, open_division, str(params_file))] = value
        validate(data, Located(f"{params_file} (applied to {path})"))  # a params file is input: exit 4
    for assignment in overrides or []:
        key, value = parse_assignment(assignment)
        origin = f"--set {assignment}"
        applied[_apply_override(data, key, value, open_division, origin)] = value
        try:  # each --set on its own, so the message names the one at fault
            validate(data, Located(origin))
        except InvalidInput as err:  # a bad command-line value is a usage error, like click's (exit 2)
            raise UsageError(str(err)) from None
    if repeats is not None:
        data["repeats"] = repeats
        applied["repeats"] = repeats
        validate(data, Located(f"{path} (after --repeats)"))
    return applied, open_division, tracking


def _with_defaults(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fixed, mutable) with the defaults of the recipe's kind: a command, a system measure, training."""
    fixed = copy.deepcopy(data["fixed"])
    if is_command_fixed(fixed):
        fixed.setdefault("workload", "command")
        if isinstance(fixed["command"], str):
            import shlex

            fixed["command"] = shlex.split(fixed["command"])
        fixed["command"] = [str(a) for a in fixed["command"]]
        fixed.setdefault("workdir", ".")
        fixed.setdefault("timeout_s", None)
        fixed.setdefault("outputs", [])
        fixed.setdefault("env", {})
        mutable = copy.deepcopy(data.get("mutable") or {})
    elif fixed.get("workload") == "system":
        fixed.setdefault("system", {})
        mutable = _deep_merge(SYSTEM_MUTABLE, data.get("mutable") or {})
    else:
        mutable = _deep_merge(DEFAULT_MUTABLE, data.get("mutable") or {})
        if mutable["optimizer"].get("name") != DEFAULT_MUTABLE["optimizer"]["name"]:
            # The defaults are SGD's (momentum, nesterov, weight decay): an Adam recipe gets only what it
            # names, else its MLPerf log and MLflow params would record an SGD momentum it never used.
            mutable["optimizer"] = copy.deepcopy(dict((data.get("mutable") or {}).get("optimizer") or {}))
        fixed.setdefault("model_options", {})
        fixed["dataset"].setdefault("params", {})
        fixed["dataset"].setdefault("path", None)
        fixed.setdefault("valid_flops_exponent", 5)
        fixed.setdefault("mlperf_benchmark", None)
        fixed.setdefault("evaluate", None)
    if "target" in fixed:
        fixed["target"].setdefault("direction", "higher")
    return fixed, mutable


def load_params_file(path: str | Path) -> dict[str, Any]:
    """Read a DVC ``params.yaml``: ``recipe``, ``repeats``, ``seed``, ``mutable`` (and, in the open
    division, ``fixed``) sections applied on top of the recipe, and ``tracking`` (true or false:
    whether ``repro500 run --params`` logs to MLflow, unless its command line says)."""
    path = Path(path)
    try:
        data = untrusted.load_yaml(untrusted.read_text(path, "a params file"), str(path)) or {}
    except FileNotFoundError:
        raise InvalidInput(f"params file {path} does not exist") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"params file {path} must be a YAML mapping")
    run_section = data.get("run", data)
    if not isinstance(run_section, dict):
        raise InvalidInput(f"params file {path}: 'run' must be a mapping")
    allowed = {"recipe", "repeats", "seed", "mutable", "fixed", "acceptance", "open_division", "tracking"}
    if "tracking" in run_section and not isinstance(run_section["tracking"], bool):
        key = "run.tracking" if "run" in data else "tracking"
        raise InvalidInput(f"params file {path}: {key} must be true or false, not {run_section['tracking']!r}")
    return {k: copy.deepcopy(v) for k, v in run_section.items() if k in allowed}


def _flatten_params(params: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in params.items():
        full = f"{prefix}.{key}" if prefix else key
        # dataset/target/optimizer... sub-mappings are merged key by key; an empty one
        # (``mutable: {}``, as repro500 init writes without --set) has nothing to merge
        if isinstance(value, Mapping) and full.count(".") < 2:
            out.extend(_flatten_params(value, full))
        else:
            out.append((full, value))
    return out


def from_run_dir(run_dir: str | Path) -> Recipe:
    """Read the resolved recipe stored in a run directory (used by --resume and verify)."""
    path = Path(run_dir) / layout.RECIPE
    try:
        data = untrusted.load_yaml(untrusted.read_text(path, "a run's recipe"), str(path))
    except FileNotFoundError:
        raise InvalidInput(f"{path} is missing: not a repro500 run directory") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InvalidInput(f"{path} is not a {SCHEMA} document")
    return Recipe(
        name=data["name"],
        description=data.get("description", ""),
        fixed=data["fixed"],
        mutable=data["mutable"],
        acceptance=data["acceptance"],
        repeats=int(data["repeats"]),
        seed=int(data["seed"]),
        source=str(path),
        open_division=bool(data.get("open_division", False)),
        overrides=data.get("overrides", {}),
        metrics=data.get("metrics") or {},
    )
